"""The approximate search of large indexes: an inverted file (IVF) laid out in the vectors themselves.

Exact search reads every row, so its time grows with the index (docs/index.md: about 140 ms
for a million 256-d F32 rows on two cores). From ``MIN_ROWS`` rows on, an index is clustered:
k-means finds ``sqrt(n)`` centroids, and a compaction rewrites the vectors grouped by their
nearest centroid, so that list ``i`` is the contiguous slots ``offsets[i]:offsets[i + 1]``.
``ivf-G.npz`` keeps the centroids and offsets (a few hundred kilobytes; no row is copied), named
in ``meta`` in the same transaction that commits the new order. A search scores the centroids,
reads the ``nprobe`` nearest lists as whole sequential blocks, and reads every slot past the
clustered ones exactly: an item committed after the last clustering is found exactly, never
missed. The lists are rebuilt when those later rows pass ``REBUILD`` of the clustered ones.
Recall@10 against exact search is measured by benchmarks/index.py and reported in docs/index.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import files
from ..core.types import Scalar

MIN_ROWS = 100_000  # below this, exact search is fast enough (docs/index.md: under ~40 ms on 2 cores)
REBUILD = 0.05  # rows added past the clustered ones, as a fraction of them, that start a new clustering
SAMPLE = 65_536  # rows k-means is trained on
ITERATIONS = 8
BLOCK = 1 << 16


@dataclass(frozen=True)
class Lists:
    """Centroids [nlist, d] (unit float32); list ``i`` is the slots ``offsets[i]:offsets[i + 1]``;
    slots from ``offsets[-1]`` on were added later and are searched exactly."""

    centroids: np.ndarray
    offsets: np.ndarray

    @property
    def covered(self) -> int:
        return int(self.offsets[-1])

    def probe(self, query: np.ndarray, nprobe: int) -> list[tuple[int, int]]:
        """The slot ranges of the ``nprobe`` lists nearest to ``query`` (unit float32), in slot order."""
        nprobe = min(nprobe, len(self.centroids))
        nearest = np.sort(np.argpartition(-(self.centroids @ query), nprobe - 1)[:nprobe])
        return [(int(self.offsets[c]), int(self.offsets[c + 1])) for c in nearest if self.offsets[c + 1] > self.offsets[c]]


def widen(rows: np.ndarray, scalar: Scalar) -> np.ndarray:
    """Stored rows as float32 (I8 times its scale)."""
    if scalar is Scalar.I8:
        return np.asarray(rows["q"].astype(np.float32) * rows["s"][:, None], np.float32)
    return np.asarray(rows, np.float32)


def default_nprobe(nlist: int) -> int:
    return max(8, nlist // 16)


def cluster(rows: np.ndarray, live: np.ndarray, scalar: Scalar, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """k-means (``sqrt(n)`` lists) on a sample of the ``live`` slots; answers the centroids and
    each live slot's list."""
    n = len(live)
    nlist = min(n, max(16, int(np.sqrt(n))))  # a forced clustering of fewer rows: a list a row
    rng = np.random.default_rng(seed)
    sample = widen(rows[np.sort(rng.choice(live, min(n, SAMPLE), replace=False))], scalar)
    centroids = sample[rng.choice(len(sample), nlist, replace=False)].copy()
    for _ in range(ITERATIONS):
        nearest = np.argmax(sample @ centroids.T, axis=1)
        sums = np.zeros_like(centroids)
        np.add.at(sums, nearest, sample)
        empty = np.bincount(nearest, minlength=nlist) == 0
        sums[empty] = sample[rng.choice(len(sample), int(empty.sum()))]  # an empty list restarts at a random row
        centroids = (sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)).astype(np.float32)
    owners = np.concatenate([np.argmax(widen(rows[live[s : s + BLOCK]], scalar) @ centroids.T, axis=1) for s in range(0, n, BLOCK)])
    return centroids, owners


def layout(centroids: np.ndarray, owners: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, Lists]:
    """The live slots in their new order (grouped by list), and the lists over that order."""
    order = np.argsort(owners, kind="stable")
    offsets = np.zeros(len(centroids) + 1, np.int64)
    offsets[1:] = np.cumsum(np.bincount(owners, minlength=len(centroids)))
    return live[order], Lists(centroids, offsets)


def save(lists: Lists, path: Path) -> None:
    """Write ``path`` whole, durably, before anyone is told its name (:mod:`uform.core.files`)."""
    files.write_with(path, lambda f: np.savez(f, centroids=lists.centroids, offsets=lists.offsets))


def load(path: Path) -> Lists:
    with np.load(path) as z:
        return Lists(z["centroids"], z["offsets"])
