"""Scoring stored rows against a query, and exact top-k.

Every scalar is compared as docs/api.md ("Output scalars") says: F32, F16 and BF16 by dot
product in float32, I8 as ``(q · x) * s``, B1 by ``cos(pi * hamming / dimensions)``. Rows are
scored in blocks, so a mapped index of any size is read once, sequentially, with bounded
memory. Exact search reads every row: its cost is the rows' bytes (docs/index.md measures it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from ..core.types import Scalar
from .identity import MODALITIES

Resolve = Callable[[list[int]], dict[int, tuple[str, str | None]]]  # (path, text) of live slots

BLOCK = 1 << 16  # rows scored at once: converted rows of one block stay in cache-sized memory


class Hit(NamedTuple):
    """One search result: the item's path (a text's key), its modality, its score (cosine,
    -1 … 1), and the text for a text item (else None)."""

    path: str
    modality: str
    score: float
    text: str | None


def prepare(query: np.ndarray, scalar: Scalar, dimensions: int) -> np.ndarray:
    """The float32 query (unit, the index's dimensions) as the rows of ``scalar`` are compared with it."""
    q = np.asarray(query, np.float32).reshape(-1)
    if len(q) < dimensions:
        raise ValueError(f"the query has {len(q)} values; the index's vectors have {dimensions}")
    q = q[:dimensions]
    q = q / max(float(np.linalg.norm(q)), 1e-12)
    if scalar is Scalar.B1:
        return np.packbits(q > 0, bitorder="big")
    return np.ascontiguousarray(q)


def dot(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``rows @ query`` in float32 by numpy's own loop (``einsum``, one thread), ``BLOCK`` rows at
    a time, never BLAS. A threaded BLAS product wakes its threads each call: the 62 lists of a
    clustered search at a million rows took 34-72 CPU ms that way on two busy cores, 7-15 by
    ``einsum``; and an exact search of a million rows, a memory-bound pass that a second thread
    does not speed, took 100-145 CPU ms by BLAS's threads, 79-111 by ``einsum`` (docs/index.md)."""
    out = np.empty(len(rows), np.float32)
    for start in range(0, len(rows), BLOCK):
        np.einsum("ij,j->i", rows[start : start + BLOCK], query, dtype=np.float32, out=out[start : start + BLOCK])
    return out


def scores(rows: np.ndarray, scalar: Scalar, query: np.ndarray, dimensions: int) -> np.ndarray:
    """float32 cosine estimates of every row with ``query`` (from :func:`prepare`)."""
    n = len(rows)
    if scalar is Scalar.F32:
        return dot(rows, query)
    result = np.empty(n, np.float32)
    for start in range(0, n, BLOCK):
        block = rows[start : start + BLOCK]
        if scalar is Scalar.B1:
            hamming = np.bitwise_count(np.bitwise_xor(block, query)).sum(axis=1, dtype=np.int32)
            result[start : start + len(block)] = np.cos(np.pi * hamming / dimensions)
        elif scalar is Scalar.I8:
            result[start : start + len(block)] = dot(block["q"].astype(np.float32), query) * block["s"]
        else:
            result[start : start + len(block)] = dot(block.astype(np.float32), query)
    return result


def exact(rows: np.ndarray, scalar: Scalar, query: np.ndarray, dimensions: int) -> np.ndarray:
    """The scores a search answers: each row's on its own arithmetic (the products, then numpy's
    pairwise sum of one row), so a pair's score depends on the row and the query alone, never on
    the rows scored with it (a BLAS product's sums do: :func:`scores` only picks the candidates)."""
    if scalar is Scalar.B1:
        return scores(rows, scalar, query, dimensions)
    out = np.empty(len(rows), np.float32)
    for start in range(0, len(rows), BLOCK // 16):
        block = rows[start : start + BLOCK // 16]
        wide = block["q"].astype(np.float32) if scalar is Scalar.I8 else np.asarray(block, np.float32)
        sums = np.add.reduce(np.ascontiguousarray(wide * query), axis=1, dtype=np.float32)
        out[start : start + len(block)] = sums * block["s"] if scalar is Scalar.I8 else sums
    return out


class DamagedRow(ValueError):
    """A stored row scored as no unit vector can (not finite, or a cosine past ``LIMITS``): the file is damaged."""

    def __init__(self, slot: int, score: float) -> None:
        super().__init__(f"the row of slot {slot} is not a unit vector (its score with a unit query is {score})")
        self.slot = slot


# the largest |cosine| a unit row stored in each scalar can score: 1 and five times its rounding's
# largest norm error (measured on 20,000 rows of 16-768 dimensions: F16 3e-4, BF16 2.7e-3, I8 4.1e-3)
LIMITS = {Scalar.F32: 1.0001, Scalar.F16: 1.002, Scalar.BF16: 1.015, Scalar.I8: 1.02, Scalar.B1: 1.0}


def top(values: np.ndarray, count: int) -> np.ndarray:
    """Positions of the ``count`` largest values, largest first (ties by position)."""
    n = len(values)
    if count >= n:
        return np.argsort(-values, kind="stable")
    part = np.argpartition(-values, count)[:count]
    return part[np.lexsort((part, -values[part]))]


def kind_mask(kinds: np.ndarray, wanted: Sequence[int] | None) -> np.ndarray | None:
    """Which slots hold one of the ``wanted`` modalities; None when all are wanted."""
    if wanted is None:
        return None
    lookup = np.zeros(256, bool)
    lookup[list(wanted)] = True
    mask: np.ndarray = lookup[kinds]
    return mask


def search(resolve: Resolve, rows: np.ndarray, kinds: np.ndarray, scalar: Scalar, dimensions: int, q: np.ndarray, k: int,
           wanted: Sequence[int] | None, blocks: list[tuple[int, int]] | None) -> list[Hit]:  # fmt: skip
    """The ``k`` best of the rows (``blocks``: only those slot ranges), resolved to items through
    ``resolve`` (inside a read transaction): slots of removed items are skipped, widening until ``k`` are found."""
    if blocks is None:
        values = scores(rows, scalar, q, dimensions)
        where, kinds_of = None, kinds
    else:  # the probed lists and the rows added since the clustering, each a sequential block
        blocks = [(a, b) for a, b in blocks if b > a]
        values = np.concatenate([scores(rows[a:b], scalar, q, dimensions) for a, b in blocks] or [np.zeros(0, np.float32)])
        where = np.concatenate([np.arange(a, b) for a, b in blocks] or [np.zeros(0, np.int64)])
        kinds_of = kinds[where]
    limit = LIMITS[scalar]
    if len(values) and not (float(values.max()) <= limit and float(values.min()) >= -limit):  # NaN fails both: two passes, no copy
        bad = np.flatnonzero(~(np.abs(values) <= limit))
        raise DamagedRow(int(bad[0] if where is None else where[bad[0]]), float(values[bad[0]]))
    mask = kind_mask(kinds_of, wanted)
    if mask is not None:
        values = np.where(mask, values, -np.inf)
    live = len(values) if mask is None else int(mask.sum())
    want = live if k == 0 else min(k, live)
    count = min(live, want + 16)
    while True:
        order = top(values, count)
        order = order[np.isfinite(values[order])]
        at = order if where is None else where[order]
        final = exact(rows[at], scalar, q, dimensions)  # the candidates' scores, whichever rows came with them
        ranked = np.lexsort((at, -final))
        at, final = at[ranked], final[ranked]
        found = resolve([int(s) for s in at])
        hits = [Hit(found[s][0], MODALITIES[kinds[s]], float(v), found[s][1]) for s, v in zip(map(int, at), final, strict=True) if s in found]
        if len(hits) >= want or count >= live:
            return hits[:want] if k else hits
        count = min(live, count * 4)

