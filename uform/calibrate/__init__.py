"""Calibrating ``text_choose``: one temperature per question group, fitted on labelled examples.

A group is a question type (multiple choice, yes/no, digits...). For each group the
temperature ``T`` minimising the negative log-likelihood of the labelled answers under
``softmax(logits / T)`` (over each example's choices) is found by bisection on the
derivative, which is monotone in ``1 / T``; ``T`` stays within the format's bounds
[0.001, 1000]. The fitted temperatures are written into a copy of the checkpoint
(same tensors, config field ``choice_temperatures`` replaced). Numpy only: no torch.

The logits come through the public ``Model.text_choose``: at the checkpoint's current
temperature ``T₀`` of a group, ``T₀ · log p`` equals the choice logits up to a constant
per row, which a softmax ignores. Probabilities that underflow float32 are clipped at
1e-45 first. See docs/choose.md for the examples format and the ECE we report.

Reading and checking the examples is examples.py, the math (softmax, NLL, ECE, the bisection)
fitting.py; this module runs a calibration through a model and writes its checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import files, safetensors
from ..core.checkpoint import map_file
from ..core.config import ModelConfig
from ..core.errors import InputError
from ..core.progress import ProgressHandler
from .examples import MAX_GROUPS, Example, check, is_integer, read_examples
from .fitting import ITERATIONS, T_MAX, T_MIN, ece, fit_temperatures, nll, scaled, softmax, sub_rows, top_choice

if TYPE_CHECKING:
    from ..model import Model

__all__ = ["ITERATIONS", "MAX_GROUPS", "T_MAX", "T_MIN", "CalibrationReport", "Example", "calibrate", "choice_logits", "ece",
           "fit_temperatures", "nll", "read_examples", "sample_examples", "summary", "top_choice", "write_temperatures"]  # fmt: skip


@dataclass(frozen=True)
class CalibrationReport:
    """Fitted temperatures and how calibrated the model was before and after, on held-out examples."""

    temperatures: tuple[float, ...]
    previous: tuple[float, ...]
    fit_counts: tuple[int, ...]  # fitting examples per group; a group with 0 keeps its temperature
    fit_examples: int
    heldout_examples: int
    ece_before: float
    ece_after: float
    nll_before: float
    nll_after: float
    accuracy: float
    out: str | None = None
    notes: list[str] = field(default_factory=list)


def choice_logits(model: Model, examples: Sequence[Example], progress: ProgressHandler | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each example's choice logits (float64, flat) and offsets, up to a constant per row."""
    from .. import Arena

    temps = np.asarray(model.served.choice_temperatures, np.float64)
    groups = [e.group if e.group < len(temps) else 0 for e in examples]
    try:
        tape = model.text_choose([e.text for e in examples], [e.choices for e in examples], Arena(), temperature_groups=groups, progress=progress)
    except InputError as exc:
        raise ValueError(f"example {exc.index}: {exc.reason}") from None
    probs, offsets = tape.to_numpy()
    logp = np.log(np.maximum(probs.astype(np.float64), 1e-45))
    return logp * np.repeat(temps[groups], np.diff(offsets)), offsets


def sample_examples(model: Model, texts: Sequence[str | bytes], choices: Sequence[str | bytes], groups: Sequence[int],
                    true_temperatures: Sequence[float], seed: int = 0) -> list[Example]:  # fmt: skip
    """Examples whose answers are drawn from the model's own ``softmax(logits / T*_group)``:
    a known truth for calibration experiments on checkpoints that were never trained."""
    base = [Example(t, c, 0, 0) for t, c in zip(texts, choices)]
    logits, offsets = choice_logits(model, base)
    rows = np.asarray(true_temperatures, np.float64)[np.asarray(groups)]
    p = softmax(scaled(logits, offsets, rows), offsets)
    counts = np.diff(offsets)
    owner = np.repeat(np.arange(len(base)), counts)
    cumulative = np.cumsum(p)
    within = cumulative - (cumulative[offsets[:-1]] - p[offsets[:-1]])[owner]  # cumulative inside each row
    u = np.random.default_rng(seed).random(len(base))
    answers = np.minimum(np.bincount(owner, within < u[owner], minlength=len(base)).astype(np.int64), counts - 1)
    return [Example(t, c, int(a), int(g)) for t, c, a, g in zip(texts, choices, answers, groups)]


def write_temperatures(checkpoint: str | os.PathLike[str], temperatures: Sequence[float], out: str | os.PathLike[str]) -> None:
    """Copy ``checkpoint`` to ``out`` with ``choice_temperatures`` replaced (the tensors byte for byte)."""
    mapped = map_file(checkpoint)
    try:
        container = safetensors.parse(memoryview(mapped))
        config = ModelConfig.from_metadata(container.metadata)
        raw = dict(config.raw) | {"choice_temperatures": [float(t) for t in temperatures]}
        metadata = dict(container.metadata) | ModelConfig.from_dict(raw).to_metadata()
        tensors = {name: container.array(name) for name in container.entries}
        # whole or not at all, renamed into place: also safe when out is the checkpoint itself
        files.write_with(out, lambda f: safetensors.write(f, tensors, metadata))
        del tensors, container
    finally:
        try:
            mapped.close()
        except BufferError:  # views still alive in a traceback; the map goes with them
            pass


