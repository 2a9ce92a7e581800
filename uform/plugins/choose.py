"""The choose modality: ``text_choose`` through the ``decoder`` tower, a causal byte model.

Tensors and math are in docs/checkpoint.md ("Byte decoder"); usage in docs/choose.md. For
each text the decoder scores the byte that would come next; ``text_choose`` keeps the
scores of that text's single-byte choices, divides them by the temperature of the text's
group and renormalises them with a softmax. Texts keep their **last** ``context`` bytes,
are sorted by length and batched like the text modality's. All input checks run before
anything is computed; the probabilities are written to the caller's arena only at the end.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from uform.core.arena import Arena, RowsTape, carve, lease
from uform.core.config import GEOMETRY_FIELDS, STACK_ONLY, Geometry, ModelConfig, only_fields, refuse_fields
from uform.core.errors import InputError, check_not_released
from uform.core.graph import GraphBuilder
from uform.core.hookspecs import hookimpl
from uform.core.pipeline import Batch, check_batch, check_stats, count_call, run_batches
from uform.core.plugin import Modality, TensorSpec, Tower, stack_tensors
from uform.core.progress import Progress, ProgressHandler
from uform.core.runtime import Call
from uform.plugins.media.text import as_bytes
from uform.plugins.text import MAX_ROWS, TOKEN_BUDGET, TextEncodeStats, count_bytes, plan

BYTES = 256
BEGIN = 256  # the begin token's row of decoder.embed.weight


@dataclass(frozen=True)
class DecoderTower:
    """The decoder's parsed config: the transformer geometry only."""

    geometry: Geometry


def read(cfg: Mapping[str, Any], model: ModelConfig) -> DecoderTower:
    refuse_fields(cfg, "towers.decoder", STACK_ONLY, "the byte decoder takes activation and layer_norm_eps of version 2's fields, no other")
    only_fields(cfg, "towers.decoder", GEOMETRY_FIELDS, "the byte decoder")
    return DecoderTower(Geometry.read(cfg, "towers.decoder"))


def tensors(t: DecoderTower, model: ModelConfig) -> dict[str, TensorSpec]:
    w = t.geometry.width
    out = {
        "decoder.embed.weight": TensorSpec((BYTES + 1, w)),
        "decoder.pos.weight": TensorSpec((model.context + 1, w)),
        "decoder.head.weight": TensorSpec((BYTES, w)),
        "decoder.head.bias": TensorSpec((BYTES,)),
    }
    out.update(stack_tensors("decoder", t.geometry))
    return out


def graph(t: DecoderTower, model: ModelConfig, b: GraphBuilder) -> None:
    """``bytes`` [B, T] (begin token first, zero right-padded), ``last`` [B] → ``logits`` [B, 256].

    Only each row's last real token reaches the head, and causal attention lets no earlier
    token see it, so the final block runs its output projection and MLP for that token alone
    (``GraphBuilder.picked_block``): the same math for a fraction of the last block.
    """
    g = t.geometry
    ids = b.input("bytes", TensorProto.INT64, ["batch", "tokens"])
    last = b.input("last", TensorProto.INT64, ["batch"])
    tokens = b.op("Slice", b.op("Shape", ids), b.ints([1]), b.ints([2]))
    positions = b.op("Slice", b.weight("decoder.pos.weight"), b.ints([0]), tokens)
    x = b.op("Add", b.op("Gather", b.weight("decoder.embed.weight"), ids), positions)
    shape = b.op("Shape", x)
    bt = b.op("Slice", shape, b.ints([0]), b.ints([2]))
    mask = b.causal_mask(tokens)
    h = b.op("Reshape", x, b.ints([-1, g.width]))
    for i in range(g.depth - 1):
        h = b.block(h, f"decoder.blocks.{i}", g, bt, mask)
    at = b.op("Unsqueeze", last, b.ints([1]))

    def pick(rows: str) -> str:  # each row's last real token: [B, T, C] → [B, C]
        return b.op("GatherND", rows, at, batch_dims=1)  # type: ignore[no-any-return]

    final = b.picked_block(h, f"decoder.blocks.{g.depth - 1}", g, shape, pick, mask)
    b.output(b.linear(b.layer_norm(final, "decoder.ln_final"), "decoder.head"), "logits", None, ["batch", BYTES])


def describe(t: DecoderTower, model: ModelConfig) -> dict[str, int]:
    return {"choice_temperature_groups": len(model.choice_temperatures)}


