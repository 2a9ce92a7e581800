"""The batched encode loop every modality shares.

A modality turns its inputs into a list of batch thunks. The loop prepares the first batch
itself, then batch ``k + 1`` on the call's own look-ahead thread while ONNX Runtime computes
batch ``k``, gathers float32 results in a call-local staging area, and only once every batch
succeeded (and no progress handler cancelled) writes them into the caller's arena in the
requested scalar. However the call ends, the look-ahead is cancelled or waited for first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from . import scalars
from .arena import Arena, Encoded, RowsTape, carve, lease
from .errors import CheckpointError, InputError, UnsupportedError
from .progress import Progress, ProgressHandler
from .stats import EncodeStats
from .types import Outputs, Scalar

if TYPE_CHECKING:
    from .runtime import Call


@dataclass(frozen=True)
class Batch:
    """One tower run: which items (positions in the call) it holds, and the graph's feeds.

    ``token_counts`` gives, per row, how many leading rows of the ``tokens`` output are real.
    ``ranges`` gives, per float feed, the range of values the tower documents for it (an integer
    feed is bounded by its type), and ``inputs`` names the feeds for an error, as in "its input is
    {inputs}, which cannot overflow": :func:`check_finite` blames the checkpoint for a non-finite
    output whose item's feeds all lie in range, and the item otherwise.
    """

    indices: np.ndarray
    feeds: dict[str, np.ndarray]
    token_counts: np.ndarray | None = None
    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    inputs: str = "integers"


def check_outputs(call: Call, outputs: Outputs) -> Outputs:
    if not isinstance(outputs, Outputs) or not outputs:
        raise ValueError(f"outputs must be Outputs.EMBEDDINGS, Outputs.TOKENS or both, got {outputs!r}")
    if Outputs.TOKENS in outputs and "tokens" not in call.output_names:
        raise UnsupportedError(f"the {call.tower} tower of this checkpoint has no token head; ask for Outputs.EMBEDDINGS")
    return outputs


def run_batches(
    call: Call,
    batches: Sequence[Callable[[], Batch]],
    output_names: list[str],
    tracker: Progress,
    consume: Callable[[Batch, list[np.ndarray]], None],
) -> tuple[float, float]:
    """Run every batch, handing each result to ``consume`` once :func:`check_finite` passed it;
    answer (seconds waited, computed).

    The first batch is prepared right here (a one-batch call never waits on a thread hop);
    batch ``k + 1`` is prepared on this call's look-ahead thread while batch ``k`` computes.
    When a batch, ``consume`` or the progress handler raises, the batch being prepared is
    cancelled or waited for (its error dropped) before the error propagates.
    """
    waited = computed = 0.0
    with call.executor.prefetcher() as lookahead:
        pending = None
        for k in range(len(batches)):
            t0 = time.perf_counter()
            batch = batches[0]() if pending is None else pending.result()
            pending = lookahead.submit(batches[k + 1]) if k + 1 < len(batches) else None
            t1 = time.perf_counter()
            result = call.runner.run(output_names, batch.feeds)
            t2 = time.perf_counter()
            waited, computed = waited + t1 - t0, computed + t2 - t1
            check_finite(call.tower, batch, result)
            consume(batch, result)
            tracker.advance(len(batch.indices))
    return waited, computed


def check_finite(tower: str, batch: Batch, result: list[np.ndarray]) -> None:
    """Refuse, before the arena is written, a batch whose embeddings or tokens hold NaN or an infinity.

    A checkpoint's weights are checked finite at load, yet a finite weight can still overflow the
    tower's float32 arithmetic (one at BF16's largest value, 3.39e38, times an activation above 1).
    When the first such item's feeds all lie within range (:func:`out_of_range`: token ids, pixels
    of 0 to 255, samples within the range the tower documents), its input cannot have caused it:
    the error is a :class:`CheckpointError` naming the tower. Otherwise it is an
    :class:`InputError` naming the item, whose values overflow, and the range they leave.
    """
    bad = ~np.isfinite(result[0]).reshape(len(batch.indices), -1).all(axis=1)
    if len(result) > 1 and batch.token_counts is not None:  # the real tokens of each row, not its padding
        real = np.arange(result[1].shape[1])[None, :] < batch.token_counts[:, None]
        bad |= (~np.isfinite(result[1]).all(axis=2) & real).any(axis=1)
    if not bad.any():
        return
    row = int(np.flatnonzero(bad)[np.argmin(batch.indices[bad])])
    index, beyond = int(batch.indices[row]), out_of_range(batch, row)
    if beyond is None:
        raise CheckpointError(f"the '{tower}' tower's outputs for item {index} are not finite (NaN or infinity) and its input "
                              f"is {batch.inputs}, which cannot overflow: the checkpoint's weights overflow float32 arithmetic; "
                              "nothing was written (use a checkpoint whose weights are in range)")
    raise InputError(index, f"the encoder's output for it is not finite (NaN or infinity): its values overflow float32 arithmetic{beyond}; "
                            "nothing was written")


def out_of_range(batch: Batch, row: int) -> str | None:
    """None when every feed of ``batch``'s ``row`` lies within its range (an integer feed always
    does: its type bounds it); else the words for the error: ``' (they reach 1e+30, outside [-1,
    1], the range the tower documents)'``, or ``''`` for a float feed the tower gives no range."""
    for name, feed in batch.feeds.items():
        values = np.asarray(feed)[row]
        if np.issubdtype(values.dtype, np.integer):
            continue
        if name not in batch.ranges:
            return ""
        low, high = batch.ranges[name]
        lowest, highest = float(np.min(values)), float(np.max(values))  # NaN when one is: not within
        if not low <= lowest <= highest <= high:
            reach = lowest if not low <= lowest else highest
            return f" (they reach {reach:g}, outside [{low:g}, {high:g}], the range the tower documents)"
    return None


