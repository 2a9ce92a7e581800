"""The text modality: UTF-8 bytes, a byte per token, through the ``text`` tower.

Tensors and math are in docs/checkpoint.md ("text tower"). Texts are truncated at the
model's ``context`` bytes, sorted by length and cut into buckets of neighbours in length
where a cut saves more padding than running one more batch costs (:func:`plan`). A version-2
tower may hold a tokenizer of its own instead (:mod:`uform.plugins.media.text`): texts are then
token ids, truncated at the tower's ``context`` tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from uform.core.arena import Arena, Encoded
from uform.core.config import GEOMETRY_FIELDS, HEAD_FIELDS, MAX_CONTEXT, Geometry, Head, ModelConfig, choice, flag, integer, only_fields, optional_integer
from uform.core.errors import CheckpointError, InputError
from uform.core.graph import GraphBuilder
from uform.core.hookspecs import hookimpl
from uform.core.pipeline import Batch, EncodeOptions, check_stats, encode
from uform.core.plugin import Modality, TensorSpec, Tower, stack_tensors
from uform.core.runtime import Call
from uform.core.stats import EncodeStats

from .media import text as tokens
from .media.text import as_bytes

if TYPE_CHECKING:
    from typing_extensions import Unpack

BYTES = 256
MAX_ROWS = 64  # rows per batch
TOKEN_BUDGET = 16384  # rows x padded length per batch
RUN_TOKENS = 32  # what one more run costs, in padded tokens: a cut must save more padding
PLAN_WINDOW = 4096  # sorted texts planned at once


@dataclass
class TextEncodeStats(EncodeStats):
    """Counters of text calls: bytes encoded, texts and bytes cut at ``context``, padding.
    ``truncated_unread_items``: texts a model with its own tokenizer cut and read only in part
    (``truncated_tokens`` counts their tokens cut in the part read)."""

    tokens: int = 0
    truncated_items: int = 0
    truncated_tokens: int = 0
    padding_tokens: int = 0
    truncated_unread_items: int = 0


@dataclass
class TextItemStats(TextEncodeStats):
    """:class:`TextEncodeStats` that also keeps each text's tokens encoded (after the cut at
    ``context``), in the order the calls were given the texts (``item_tokens``; ``add``
    appends another's, ``reset`` empties it): what a caller needs to split one call's
    ``tokens`` between the requests it coalesced (the server's ``usage``), without
    tokenizing the texts again. It grows by one int a text: for a call or a request, not for
    a stats object that totals a whole corpus."""

    item_tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TextTower:
    geometry: Geometry
    token_width: int
    head: Head = Head()
    context: int = 0  # tokens a text spans (version 2's towers.text.context; else the model's)
    vocab_size: int = BYTES
    mask: str = "padding"  # "padding", "causal" or "none"
    pad_to_context: bool = False
    pad_id: int = 0
    tokenizer: tokens.HeldTokenizer | None = field(default=None, compare=False)
    end_token: int | str = "last"  # "last", "max" or a token id: where a row ends (tokens.ended)
    pooler: str = "none"  # "tanh": the pooled row through tanh(Linear(x; text.pooler)) before the projection (BERT's pooler)
    positions: str = "index"  # "non_pad": RoBERTa's position ids, each token's count of non-pad_id tokens up to it (pad_id's: 0)


FIELDS = GEOMETRY_FIELDS | HEAD_FIELDS | {
    "token_width", "tokenizer", "clean", "vocab_size", "context", "end_token", "mask", "pad_to_context", "pad_id", "norm", "pooler", "positions",
}  # fmt: skip


def read(cfg: Mapping[str, Any], model: ModelConfig) -> TextTower:
    where = "towers.text"
    only_fields(cfg, where, FIELDS, "a text tower")
    g = Geometry.read(cfg, where)
    token_width = integer(cfg, "token_width", where, 0, 16384) if "token_width" in cfg or model.version < 2 else 0
    head = Head.read(cfg, where, ("class", "first_token", "last_token", "final_position"), g.width, model.dimensions)
    kind = choice(cfg, "tokenizer", where, ("bytes", "tokenizer.json"), "bytes")
    clean = choice(cfg, "clean", where, ("none", "lower", "whitespace"), "none")
    vocab = optional_integer(cfg, "vocab_size", where, 1, 1 << 24, BYTES)
    context = optional_integer(cfg, "context", where, 1, MAX_CONTEXT, model.context)
    if kind == "bytes" and vocab != BYTES:
        raise CheckpointError(f"config field {where}.vocab_size: {vocab}, but a byte-level tower has {BYTES} tokens")
    if kind == "bytes" and context != model.context:
        raise CheckpointError(f"config field {where}.context: {context}, but a byte-level tower spans the model's context ({model.context})")
    end = cfg.get("end_token", "last")
    if end not in ("last", "max") and not (isinstance(end, int) and not isinstance(end, bool) and 0 <= end < vocab):
        raise CheckpointError(f"config field {where}.end_token: expected 'last', 'max' or a token id below vocab_size {vocab}, got {end!r}")
    if end != "last" and (kind != "tokenizer.json" or head.pooling != "last_token" or cfg.get("mask") != "causal"):
        raise CheckpointError(f"config field {where}.end_token: {end!r} needs tokenizer 'tokenizer.json', pooling 'last_token' and mask 'causal'")
    if kind == "bytes" and clean != "none":
        raise CheckpointError(f"config field {where}.clean: {clean!r}, but a byte-level tower reads its bytes as they are (cleaning needs tokenizer \"tokenizer.json\")")
    t = TextTower(
        g, token_width, head, context, vocab,
        mask=choice(cfg, "mask", where, ("padding", "causal", "none"), "padding"),
        pad_to_context=flag(cfg, "pad_to_context", where, False),
        pad_id=optional_integer(cfg, "pad_id", where, 0, vocab - 1, 0),
        tokenizer=tokens.read(model.extras, context, vocab, where, clean) if kind == "tokenizer.json" else None,
        end_token=end,
        pooler=choice(cfg, "pooler", where, ("none", "tanh"), "none"),
        positions=choice(cfg, "positions", where, ("index", "non_pad"), "index"),
    )  # fmt: skip
    if t.positions == "non_pad" and (head.class_token or kind != "tokenizer.json"):
        raise CheckpointError(f"config field {where}.positions: 'non_pad' needs tokenizer 'tokenizer.json' and class_token false")
    if head.pooling == "first_token" and head.class_token:
        raise CheckpointError(f"config field {where}.pooling: 'first_token' is the first of a text's own tokens, for a tower without a class token (class_token false); with one, 'class'")
    if head.pooling == "final_position" and not t.pad_to_context:
        raise CheckpointError(f"config field {where}.pooling: 'final_position' needs pad_to_context true")
    return t


def tensors(t: TextTower, model: ModelConfig) -> dict[str, TensorSpec]:
    w = t.geometry.width
    out = {"text.embed.weight": TensorSpec((t.vocab_size, w))}
    if t.head.class_token:
        out["text.cls"] = TensorSpec((w,))
    out["text.pos.weight"] = TensorSpec((t.context + t.head.first + (t.positions == "non_pad"), w))
    out.update(stack_tensors("text", t.geometry, model.dimensions, t.head))
    if t.pooler == "tanh":
        out["text.pooler.weight"], out["text.pooler.bias"] = TensorSpec((w, w)), TensorSpec((w,))
    if t.token_width:
        out["text.token_head.weight"] = TensorSpec((t.token_width, w))
    return out


def graph(t: TextTower, model: ModelConfig, b: GraphBuilder) -> None:
    ids = b.input("bytes", TensorProto.INT64, ["batch", "length"])  # token ids: bytes in version 1
    lengths = b.input("lengths", TensorProto.INT64, ["batch"])
    length = b.op("Slice", b.op("Shape", ids), b.ints([1]), b.ints([2]))
    if t.head.class_token:  # version 1's graph, node for node
        positions = b.op("Slice", b.weight("text.pos.weight"), b.ints([1]), b.op("Add", length, b.ints([1])))
        x = b.op("Add", b.op("Gather", b.weight("text.embed.weight"), ids), positions)
        x = b.prepend_class_token(x, "text")
    elif t.positions == "non_pad":  # RoBERTa's: a pad_id token row 0, every other its count of such tokens up to it
        real = b.op("Cast", b.op("Not", b.op("Equal", ids, b.const(np.int64(t.pad_id)))), to=TensorProto.INT64)
        rows = b.op("Mul", b.op("CumSum", real, b.const(np.int64(1))), real)
        x = b.op("Add", b.op("Gather", b.weight("text.embed.weight"), ids), b.op("Gather", b.weight("text.pos.weight"), rows))
    else:
        positions = b.op("Slice", b.weight("text.pos.weight"), b.ints([0]), length)
        x = b.op("Add", b.op("Gather", b.weight("text.embed.weight"), ids), positions)
    x = b.stack_input(x, "text", t.geometry, t.head)
    first = t.head.first
    if t.mask == "padding":
        mask: str | None = b.padding_mask(b.op("Add", lengths, b.const(np.int64(first))), b.op("Add", length, b.ints([first])))
    elif t.mask == "causal":  # padding follows the real tokens: causality alone hides it from them
        mask = b.causal_mask(b.op("Add", length, b.ints([first])))
    else:
        mask = None
    if t.head.pooling == "last_token":
        pick = b.token_at(b.op("Max", b.op("Add", lengths, b.const(np.int64(first - 1))), b.const(np.int64(0))))
    elif t.head.pooling == "final_position":
        pick = b.last_position
    else:  # the class token, or without one the first token (the tokenizer's <s> or [CLS])
        pick = b.class_token

    def pooled_by(x: str) -> str:
        """The pooled row through the tower's pooler (``tanh(Linear(x; text.pooler))``), if it has one."""
        return b.op("Tanh", b.linear(x, "text.pooler")) if t.pooler == "tanh" else x

    if not t.token_width:  # only the pooled token is read: the last block runs for it alone
        pooled = pooled_by(b.transformer(x, "text", t.geometry, mask, pick=pick))
        b.output(b.projected_embedding(pooled, "text", t.head.projection), "embeddings", None, ["batch", model.dimensions])
    else:
        hidden = b.transformer(x, "text", t.geometry, mask)
        b.output(b.projected_embedding(pooled_by(pick(hidden)), "text", t.head.projection), "embeddings", None, ["batch", model.dimensions])
        rows = b.op("Slice", hidden, b.ints([first]), b.ints([1 << 62]), b.ints([1]))
        rows = b.op("Reshape", rows, b.ints([-1, t.geometry.width]))
        vectors = b.l2_normalize(b.linear(rows, "text.token_head", bias=False))
        shape = b.op("Concat", b.op("Shape", ids), b.ints([t.token_width]), axis=0)
        b.output(b.op("Reshape", vectors, shape, allowzero=1), "tokens", None, ["batch", "length", t.token_width])


def describe(t: TextTower, model: ModelConfig) -> dict[str, int]:
    return {"token_width": t.token_width}


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
    return Batch(indices, {"bytes": ids, "lengths": rows.astype(np.int64)}, token_counts=rows, inputs="token ids")


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
    tower: TextTower = call.parsed
    if tower.tokenizer is not None:
        return _encode_tokens(call, tower, tower.tokenizer, texts, arena, stats, options)
    encoded = as_bytes(texts)
    context = call.config.context
    full = np.fromiter((len(t) for t in encoded), np.int64, len(encoded))
    lengths = np.minimum(full, context)
    chunks = [t[:context] for t in encoded] if (full > context).any() else encoded
    batches = plan(lengths, call.rows(MAX_ROWS), call.rows(TOKEN_BUDGET), call.rows(RUN_TOKENS))
    result = encode(call, len(chunks), [functools.partial(feeds, chunks, lengths, idx) for idx in batches], arena, stats=stats, **options)
    count_bytes(stats, full, lengths, batches)
    return result


def token_feeds(ids: Sequence[np.ndarray], lengths: np.ndarray, width: int | None, pad_id: int, indices: np.ndarray) -> Batch:
    """The ``bytes`` (token ids) [rows, longest or ``width``] and ``lengths`` [rows] feeds of one
    batch, padded with ``pad_id`` (one pad token at least: a tower without a class token has
    a row to pool even where a tokenizer without special tokens gave none)."""
    rows = lengths[indices]
    out = np.full((len(indices), max(1, int(rows.max(initial=0))) if width is None else width), pad_id, np.int64)
    if len(indices):
        out[np.arange(out.shape[1])[None, :] < rows[:, None]] = np.concatenate([ids[i] for i in indices])
    return Batch(indices, {"bytes": out, "lengths": rows.astype(np.int64)}, token_counts=rows, inputs="token ids")


def _encode_tokens(
    call: Call, tower: TextTower, tokenizer: tokens.HeldTokenizer, texts: Iterable[str | bytes], arena: Arena, stats: TextEncodeStats | None, options: EncodeOptions
) -> Encoded:
    """``text_encode`` through the checkpoint's own tokenizer (version 2)."""
    encoded = tokenizer.encode(tokens.as_texts(texts), count=False)  # a long text read as far as its kept tokens need
    ids, kept = (encoded.ids, encoded.kept) if tower.end_token == "last" else tokens.ended(encoded.ids, tower.end_token)
    width = tower.context if tower.pad_to_context else None
    planned = np.full_like(kept, tower.context) if width is not None else kept - (1 - tower.head.first)  # plan() counts a class token
    batches = plan(planned, call.rows(MAX_ROWS), call.rows(TOKEN_BUDGET), call.rows(RUN_TOKENS))
    thunks = [functools.partial(token_feeds, ids, kept, width, tower.pad_id, idx) for idx in batches]
    result = encode(call, len(kept), thunks, arena, stats=stats, **options)
    if stats is not None:
        stats.tokens += int(kept.sum())
        stats.truncated_items += int((encoded.full > encoded.kept).sum())
        stats.truncated_tokens += int((encoded.full - encoded.kept).sum())
        stats.truncated_unread_items += int((~encoded.whole).sum())
        if isinstance(stats, TextItemStats):
            stats.item_tokens.extend(kept.tolist())
        stats.padding_tokens += sum(len(i) * (width if width is not None else max(1, int(kept[i].max()))) - int(kept[i].sum()) for i in batches)
    return result


def count_bytes(stats: TextEncodeStats | None, full: np.ndarray, kept: np.ndarray, batches: Sequence[np.ndarray]) -> None:
    """Add bytes encoded, cut at ``context`` and padded to ``stats`` (when given)."""
    if stats is not None:
        if isinstance(stats, TextItemStats):
            stats.item_tokens.extend(kept.tolist())
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