# -- checking inputs --------------------------------------------------------------------


def _choice_set(index: int, choice: Any) -> bytes:
    """One text's choices as bytes, each a distinct single byte; InputError otherwise."""
    if isinstance(choice, str):
        wide = next((c for c in choice if ord(c) > 0x7F), None)
        if wide is not None:
            raise InputError(
                index, f"choice {wide!r} is not a single byte (it is {len(wide.encode('utf-8'))} bytes in UTF-8); "
                "str choices must be ASCII, pass bytes for other byte values",
            )  # fmt: skip
        raw = choice.encode("ascii")
    elif isinstance(choice, (bytes, bytearray, memoryview)):
        check_not_released(index, choice)
        raw = bytes(choice)
    else:
        raise InputError(index, f"choices must be a str or bytes of single-byte choices (e.g. 'ABCD'), got {type(choice).__name__}")
    if not raw:
        raise InputError(index, "the choice set is empty; give one byte per choice, e.g. 'ABCD'")
    if len(set(raw)) != len(raw):
        dup = next(c for k, c in enumerate(raw) if c in raw[:k])
        raise InputError(index, f"choice {bytes([dup])!r} appears twice in {raw!r}")
    return raw


def one_per_text(name: str, given: int, count: int, how: str) -> None:
    """Refuse an argument ``name`` of ``given`` entries for ``count`` texts: InputError naming the
    first text without an entry; ValueError when there are more entries than texts (the extra
    ones answer no text, so no item of the call is at fault)."""
    texts = f"{count} text" + ("" if count == 1 else "s")
    if given < count:
        raise InputError(given, f"{name} has no entry for this text ({name} has {given} entries for {texts}); {how}")
    if given > count:
        raise ValueError(f"{name} has {given} entries for {texts}: {name}[{count}:] belongs to no text; {how}")


