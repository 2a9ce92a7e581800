"""Batches whose items are prepared in the executor's threads: decoding, resampling, fitting.

A media verb knows how to prepare one item (decode a file, resample a buffer) and how to
stack prepared items into the tower's feeds. :class:`ItemBatches` cuts a call into batches
of at most ``rows`` items whose thunks map that preparation over the executor's threads.
The shared loop (:func:`uform.core.pipeline.run_batches`) builds batch ``k + 1`` on the
call's look-ahead thread while batch ``k`` computes, so most of :attr:`ItemBatches.seconds`
hides behind compute; when the call fails, the batch being built is waited for before the
error propagates, and items not yet started are never prepared (:meth:`Executor.map`). Thunks are built one at a time, never concurrently, so the tallies a verb
keeps in ``tally`` need no lock.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from .pipeline import Batch

if TYPE_CHECKING:
    from .runtime import Call

T = TypeVar("T")


class ItemBatches(Generic[T]):
    """Batch thunks over items ``0 … count - 1``.

    ``prepare(i)`` makes item ``i`` (in the executor's threads; an :class:`~uform.InputError`
    it raises fails the call before anything is written), ``stack(prepared)`` turns a batch's
    prepared items into the tower's feeds, and ``tally(prepared)`` counts what they took
    (statistics) before they are dropped: nothing prepared outlives its batch. ``inputs`` and
    ``ranges`` go into every :class:`Batch` as they are: what the feeds are, and the values the
    tower documents for its float feeds (which decide whom a non-finite output blames).
    """

    def __init__(
        self,
        call: Call,
        prepare: Callable[[int], T],
        stack: Callable[[list[T]], dict[str, np.ndarray]],
        tally: Callable[[list[T]], None] = lambda prepared: None,
        *,
        inputs: str,
        ranges: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        self.call, self.prepare, self.stack, self.tally = call, prepare, stack, tally
        self.inputs, self.ranges = inputs, dict(ranges or {})
        self.seconds = 0.0  # wall time spent building batches

    def thunks(self, count: int, rows: int) -> list[Callable[[], Batch]]:
        """One thunk per run of at most ``rows`` consecutive items."""
        return [functools.partial(self._build, np.arange(s, min(s + rows, count))) for s in range(0, count, max(rows, 1))]

    def _build(self, indices: np.ndarray) -> Batch:
        started = time.perf_counter()
        prepared = self.call.executor.map(self.prepare, indices.tolist())
        batch = Batch(indices, self.stack(prepared), ranges=self.ranges, inputs=self.inputs)
        self.tally(prepared)
        self.seconds += time.perf_counter() - started
        return batch
