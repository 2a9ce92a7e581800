"""One verb's queue and the worker threads that coalesce it: one verb call per batch of requests.

A worker takes what is queued when it is free, up to the item and cost budgets (a job larger
than a budget runs alone), so an idle server adds no wait. The call runs on the worker's own
thread with its own arena, and its rows are copied out before any job's future is set. A
bad item (``InputError``) fails only the job holding it: the rest is called again together
once, and past a second bad job each on its own (so a good item is computed at most 3 times).
"""

from __future__ import annotations

import asyncio
import bisect
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from uform import Arena, InputError

from .errors import ApiError, bad_item
from .metrics import Metrics

WHOLE_CALLS = 2  # calls of a batch's good jobs together; past them, each job is called alone
# rows of every item of a batch in one array, or a choose batch's (values, offsets)
Verb = Callable[[list[Any], Arena], Any]


class Counted:
    """Rows of texts and each text's tokens in the model's own tokenizer (what ``usage`` counts
    for a model that has one; a byte-level model's tokens are the bytes, counted from the request)."""

    __slots__ = ("rows", "tokens")

    def __init__(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        self.rows, self.tokens = rows, tokens


class Job:
    """One request's items for one verb; ``positions`` are their indices in the request."""

    __slots__ = ("payloads", "positions", "cost", "future", "enqueued", "started", "finished", "batch_items")

    def __init__(self, payloads: list[Any], positions: np.ndarray, cost: int, future: asyncio.Future[Any]) -> None:
        self.payloads, self.positions, self.cost, self.future = payloads, positions, cost, future
        self.enqueued = time.perf_counter()
        self.started = self.finished = 0.0
        self.batch_items = 0


class Depth:
    """Items queued in every lane of a server, kept by the lanes (read at each admission)."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items = 0


@dataclass(frozen=True)
class Budget:
    items: int
    cost: int
    window: float  # seconds a free worker waits for more after the first job (0: none)


class Lane:
    """One verb's queue and its worker threads (at most ``workers``, started as work arrives).

    The queue is shared with the threads under a lock: a thread that finishes a call takes
    what is queued right away (no trip through the event loop between batches), sleeps when
    the queue is empty, and is woken by :meth:`put`. Each batch's outcomes come back to the
    loop in one ``call_soon_threadsafe``, which answers every job's future there.
    """

    def __init__(self, verb: str, call: Verb, budget: Budget, metrics: Metrics, workers: int = 1, param: str = "input",
                 depth: Depth | None = None, nice: int = 0) -> None:  # fmt: skip
        self.verb = verb
        self.depth = depth or Depth()
        self._call = call
        self._budget = budget
        self._metrics = metrics
        self._param = param
        self._loop = asyncio.get_running_loop()
        self._queue: deque[Job] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._idle = 0  # threads waiting for work
        self._threads = 0  # threads started and not ended
        self._workers = workers
        self._nice = nice  # added to each worker thread's nice value as it starts
        self._ended: asyncio.Future[None] | None = None  # resolved when the last thread ends after close
        self.queued_items = 0
        self.running = 0  # verb calls in flight

    def put(self, job: Job) -> None:
        n = len(job.payloads)
        with self._lock:
            self._queue.append(job)
            self.queued_items += n
            self.depth.items += n
            if self._idle:
                self._wake.notify()
                return
            if self._threads >= self._workers:
                return
            self._threads += 1
        threading.Thread(target=self._run, name=f"uform-lane-{self.verb}", daemon=True).start()

    def discard(self, job: Job) -> bool:
        """Drop a job still queued (its client went away); False when it already left the queue."""
        with self._lock:
            try:
                self._queue.remove(job)
            except ValueError:
                return False
            self._count_out(len(job.payloads))
        self._metrics.dropped.labels(self.verb).inc(len(job.payloads))
        return True

    async def close(self) -> None:
        """Answer every queued job, then stop the workers."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
            if not self._threads:
                return
            self._ended = self._loop.create_future()
        await asyncio.shield(self._ended)

    def _count_out(self, n: int) -> None:
        self.queued_items -= n
        self.depth.items -= n

    def _take(self, jobs: list[Job], items: int, cost: int) -> tuple[int, int]:
        """Move queued jobs into ``jobs`` within the budgets (with the lock held)."""
        queue = self._queue
        while queue:
            job = queue[0]
            n = len(job.payloads)
            if jobs and (items + n > self._budget.items or cost + job.cost > self._budget.cost):
                break
            queue.popleft()
            self._count_out(n)
            jobs.append(job)
            items, cost = items + n, cost + job.cost
        return items, cost

    def _run(self) -> None:
        """A worker thread: batches from the queue until the lane closes and the queue is empty."""
        arena = Arena()
        window = self._budget.window
        if self._nice:
            lower_priority([threading.get_native_id()], self._nice)
        try:
            while True:
                jobs: list[Job] = []
                with self._lock:
                    while not self._queue:
                        if self._closing:
                            return
                        self._idle += 1
                        self._wake.wait()
                        self._idle -= 1
                    items, cost = self._take(jobs, 0, 0)  # the first job at least
                    self.running += 1
                if window > 0 and items < self._budget.items:
                    time.sleep(window)
                    with self._lock:
                        items, cost = self._take(jobs, items, cost)
                started = time.perf_counter()
                try:
                    outcomes = self._outcomes(jobs, arena)
                except Exception as exc:  # noqa: BLE001 - a bug here fails the batch's requests, never leaves them waiting
                    outcomes = [ApiError(500, f"{self.verb} failed: {type(exc).__name__}: {exc}", code="verb_failed")] * len(jobs)
                finally:
                    with self._lock:
                        self.running -= 1
                self._post(self._answer, jobs, outcomes, started, time.perf_counter(), items)
        finally:
            with self._lock:
                self._threads -= 1
                last = self._closing and not self._threads
            if last:
                self._post(self._end)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the event loop (nothing when the loop has closed)."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass

    def _end(self) -> None:
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)

    def _answer(self, jobs: list[Job], outcomes: list[Any], started: float, finished: float, items: int) -> None:
        """Each job's outcome into its future (on the loop), and the batch's figures."""
        waited = []
        for job, outcome in zip(jobs, outcomes):
            job.started, job.finished, job.batch_items = started, finished, items
            waited.append(started - job.enqueued)
            future = job.future
            if future.done():  # its client went away during the call
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        self._metrics.batch(self.verb, items, len(jobs), finished - started, waited)

    def _outcomes(self, jobs: Sequence[Job], arena: Arena) -> list[Any]:
        """Each job's rows, or its failure. A call refused for a bad item fails the job holding
        it; the others are called again whole once, and past a second bad job each on its own, so
        a good item is computed at most ``WHOLE_CALLS + 1`` times however many jobs are bad."""
        outcomes: list[Any] = [None] * len(jobs)
        alive = list(range(len(jobs)))
        for _ in range(WHOLE_CALLS):
            if not alive or self._call_jobs(jobs, alive, arena, outcomes):
                return outcomes
        for j in alive:  # past the second bad job: each alone, its bad item failing only itself
            self._call_jobs(jobs, [j], arena, outcomes)
        return outcomes

    def _call_jobs(self, jobs: Sequence[Job], alive: list[int], arena: Arena, outcomes: list[Any]) -> bool:
        """One verb call of the jobs ``alive`` (indices into ``jobs``), their outcomes set; False
        when it was refused for a bad item: its job is failed and taken out of ``alive``."""
        sizes = [len(jobs[j].payloads) for j in alive]
        starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        payloads = jobs[alive[0]].payloads if len(alive) == 1 else list(chain.from_iterable([jobs[j].payloads for j in alive]))
        self._metrics.called_items.labels(self.verb).inc(len(payloads))
        try:
            result = self._call(payloads, arena)
        except InputError as exc:
            at = bisect.bisect_right(starts, exc.index) - 1
            job = jobs[alive[at]]
            outcomes[alive.pop(at)] = bad_item(int(job.positions[exc.index - starts[at]]), exc.reason, param=self._param)
            self._metrics.failed.labels(self.verb).inc()
            return False
        except Exception as exc:  # noqa: BLE001 - an error of the verb fails its batch's requests, not the server
            failure = ApiError(500, f"{self.verb} failed: {type(exc).__name__}: {exc}", code="verb_failed")
            for j in alive:
                outcomes[j] = failure
            return True
        for j, start, stop in zip(alive, starts[:-1], starts[1:]):
            outcomes[j] = split(result, start, stop)
        return True


def lower_priority(threads: Sequence[int], nice: int) -> None:
    """Add ``nice`` to the nice value of each of ``threads`` (Linux thread ids), at most 19; a
    thread that has ended, or a system without per-thread priorities, is skipped. Threads a
    thread starts afterwards inherit its value."""
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except (OSError, AttributeError):  # ended, not permitted, or not POSIX
            pass


def split(result: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a batch's copied result (an array, texts' rows with their tokens
    (:class:`Counted`), or a choose ``(values, offsets)``)."""
    if isinstance(result, Counted):
        return Counted(result.rows[start:stop], result.tokens[start:stop])
    if isinstance(result, tuple):
        values, offsets = result
        return values[offsets[start] : offsets[stop]], offsets[start : stop + 1] - offsets[start]
    return result[start:stop]
