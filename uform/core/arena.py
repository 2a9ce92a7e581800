"""Caller-owned output memory that is reused across calls, and the views read from it.

An :class:`Arena` holds one growing byte buffer. Each call that writes into it starts a new
generation; an :class:`Encoded` or :class:`RowsTape` from an older generation raises
:class:`~uform.StaleArenaError` when read, so overwritten data is never returned. Arrays
already taken out of an output are views into the arena: copy them (``np.array(x)``) to
keep them past the next call on the same arena.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .errors import ArenaBusyError, StaleArenaError
from .types import Scalar

ALIGN = 64


class Arena:
    """Reusable output memory owned by the caller; one call at a time writes into it."""

    def __init__(self, capacity: int = 0) -> None:
        if not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"Arena capacity must be a non-negative integer, got {capacity!r}")
        self._buffer = np.empty(capacity, dtype=np.uint8)
        self._generation = 0
        self._busy = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes the arena currently holds."""
        return int(self._buffer.nbytes)

    @property
    def generation(self) -> int:
        """How many calls have written into this arena."""
        return self._generation

    def __repr__(self) -> str:
        return f"Arena(nbytes={self.nbytes}, generation={self._generation})"

    # The names plugins use are the module functions lease() and carve(); these two stay for
    # callers not yet moved to them.
    def _lease(self) -> contextlib.AbstractContextManager[Arena]:
        return lease(self)

    def _carve(self, parts: Sequence[tuple[tuple[int, ...], np.dtype[Any]]]) -> tuple[int, list[np.ndarray]]:
        return carve(self, parts)

    def _check(self, generation: int) -> None:
        if generation != self._generation:
            raise StaleArenaError(
                "this output's Arena was reused by a later call and its data overwritten; "
                "copy arrays you keep (np.array(...)) or give each batch of results its own Arena"
            )


@contextlib.contextmanager
def lease(arena: Arena) -> Iterator[Arena]:
    """Hold ``arena`` for one call (a verb's whole run); a second concurrent call raises
    :class:`~uform.ArenaBusyError`. For plugins: what a verb writes goes through :func:`carve`
    inside the lease."""
    if not arena._busy.acquire(blocking=False):
        raise ArenaBusyError("this Arena is being written by another call; give each concurrent call its own Arena")
    try:
        yield arena
    finally:
        arena._busy.release()


def carve(arena: Arena, parts: Sequence[tuple[tuple[int, ...], np.dtype[Any]]]) -> tuple[int, list[np.ndarray]]:
    """Start a new generation of ``arena`` and answer it with one writable array per
    ``(shape, dtype)`` part, each 64-byte aligned (the buffer grows when it must). Outputs of
    earlier generations go stale. For plugins, inside :func:`lease`."""
    offsets, total = [], 0
    for shape, dtype in parts:
        offsets.append(total)
        total += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // ALIGN) * ALIGN
    if total > arena._buffer.nbytes:
        arena._buffer = np.empty(max(total, 2 * arena._buffer.nbytes), dtype=np.uint8)
    arena._generation += 1
    views = []
    for (shape, dtype), offset in zip(parts, offsets):
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        views.append(arena._buffer[offset : offset + size].view(dtype).reshape(shape))
    return arena._generation, views


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class RowsTape:
    """Ragged rows: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    ``values`` is [total] or [total, width]; ``offsets`` is int64 [rows + 1] starting at 0.
    ``scales`` holds one float32 per value row when the rows are I8.
    """

    def __init__(
        self,
        values: np.ndarray,
        offsets: np.ndarray,
        scales: np.ndarray | None = None,
        *,
        arena: Arena | None = None,
        generation: int = 0,
    ) -> None:
        offsets = np.asarray(offsets)
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(values):
            raise ValueError("offsets must be 1-D, start at 0 and end at len(values)")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("offsets must not decrease")
        if scales is not None and len(scales) != len(values):
            raise ValueError(f"scales must hold one value per row of values ({len(values)}), got {len(scales)}")
        self._values, self._offsets, self._scales = values, offsets, scales
        self._arena, self._generation = arena, generation

    @classmethod
    def from_numpy(cls, values: np.ndarray, offsets: np.ndarray, scales: np.ndarray | None = None) -> RowsTape:
        """A tape over numpy arrays (no arena), e.g. the ``to_numpy()`` of another tape."""
        given = np.asarray(offsets)
        if given.size and given.dtype.kind not in "iu":  # 1.9 would be cut to 1, silently moving a row's end
            raise TypeError(f"offsets must be integers, got {given.dtype}")
        return cls(np.asarray(values), given.astype(np.int64), scales)

    def _live(self) -> None:
        if self._arena is not None:
            self._arena._check(self._generation)

    @property
    def values(self) -> np.ndarray:
        self._live()
        return _readonly(self._values)

    @property
    def offsets(self) -> np.ndarray:
        self._live()
        return _readonly(self._offsets)

    @property
    def scales(self) -> np.ndarray | None:
        self._live()
        return None if self._scales is None else _readonly(self._scales)

    @property
    def lengths(self) -> np.ndarray:
        """Values per row."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"a tape's rows are indexed by an int, got {type(i).__name__}; to_numpy() gives values and offsets to slice")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        i %= n
        offsets = self.offsets
        return self.values[offsets[i] : offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    def to_numpy(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of ``(values, offsets)``, independent of the arena."""
        return np.array(self.values), np.array(self.offsets)

    def __repr__(self) -> str:
        return f"RowsTape(rows={len(self)}, values={self._values.shape}, dtype={self._values.dtype})"


class Encoded:
    """What an encode call wrote into its arena: embeddings and, if asked, token vectors.

    ``embeddings`` is [items, dimensions] in ``scalar`` (B1: [items, ceil(dimensions / 8)]
    uint8; I8 with ``embedding_scales``); ``tokens`` is a :class:`RowsTape` of
    ``token_width``-wide rows, one row per token, or None when tokens were not asked for.
    """

    def __init__(
        self,
        arena: Arena,
        generation: int,
        scalar: Scalar,
        embeddings: np.ndarray | None,
        embedding_scales: np.ndarray | None,
        tokens: RowsTape | None,
        count: int,
    ) -> None:
        self._arena, self._generation = arena, generation
        self.scalar = scalar
        self._embeddings, self._scales, self._tokens, self._count = embeddings, embedding_scales, tokens, count

    def _live(self) -> None:
        self._arena._check(self._generation)

    @property
    def embeddings(self) -> np.ndarray:
        self._live()
        if self._embeddings is None:
            raise ValueError("embeddings were not asked for: pass outputs=Outputs.EMBEDDINGS")
        return _readonly(self._embeddings)

    @property
    def embedding_scales(self) -> np.ndarray | None:
        """Per-row scales of I8 embeddings, None for other scalars."""
        self._live()
        return None if self._scales is None else _readonly(self._scales)

    @property
    def tokens(self) -> RowsTape | None:
        self._live()
        return self._tokens

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"Encoded(items={self._count}, scalar={self.scalar.name})"