def choice_sets(choices: Any, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat choice bytes (uint8) and row offsets (int64 [count + 1]) for ``count`` texts.

    ``choices`` is one str/bytes shared by every text, or a sequence of one per text.
    """
    if isinstance(choices, (str, bytes, bytearray, memoryview)):
        raw = _choice_set(0, choices)
        flat = np.tile(np.frombuffer(raw, np.uint8), count)
        return flat, np.arange(count + 1, dtype=np.int64) * len(raw)
    try:
        iter(choices)
    except TypeError:
        raise TypeError(f"choices must be a str or bytes shared by all texts, or one per text; got {type(choices).__name__}") from None
    check_batch(choices, "choices")
    items = list(choices)
    one_per_text("choices", len(items), count, "give one choice string per text, or a single string shared by all")
    cache: dict[Any, bytes] = {}
    sets: list[bytes] = []
    for i, item in enumerate(items):
        key = (type(item), item) if isinstance(item, (str, bytes)) else None
        known = cache.get(key) if key is not None else None
        raw = known if known is not None else _choice_set(i, item)
        if key is not None:
            cache[key] = raw
        sets.append(raw)
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum([len(s) for s in sets], out=offsets[1:])
    return np.frombuffer(b"".join(sets), np.uint8), offsets


def group_indices(groups: Sequence[int] | None, count: int, available: int) -> np.ndarray:
    """One temperature group per text (int64 [count]); None means group 0 for every text.

    A numpy integer array is checked without a Python loop; other sequences item by item.
    """
    if groups is None:
        return np.zeros(count, np.int64)
    if isinstance(groups, np.ndarray) and groups.ndim == 1 and groups.dtype.kind in "iu":
        items: Sequence[Any] = groups
    else:
        try:
            if isinstance(groups, (str, bytes)):
                raise TypeError
            iter(groups)
        except TypeError:
            raise TypeError(f"temperature_groups must be a sequence of ints, one per text, or None; got {type(groups).__name__}") from None
        check_batch(groups, "temperature_groups")
        items = list(groups)
    one_per_text("temperature_groups", len(items), count, "give one group per text, or None for group 0")
    if not isinstance(items, np.ndarray):
        for i, g in enumerate(items):
            if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
                raise InputError(i, f"temperature group must be an int, got {type(g).__name__} {g!r}")
    try:
        wide = np.asarray(items) if len(items) else np.zeros(0, np.int64)
    except OverflowError:  # ints past 64 bits: compare them as Python ints
        wide = np.asarray(items, dtype=object)
    bad = np.flatnonzero((wide < 0) | (wide >= available))
    if len(bad):
        i = int(bad[0])
        raise InputError(i, f"temperature group {int(items[i])} is out of range: this model has {available} group(s), 0 … {available - 1}")
    return wide.astype(np.int64)


# -- running ----------------------------------------------------------------------------


def feeds(chunks: Sequence[bytes], lengths: np.ndarray, indices: np.ndarray) -> Batch:
    """``bytes`` [rows, longest + 1] (begin token, then bytes, zero-padded) and ``last`` [rows]."""
    rows = lengths[indices]
    width = int(rows.max(initial=0))
    ids = np.zeros((len(indices), width + 1), np.int64)
    ids[:, 0] = BEGIN
    joined = np.frombuffer(b"".join([chunks[i] for i in indices]), np.uint8)
    ids[:, 1:][np.arange(width)[None, :] < rows[:, None]] = joined
    return Batch(indices, {"bytes": ids, "last": rows.astype(np.int64)}, inputs="token ids")


def probabilities(logits: np.ndarray, flat: np.ndarray, offsets: np.ndarray, temperatures: np.ndarray) -> np.ndarray:
    """Per-row softmax of ``logits[row, choice] / temperatures[row]`` over each row's choices."""
    counts = np.diff(offsets)
    if not len(flat):
        return np.zeros(0, np.float32)
    owner = np.repeat(np.arange(len(counts)), counts)
    z = logits[owner, flat].astype(np.float64) / temperatures[owner]
    starts = offsets[:-1]
    e = np.exp(z - np.maximum.reduceat(z, starts)[owner])
    return (e / np.add.reduceat(e, starts)[owner]).astype(np.float32)  # type: ignore[no-any-return]


def text_choose(
    call: Call,
    texts: Iterable[str | bytes],
    choices: Iterable[str | bytes] | str | bytes,
    arena: Arena,
    /,
    *,
    temperature_groups: Sequence[int] | None = None,
    progress: ProgressHandler | None = None,
    progress_steps: int = 0,
    stats: TextEncodeStats | None = None,
) -> RowsTape:
    """For each text, the probability of each of its choices as the next byte, in order given."""
    started = time.perf_counter()
    if not isinstance(arena, Arena):
        raise TypeError(f"arena must be a uform.Arena, got {type(arena).__name__}")
    check_stats(stats, TextEncodeStats)
    encoded = as_bytes(texts)
    count, context = len(encoded), call.config.context
    flat, offsets = choice_sets(choices, count)
    temps = np.asarray(call.config.choice_temperatures, np.float64)
    groups = group_indices(temperature_groups, count, len(temps))
    full = np.fromiter((len(t) for t in encoded), np.int64, count)
    lengths = np.minimum(full, context)
    chunks = [t[max(0, len(t) - context) :] for t in encoded] if (full > context).any() else encoded
    batches = plan(lengths, call.rows(MAX_ROWS), call.rows(TOKEN_BUDGET))
    tracker = Progress(progress, progress_steps, count)
    thunks = [functools.partial(feeds, chunks, lengths, idx) for idx in batches]
    with lease(arena):
        logits = np.empty((count, BYTES), np.float32)

        def consume(batch: Batch, result: list[np.ndarray]) -> None:
            logits[batch.indices] = result[0]

        waited, computed = run_batches(call, thunks, ["logits"], tracker, consume)
        probs = probabilities(logits, flat, offsets, temps[groups])
        generation, (values, tape_offsets) = carve(arena, [(probs.shape, np.dtype(np.float32)), (offsets.shape, np.dtype(np.int64))])
        values[...], tape_offsets[...] = probs, offsets
    count_call(stats, count, len(batches), waited, computed, started)
    count_bytes(stats, full, lengths, batches)
    return RowsTape(values, tape_offsets, arena=arena, generation=generation)


@hookimpl
def uform_modalities() -> Iterable[Modality]:
    presets = {
        "tiny": {"width": 64, "depth": 2, "heads": 2, "mlp_width": 128},
        "small": {"width": 256, "depth": 4, "heads": 4, "mlp_width": 1024},
        "base": {"width": 768, "depth": 12, "heads": 12, "mlp_width": 3072},
    }
    tower = Tower("decoder", read, tensors, graph, presets)
    yield Modality("choose", tower, {"text_choose": text_choose}, describe)