def calibrate(
    checkpoint: str | os.PathLike[str],
    examples: str | os.PathLike[str] | Iterable[Example],
    out: str | os.PathLike[str] | None = None,
    *,
    holdout: float = 0.25,
    seed: int = 0,
    groups: int | None = None,
    bins: int = 15,
    progress: ProgressHandler | None = None,
    smoothing: bool = False,
) -> CalibrationReport:
    """Fit one temperature per group on a random ``1 - holdout`` of ``examples``, report ECE and
    NLL before and after on the rest, and write the calibrated checkpoint to ``out`` if given.
    ``progress(done, total)`` follows the scoring of the examples (``text_choose``'s progress);
    ``smoothing`` as in :func:`fit_temperatures`."""
    from .. import Model

    items: Sequence[Example] = read_examples(examples) if isinstance(examples, (str, os.PathLike)) else list(examples)
    if not items:
        raise ValueError("no examples to calibrate on")
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    for name, value in (("bins", bins), ("groups", groups)):
        if value is not None and (not is_integer(value) or value < 1):
            raise ValueError(f"{name} must be an integer of 1 or more, got {value!r}")
    if groups is not None and groups > MAX_GROUPS:
        raise ValueError(f"groups must be at most {MAX_GROUPS} (uform.calibrate.MAX_GROUPS), got {groups}")
    if not is_integer(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    check(items)
    with Model.load_ram(checkpoint) as model:
        previous = model.served.choice_temperatures
        count = groups if groups is not None else max(len(previous), 1 + max(e.group for e in items))
        if any(e.group >= count for e in items):
            raise ValueError(f"an example names group {max(e.group for e in items)}, beyond the {count} groups asked for")
        logits, offsets = choice_logits(model, items, progress)
    answers = np.array([e.answer for e in items], np.int64)
    group_of = np.array([e.group for e in items], np.int64)
    order = np.random.default_rng(seed).permutation(len(items))
    held = int(round(holdout * len(items)))
    unheld = "holdout is 0" if holdout == 0 else f"holdout {holdout:g} of {len(items)} examples holds none out"
    notes = [] if held else [f"{unheld}: ECE and NLL are measured on the fitting examples"]
    fit_rows, test_rows = np.sort(order[held:]), np.sort(order[:held] if held else order)
    fitted, counts = fit_temperatures(*sub_rows(logits, offsets, fit_rows), answers[fit_rows], group_of[fit_rows], count, smoothing=smoothing)
    old = np.array([previous[g] if g < len(previous) else 1.0 for g in range(count)])
    # a one-choice example has p = 1 at any temperature: a group of only those keeps its own too
    informative = np.bincount(group_of[fit_rows], np.diff(offsets)[fit_rows] > 1, minlength=count) > 0
    temperatures = np.where(informative, fitted, old)
    notes += [f"{_groups(first, last)} had no fitting examples and {'keeps' if first == last else 'keep'} temperature {old[first]:g}"
              for first, last in _runs(np.flatnonzero(counts == 0), old)]  # one note a run: not 4093 for one example of group 4095
    notes += [f"group {g}'s {counts[g]} fitting examples each have one choice, which no temperature changes; "
              f"it keeps temperature {old[g]:g}" for g in np.flatnonzero((counts > 0) & ~informative)]  # fmt: skip
    z, o = sub_rows(logits, offsets, test_rows)
    a, g = answers[test_rows], group_of[test_rows]
    before, after = softmax(scaled(z, o, old[g]), o), softmax(scaled(z, o, temperatures[g]), o)
    accuracy = float((top_choice(after, o) == a).mean()) if len(a) else 0.0
    if out is not None:
        write_temperatures(checkpoint, temperatures.tolist(), out)
    return CalibrationReport(
        tuple(float(t) for t in temperatures), previous, tuple(int(c) for c in counts), len(fit_rows), len(test_rows),
        ece(before, o, a, bins), ece(after, o, a, bins), nll(z, o, a, old[g]), nll(z, o, a, temperatures[g]), accuracy,
        None if out is None else os.fspath(out), notes,
    )  # fmt: skip


def _runs(groups: np.ndarray, temperatures: np.ndarray) -> list[tuple[int, int]]:
    """``groups`` (ascending) as runs ``(first, last)`` of consecutive groups of one temperature."""
    runs: list[tuple[int, int]] = []
    for g in groups.tolist():
        if runs and runs[-1][1] == g - 1 and temperatures[g] == temperatures[runs[-1][0]]:
            runs[-1] = (runs[-1][0], g)
        else:
            runs.append((g, g))
    return runs


def _groups(first: int, last: int) -> str:
    return f"group {first}" if first == last else f"groups {first} to {last}"



def summary(report: CalibrationReport) -> dict[str, Any]:
    """The report as plain JSON-able values."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in report.__dict__.items()}