def count_call(stats: EncodeStats | None, items: int, batches: int, waited: float, computed: float, started: float) -> None:
    """Add one call's counts to ``stats`` (when given)."""
    if stats is not None:
        stats.items += items
        stats.batches += batches
        stats.seconds_preprocess += waited
        stats.seconds_compute += computed
        stats.seconds_total += time.perf_counter() - started


class EncodeOptions(TypedDict, total=False):
    """The keyword arguments every encoding verb hands on to :func:`encode` unchanged."""

    outputs: Outputs
    outputs_scalar: Scalar | str
    progress: ProgressHandler | None
    progress_steps: int


def check_batch(items: object, name: str) -> None:
    """TypeError for a mapping or a set given as a verb's items: iterating a dict yields its keys
    (a text verb would embed the keys) and a set an order of its own, so the rows would answer
    other items than the caller meant, without an error; and for items that are no iterable at
    all (``None``), named as ``name``."""
    if isinstance(items, Mapping):
        raise TypeError(f"{name} must be a sequence, got a {type(items).__name__}: pass list(d.values()) for its values or list(d) for its keys")
    if isinstance(items, (set, frozenset)):
        raise TypeError(f"{name} must be a sequence, got a {type(items).__name__}, whose order is its own: pass sorted(s) or list(s) and keep that list")
    try:
        iter(items)  # type: ignore[call-overload]
    except TypeError:  # None, a number: Python's own words would not name the argument
        raise TypeError(f"{name} must be a sequence, got {type(items).__name__}") from None


def check_stats(stats: object, kind: type[EncodeStats]) -> None:
    """TypeError unless ``stats`` is None or a ``kind`` (the verb's own stats class)."""
    if stats is not None and not isinstance(stats, kind):
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"stats must be {article} {kind.__name__}, got {type(stats).__name__}")


def encode(
    call: Call,
    count: int,
    batches: Sequence[Callable[[], Batch]],
    arena: Arena,
    *,
    stats: EncodeStats | None,
    outputs: Outputs = Outputs.EMBEDDINGS,
    outputs_scalar: Scalar | str = Scalar.F32,
    progress: ProgressHandler | None = None,
    progress_steps: int = 0,
) -> Encoded:
    """Run ``batches`` (thunks building each :class:`Batch`) and publish ``count`` items."""
    if not isinstance(arena, Arena):
        raise TypeError(f"arena must be a uform.Arena, got {type(arena).__name__}")
    scalar = scalars.coerce(outputs_scalar)
    outputs = check_outputs(call, outputs)
    tracker = Progress(progress, progress_steps, count)
    names = ["embeddings"] + (["tokens"] if Outputs.TOKENS in outputs else [])
    started = time.perf_counter()
    with lease(arena):
        embeddings = np.empty((count, call.config.dimensions), np.float32)
        token_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

        def consume(batch: Batch, result: list[np.ndarray]) -> None:
            embeddings[batch.indices] = result[0]
            if len(result) > 1:
                assert batch.token_counts is not None
                keep = np.arange(result[1].shape[1])[None, :] < batch.token_counts[:, None]
                token_parts.append((batch.indices, batch.token_counts, result[1][keep]))

        waited, computed = run_batches(call, batches, names, tracker, consume)
        encoded = _publish(arena, scalar, embeddings, token_parts if len(names) > 1 else None, count)
    count_call(stats, count, len(batches), waited, computed, started)
    return encoded


def _publish(
    arena: Arena,
    scalar: Scalar,
    embeddings: np.ndarray,
    token_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None,
    count: int,
) -> Encoded:
    shape, dtype, scaled = scalars.layout(scalar, count, embeddings.shape[1])
    parts = [(shape, dtype)] + ([((count,), np.dtype(np.float32))] if scaled else [])
    if token_parts is not None:
        counts = np.zeros(count, np.int64)
        for indices, n, _ in token_parts:
            counts[indices] = n
        offsets = np.zeros(count + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        width = token_parts[0][2].shape[1] if token_parts else 0
        rows = int(offsets[-1])
        tshape, tdtype, _ = scalars.layout(scalar, rows, width)
        parts += [(tshape, tdtype), ((count + 1,), np.dtype(np.int64))]
        parts += [((rows,), np.dtype(np.float32))] if scaled else []
    generation, views = carve(arena, parts)
    scalars.store(embeddings, scalar, views[0], views[1] if scaled else None)
    tokens = None
    if token_parts is not None:
        base = 2 if scaled else 1
        values, tape_offsets = views[base], views[base + 1]
        tape_offsets[...] = offsets
        flat = np.empty((rows, width), np.float32)
        for indices, n, rows_of_batch in token_parts:
            # destination row of every token: its item's offset plus its position in the item
            starts = np.repeat(offsets[indices], n)
            within = np.arange(len(rows_of_batch)) - np.repeat(np.cumsum(n) - n, n)
            flat[starts + within] = rows_of_batch
        token_scales = views[base + 2] if scaled else None
        scalars.store(flat, scalar, values, token_scales)
        tokens = RowsTape(values, tape_offsets, token_scales, arena=arena, generation=generation)
    return Encoded(arena, generation, scalar, views[0], views[1] if scaled else None, tokens, count)
