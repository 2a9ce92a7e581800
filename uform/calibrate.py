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
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from .core import files, jsontext, safetensors
from .core.checkpoint import map_file
from .core.config import ModelConfig
from .core.errors import InputError
from .core.progress import ProgressHandler
from .verbs import utf8_of

if TYPE_CHECKING:
    from .model import Model

T_MIN, T_MAX = 1e-3, 1e3
ITERATIONS = 64  # bisection steps on log(1/T): 2^-64 of a 13.8-wide bracket
MAX_GROUPS = 4096  # question groups a calibration fits: each is a temperature in the checkpoint's header


@dataclass(frozen=True)
class Example:
    """One labelled question: ``answer`` is the index of the right choice in ``choices``."""

    text: str | bytes
    choices: str | bytes
    answer: int
    group: int = 0


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


def read_examples(path: str | os.PathLike[str]) -> list[Example]:
    """Examples from JSON lines ``{"text", "choices", "answer", "group"?}``; errors name the line.

    ``answer`` is the right choice itself (a one-character string found in ``choices``) or
    its index; ``group`` defaults to 0. Blank lines are skipped.
    """
    out = []
    with _open_examples(path) as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{number}: not UTF-8 (byte 0x{raw[exc.start]:02x}, byte {exc.start + 1} of the line)") from None
            if line.strip():
                out.append(_example(line, f"{path}:{number}"))
    if not out:
        raise ValueError(f"{path}: no examples")
    return out


