"""The text modality: UTF-8 bytes, a byte per token, through the ``text`` tower.

Tensors and math are in docs/checkpoint.md ("text tower"). Texts are truncated at the
model's ``context`` bytes, sorted by length and cut into buckets of neighbours in length
where a cut saves more padding than running one more batch costs (:func:`plan`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from uform.core.arena import Arena, Encoded
from uform.core.config import Geometry, ModelConfig, integer
from uform.core.errors import InputError
from uform.core.graph import GraphBuilder
from uform.core.hookspecs import hookimpl
from uform.core.pipeline import Batch, EncodeOptions, check_stats, encode
from uform.core.plugin import Modality, TensorSpec, Tower, stack_tensors
from uform.core.runtime import Call
from uform.core.stats import EncodeStats

if TYPE_CHECKING:
    from typing_extensions import Unpack

BYTES = 256
MAX_ROWS = 64  # rows per batch
TOKEN_BUDGET = 16384  # rows x padded length per batch
RUN_TOKENS = 32  # what one more run costs, in padded tokens: a cut must save more padding
PLAN_WINDOW = 4096  # sorted texts planned at once


@dataclass
class TextEncodeStats(EncodeStats):
    """Counters of text calls: bytes encoded, texts and bytes cut at ``context``, padding."""

    tokens: int = 0
    truncated_items: int = 0
    truncated_tokens: int = 0
    padding_tokens: int = 0


@dataclass(frozen=True)
class TextTower:
    geometry: Geometry
    token_width: int


def read(cfg: Mapping[str, Any], model: ModelConfig) -> TextTower:
    return TextTower(Geometry.read(cfg, "towers.text"), integer(cfg, "token_width", "towers.text", 0, 16384))


def tensors(t: TextTower, model: ModelConfig) -> dict[str, TensorSpec]:
    w = t.geometry.width
    out = {
        "text.embed.weight": TensorSpec((BYTES, w)),
        "text.cls": TensorSpec((w,)),
        "text.pos.weight": TensorSpec((model.context + 1, w)),
    }
    out.update(stack_tensors("text", t.geometry, model.dimensions))
    if t.token_width:
        out["text.token_head.weight"] = TensorSpec((t.token_width, w))
    return out


def graph(t: TextTower, model: ModelConfig, b: GraphBuilder) -> None:
    ids = b.input("bytes", TensorProto.INT64, ["batch", "length"])
    lengths = b.input("lengths", TensorProto.INT64, ["batch"])
    length = b.op("Slice", b.op("Shape", ids), b.ints([1]), b.ints([2]))
    positions = b.op("Slice", b.weight("text.pos.weight"), b.ints([1]), b.op("Add", length, b.ints([1])))
    x = b.op("Add", b.op("Gather", b.weight("text.embed.weight"), ids), positions)
    x = b.prepend_class_token(x, "text")
    mask = b.padding_mask(b.op("Add", lengths, b.const(np.int64(1))), b.op("Add", length, b.ints([1])))
    if not t.token_width:  # only the class token is read: the last block runs for it alone
        pooled = b.transformer(x, "text", t.geometry, mask, pick=b.class_token)
        b.output(b.projected_embedding(pooled, "text"), "embeddings", None, ["batch", model.dimensions])
    else:
        hidden = b.transformer(x, "text", t.geometry, mask)
        b.output(b.pooled_embedding(hidden, "text"), "embeddings", None, ["batch", model.dimensions])
        rows = b.op("Reshape", b.op("Slice", hidden, b.ints([1]), b.ints([1 << 62]), b.ints([1])), b.ints([-1, t.geometry.width]))
        vectors = b.l2_normalize(b.linear(rows, "text.token_head", bias=False))
        shape = b.op("Concat", b.op("Shape", ids), b.ints([t.token_width]), axis=0)
        b.output(b.op("Reshape", vectors, shape, allowzero=1), "tokens", None, ["batch", "length", t.token_width])


def describe(t: TextTower, model: ModelConfig) -> dict[str, int]:
    return {"token_width": t.token_width}


def as_bytes(texts: Any) -> list[bytes]:
    """Each text as bytes (``str`` as UTF-8); InputError names the first bad item."""
    if isinstance(texts, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"texts must be a sequence of str or bytes, got a single {type(texts).__name__}; wrap it in a list")
    out = []
    for i, text in enumerate(texts):
        if isinstance(text, str):
            try:
                out.append(text.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise InputError(i, f"text is not encodable as UTF-8 ({exc.reason} at {exc.start})") from None
        elif isinstance(text, (bytes, bytearray, memoryview)):
            out.append(bytes(text))
        else:
            raise InputError(i, f"expected str or bytes, got {type(text).__name__}")
    return out


def plan(lengths: np.ndarray, max_rows: int = MAX_ROWS, budget: int = TOKEN_BUDGET, run_tokens: int = RUN_TOKENS) -> list[np.ndarray]:
    """Item indices per batch: texts sorted by length, cut into buckets of neighbours that
    cost the least in all: each bucket costs its padded tokens (rows x (longest + 1), the class
    token included) plus ``run_tokens`` for running it, so a bucket is split only where that
    saves more padding than a run costs (ties go to fewer, larger buckets). Each holds at most
    ``max_rows`` rows and ``budget`` padded tokens. Exact (dynamic programming) over windows of
    ``PLAN_WINDOW`` sorted texts."""
    order = np.argsort(lengths, kind="stable")
    batches: list[np.ndarray] = []
    for start in range(0, len(order), PLAN_WINDOW):
        window = order[start : start + PLAN_WINDOW]
        widths = (lengths[window] + 1).tolist()
        one = len(widths) * widths[-1] if widths else 0
        if len(widths) <= max_rows and one <= budget and one - sum(widths) <= run_tokens:
            batches.append(window)  # no cut can save a run's cost
            continue
        cuts = _cuts(widths, max_rows, budget, run_tokens)
        batches += [window[a:b] for a, b in zip(cuts, cuts[1:])]
    return batches


def _cuts(widths: list[int], max_rows: int, budget: int, run_tokens: int) -> list[int]:
    """Boundaries 0 = c0 < c1 < ... = n of the cheapest cut of ascending ``widths``."""
    n = len(widths)
    best, back = [0] * (n + 1), [0] * (n + 1)
    for end in range(1, n + 1):
        w, least, arg = widths[end - 1], -1, end - 1
        for start in range(max(0, end - max_rows), end):  # the largest bucket first
            rows = end - start
            if rows * w > budget and rows > 1:
                continue
            cost = best[start] + rows * w + run_tokens
            if least < 0 or cost < least:
                least, arg = cost, start
        best[end], back[end] = least, arg
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(back[cuts[-1]])
    return cuts[::-1]


def feeds(chunks: Sequence[bytes], lengths: np.ndarray, indices: np.ndarray) -> Batch:
    """The ``bytes`` [rows, longest] and ``lengths`` [rows] feeds of one batch, zero-padded."""
    rows = lengths[indices]
    width = int(rows.max(initial=0))
    ids = np.zeros((len(indices), width), np.int64)
    joined = np.frombuffer(b"".join([chunks[i] for i in indices]), np.uint8)
    ids[np.arange(width)[None, :] < rows[:, None]] = joined
    return Batch(indices, {"bytes": ids, "lengths": rows.astype(np.int64)}, token_counts=rows)


def text_encode(
    call: Call,
    texts: Iterable[str | bytes],
    arena: Arena,
    /,
    *,
    stats: TextEncodeStats | None = None,
    **options: Unpack[EncodeOptions],
) -> Encoded:
    check_stats(stats, TextEncodeStats)
    encoded = as_bytes(texts)
    context = call.config.context
    full = np.fromiter((len(t) for t in encoded), np.int64, len(encoded))
    lengths = np.minimum(full, context)
    chunks = [t[:context] for t in encoded] if (full > context).any() else encoded
    batches = plan(lengths, call.rows(MAX_ROWS), call.rows(TOKEN_BUDGET), call.rows(RUN_TOKENS))
    result = encode(call, len(chunks), [functools.partial(feeds, chunks, lengths, idx) for idx in batches], arena, stats=stats, **options)
    count_bytes(stats, full, lengths, batches)
    return result


def count_bytes(stats: TextEncodeStats | None, full: np.ndarray, kept: np.ndarray, batches: Sequence[np.ndarray]) -> None:
    """Add bytes encoded, cut at ``context`` and padded to ``stats`` (when given)."""
    if stats is not None:
        stats.tokens += int(kept.sum())
        stats.truncated_items += int((full > kept).sum())
        stats.truncated_tokens += int((full - kept).sum())
        stats.padding_tokens += sum(len(i) * int(kept[i].max()) - int(kept[i].sum()) for i in batches)


@hookimpl
def uform_modalities() -> Iterable[Modality]:
    presets = {
        "tiny": {"width": 64, "depth": 2, "heads": 2, "mlp_width": 128, "token_width": 16},
        "small": {"width": 256, "depth": 4, "heads": 4, "mlp_width": 1024, "token_width": 64},
        "base": {"width": 768, "depth": 12, "heads": 12, "mlp_width": 3072, "token_width": 128},
    }
    tower = Tower("text", read, tensors, graph, presets)
    yield Modality("text", tower, {"text_encode": text_encode}, describe)
