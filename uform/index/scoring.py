"""Scoring stored rows against a query, and exact top-k.

Every scalar is compared as docs/api.md ("Output scalars") says: F32, F16 and BF16 by dot
product in float32, I8 as ``(q · x) * s``, B1 by ``cos(pi * hamming / dimensions)``. Rows are
scored in blocks, so a mapped index of any size is read once, sequentially, with bounded
memory. Exact search reads every row: its cost is the rows' bytes (docs/index.md measures it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.types import Scalar

BLOCK = 1 << 16  # rows scored at once: converted rows of one block stay in cache-sized memory


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


def scores(rows: np.ndarray, scalar: Scalar, query: np.ndarray, dimensions: int) -> np.ndarray:
    """float32 cosine estimates of every row with ``query`` (from :func:`prepare`)."""
    n = len(rows)
    if scalar is Scalar.F32:
        out: np.ndarray = np.asarray(rows @ query, np.float32)
        return out
    result = np.empty(n, np.float32)
    for start in range(0, n, BLOCK):
        block = rows[start : start + BLOCK]
        if scalar is Scalar.B1:
            hamming = np.bitwise_count(np.bitwise_xor(block, query)).sum(axis=1, dtype=np.int32)
            result[start : start + len(block)] = np.cos(np.pi * hamming / dimensions)
        elif scalar is Scalar.I8:
            result[start : start + len(block)] = (block["q"].astype(np.float32) @ query) * block["s"]
        else:
            result[start : start + len(block)] = block.astype(np.float32) @ query
    return result


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