def _open_examples(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` open for reading when it is a regular file; ValueError naming it otherwise. Opened
    without blocking and checked by its descriptor: a FIFO waited forever for a writer, and a
    device (``/dev/zero``) was read as one endless line until memory ran out."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the examples file ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise ValueError(f"{path}: is {kind}, not a file of examples; give a JSON lines file")
    return os.fdopen(fd, "rb")


def _example(line: str, where: str) -> Example:
    try:
        raw = jsontext.loads(line)
    except jsontext.NotJSON as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object with text, choices and answer")
    text, choices, answer, group = raw.get("text"), raw.get("choices"), raw.get("answer"), raw.get("group", 0)
    if not isinstance(text, str):
        raise ValueError(f"{where}: text must be a string, got {text!r}")
    try:
        utf8_of(0, text)
    except InputError as exc:  # a lone surrogate; the text plugin's wording, named by the line
        raise ValueError(f"{where}: {exc.reason}") from None
    if not isinstance(choices, str) or not choices:
        raise ValueError(f"{where}: choices must be a non-empty string of single-byte choices, got {choices!r}")
    wide = next((c for c in choices if ord(c) > 0x7F), None)
    if wide is not None:
        raise ValueError(f"{where}: choice {wide!r} is not a single byte: choices must be ASCII characters")
    twice = next((c for k, c in enumerate(choices) if c in choices[:k]), None)
    if twice is not None:
        raise ValueError(f"{where}: choice {twice!r} appears twice in {choices!r}")
    if isinstance(answer, str) and len(answer) == 1 and answer in choices:
        index = choices.index(answer)
    elif isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        index = answer
    else:
        raise ValueError(f"{where}: answer {answer!r} is not one of the choices {choices!r} (or its index)")
    return Example(text, choices, index, _group(group, where))


def _group(group: object, where: str) -> int:
    """``group`` when it is an integer from 0 to ``MAX_GROUPS - 1``; ValueError naming ``where``."""
    if not isinstance(group, int) or isinstance(group, bool) or not 0 <= group < MAX_GROUPS:
        raise ValueError(f"{where}: group must be an integer from 0 to {MAX_GROUPS - 1} (uform.calibrate.MAX_GROUPS), got {group!r}")
    return group


def _check(examples: Sequence[Example]) -> None:
    """ValueError naming the first example whose answer is not an index of its choices or
    whose group is out of range (``read_examples`` checks these; ``Example`` itself does not)."""
    for i, e in enumerate(examples):
        size = len(e.choices) if isinstance(e.choices, (str, bytes)) else None
        if size is not None and (not isinstance(e.answer, int) or isinstance(e.answer, bool) or not 0 <= e.answer < size):
            raise ValueError(f"example {i}: answer {e.answer!r} is not the index of one of its {size} choices {e.choices!r}")
        _group(e.group, f"example {i}")


# -- the math, on ragged rows (values flat, offsets [rows + 1]) --------------------------


def _softmax(z: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    e = np.exp(z - np.maximum.reduceat(z, offsets[:-1])[owner])
    return e / np.add.reduceat(e, offsets[:-1])[owner]  # type: ignore[no-any-return]


def _scaled(logits: np.ndarray, offsets: np.ndarray, row_temperatures: np.ndarray) -> np.ndarray:
    return logits / np.repeat(row_temperatures, np.diff(offsets))  # type: ignore[no-any-return]


def nll(logits: np.ndarray, offsets: np.ndarray, answers: np.ndarray, row_temperatures: np.ndarray) -> float:
    """Mean negative log-likelihood of the answers under ``softmax(logits / T)`` per row."""
    p = _softmax(_scaled(logits, offsets, row_temperatures), offsets)
    return float(-np.log(np.maximum(p[offsets[:-1] + answers], 1e-300)).mean())


def top_choice(probs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row, the index (within the row) of its most probable choice; the first on ties."""
    starts = offsets[:-1]
    owner = np.repeat(np.arange(len(starts)), np.diff(offsets))
    is_top = probs == np.maximum.reduceat(probs, starts)[owner]
    return np.minimum.reduceat(np.where(is_top, np.arange(len(probs)) - starts[owner], len(probs)), starts)


def ece(probs: np.ndarray, offsets: np.ndarray, answers: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error of the top choice: ``Σ_b (n_b / N) |accuracy_b − confidence_b|``
    over ``bins`` equal-width confidence bins (a confidence of exactly 1 goes in the last)."""
    if len(offsets) < 2:
        return 0.0
    confidence = np.maximum.reduceat(probs, offsets[:-1])
    correct = (top_choice(probs, offsets) == answers).astype(np.float64)
    which = np.minimum(np.floor(confidence * float(bins)), bins - 1)  # float: no int64 overflow for any bins
    # the occupied bins only (at most one a row): a count array of every bin took 8 bytes a bin,
    # 7.9 GB and 55 s for --bins 1000000000
    gap = np.bincount(np.unique(which, return_inverse=True)[1].ravel(), correct - confidence)  # n_b (accuracy_b - confidence_b)
    return float(np.abs(gap).sum() / len(correct))


def fit_temperatures(
    logits: np.ndarray, offsets: np.ndarray, answers: np.ndarray, groups: np.ndarray, count: int, *, smoothing: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The NLL-minimising temperature of each of ``count`` groups, and its example count.

    A group without examples (or whose examples all have one choice) answers 1.0. The
    slope ``Σ p_j (z_j − z_answer)`` is summed as gaps so that it does not cancel to 0 early.
    With ``smoothing``, each label of a group of ``n`` examples puts ``1 / (n + 2)`` of its
    weight evenly on the wrong choices (Laplace's rule of succession: after ``n`` right
    answers of ``n``, the next is right with probability ``(n + 1) / (n + 2)``), so a group
    the model answers all right gets a finite temperature instead of the floor.
    """
    if len(offsets) < 2:
        return np.ones(count), np.zeros(count, np.int64)
    sizes = np.diff(offsets)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    gaps = logits - logits[offsets[:-1] + answers][owner]  # each choice's logit minus the answer's
    pull = np.zeros(count)  # the smoothed labels' own term of the slope: ε_g Σ_wrong gap / (k - 1), summed per group
    if smoothing:
        epsilon = 1 / (np.bincount(groups, minlength=count) + 2.0)
        wrong = np.add.reduceat(gaps, offsets[:-1]) / np.maximum(sizes - 1, 1)  # the answer's own gap is 0
        pull = np.asarray(np.bincount(groups, epsilon[groups] * wrong, minlength=count), np.float64)
    lo, hi = np.full(count, np.log(1 / T_MAX)), np.full(count, np.log(1 / T_MIN))
    for _ in range(ITERATIONS):
        mid = (lo + hi) / 2
        beta = np.exp(mid)[groups]
        p = _softmax(logits * beta[owner], offsets)
        slope = np.bincount(groups, np.add.reduceat(p * gaps, offsets[:-1]), minlength=count) - pull  # d NLL / d beta
        up = slope <= 0  # flat (to float precision) means sharper is no worse
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    counts = np.bincount(groups, minlength=count)
    informative = np.bincount(groups, sizes > 1, minlength=count) > 0
    temperatures = np.clip(1 / np.exp((lo + hi) / 2), T_MIN, T_MAX)
    return np.where(informative, temperatures, 1.0), counts


# -- through a model --------------------------------------------------------------------


def choice_logits(model: Model, examples: Sequence[Example], progress: ProgressHandler | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each example's choice logits (float64, flat) and offsets, up to a constant per row."""
    from . import Arena

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
    p = _softmax(_scaled(logits, offsets, rows), offsets)
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
    from . import Model

    items: Sequence[Example] = read_examples(examples) if isinstance(examples, (str, os.PathLike)) else list(examples)
    if not items:
        raise ValueError("no examples to calibrate on")
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    for name, value in (("bins", bins), ("groups", groups)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be an integer of 1 or more, got {value!r}")
    if groups is not None and groups > MAX_GROUPS:
        raise ValueError(f"groups must be at most {MAX_GROUPS} (uform.calibrate.MAX_GROUPS), got {groups}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    _check(items)
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
    notes = [] if held else ["holdout is 0: ECE and NLL are measured on the fitting examples"]
    fit_rows, test_rows = np.sort(order[held:]), np.sort(order[:held] if held else order)
    fitted, counts = fit_temperatures(*_rows(logits, offsets, fit_rows), answers[fit_rows], group_of[fit_rows], count, smoothing=smoothing)
    old = np.array([previous[g] if g < len(previous) else 1.0 for g in range(count)])
    # a one-choice example has p = 1 at any temperature: a group of only those keeps its own too
    informative = np.bincount(group_of[fit_rows], np.diff(offsets)[fit_rows] > 1, minlength=count) > 0
    temperatures = np.where(informative, fitted, old)
    notes += [f"{_groups(first, last)} had no fitting examples and {'keeps' if first == last else 'keep'} temperature {old[first]:g}"
              for first, last in _runs(np.flatnonzero(counts == 0), old)]  # one note a run: not 4093 for one example of group 4095
    notes += [f"group {g}'s {counts[g]} fitting examples each have one choice, which no temperature changes; "
              f"it keeps temperature {old[g]:g}" for g in np.flatnonzero((counts > 0) & ~informative)]  # fmt: skip
    z, o = _rows(logits, offsets, test_rows)
    a, g = answers[test_rows], group_of[test_rows]
    before, after = _softmax(_scaled(z, o, old[g]), o), _softmax(_scaled(z, o, temperatures[g]), o)
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


def _rows(logits: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ragged sub-tape of ``rows`` (in the order given)."""
    counts = np.diff(offsets)[rows]
    new = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(counts, out=new[1:])
    take = np.repeat(offsets[rows], counts) + np.arange(int(new[-1])) - np.repeat(new[:-1], counts)
    return logits[take], new


def summary(report: CalibrationReport) -> dict[str, Any]:
    """The report as plain JSON-able values."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in report.__dict__.items()}
