"""One verb's queue and the workers that coalesce it: one verb call per batch of requests.

A worker takes what is queued when it is free, up to the item and cost budgets (a job larger
than a budget runs alone), so an idle server adds no wait. The call runs on a worker thread
with the lane's own arena, and its rows are copied out before any job's future is set. A
bad item (``InputError``) fails only the job holding it, and the rest is called again.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures as cf
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uform import Arena, InputError

from .errors import ApiError, bad_item
from .metrics import Metrics

# rows of every item of a batch in one array, or a choose batch's (values, offsets)
Verb = Callable[[list[Any], Arena], Any]


@dataclass(eq=False)
class Job:
    """One request's items for one verb; ``positions`` are their indices in the request."""

    payloads: list[Any]
    positions: np.ndarray
    cost: int
    future: asyncio.Future[Any]
    enqueued: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    finished: float = 0.0
    batch_items: int = 0
    gone: Callable[[], bool] | None = None  # whether its client has disconnected


@dataclass(frozen=True)
class Budget:
    items: int
    cost: int
    window: float  # seconds a free worker waits for more after the first job (0: none)


class Lane:
    def __init__(self, verb: str, call: Verb, budget: Budget, pool: cf.Executor, metrics: Metrics, workers: int = 1, param: str = "input") -> None:
        self.verb = verb
        self._call = call
        self._budget = budget
        self._pool = pool
        self._metrics = metrics
        self._param = param
        self._queue: deque[Job] = deque()
        self._ready = asyncio.Event()
        self._closing = False
        self.queued_items = 0
        self.running = 0  # verb calls in flight
        self._count = threading.Lock()
        self._tasks = [asyncio.get_running_loop().create_task(self._work(), name=f"uform-lane-{verb}") for _ in range(workers)]

    def put(self, job: Job) -> None:
        self._queue.append(job)
        self.queued_items += len(job.payloads)
        self._ready.set()

    def discard(self, job: Job) -> bool:
        """Drop a job still queued (its client went away); False when it already left the queue."""
        try:
            self._queue.remove(job)
        except ValueError:
            return False
        self.queued_items -= len(job.payloads)
        self._metrics.dropped.labels(self.verb).inc(len(job.payloads))
        return True

    async def close(self) -> None:
        """Answer every queued job, then stop the workers."""
        self._closing = True
        self._ready.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _take(self, jobs: list[Job], items: int, cost: int) -> tuple[int, int]:
        """Move queued jobs into ``jobs`` within the budgets; drop those whose client is gone."""
        while self._queue:
            job = self._queue[0]
            n = len(job.payloads)
            if job.gone is not None and job.gone():
                self.discard(job)
                if not job.future.done():
                    job.future.set_exception(ConnectionError("the client went away"))
                continue
            if jobs and (items + n > self._budget.items or cost + job.cost > self._budget.cost):
                break
            self._queue.popleft()
            self.queued_items -= n
            jobs.append(job)
            items, cost = items + n, cost + job.cost
        return items, cost

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        arena = Arena()
        while True:
            while not self._queue:
                if self._closing:
                    return
                self._ready.clear()
                await self._ready.wait()
            jobs: list[Job] = []
            items, cost = self._take(jobs, 0, 0)
            if self._budget.window > 0 and items < self._budget.items:
                await asyncio.sleep(self._budget.window)
                items, cost = self._take(jobs, items, cost)
            started = time.perf_counter()
            outcomes = await loop.run_in_executor(self._pool, self._compute, jobs, arena)
            finished = time.perf_counter()
            m = self._metrics
            m.child(m.batch_items, self.verb).observe(items)
            m.child(m.batch_requests, self.verb).observe(len(jobs))
            m.child(m.inference_seconds, self.verb).observe(finished - started)
            waited = m.child(m.queue_seconds, self.verb)
            for job, outcome in zip(jobs, outcomes):
                job.started, job.finished, job.batch_items = started, finished, items
                waited.observe(started - job.enqueued)
                if job.future.done():  # its client went away during the call
                    continue
                if isinstance(outcome, BaseException):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)

    def _compute(self, jobs: Sequence[Job], arena: Arena) -> list[Any]:
        """Each job's rows, or the error that fails it (a worker thread). ``running`` counts
        the calls whose threads are still in a verb, even when their awaiting task was cancelled."""
        with self._count:
            self.running += 1
        try:
            return self._outcomes(jobs, arena)
        finally:
            with self._count:
                self.running -= 1

    def _outcomes(self, jobs: Sequence[Job], arena: Arena) -> list[Any]:
        outcomes: list[Any] = [None] * len(jobs)
        alive = list(range(len(jobs)))
        while alive:
            sizes = [len(jobs[j].payloads) for j in alive]
            starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
            payloads = [p for j in alive for p in jobs[j].payloads]
            try:
                result = self._call(payloads, arena)
            except InputError as exc:
                at = bisect.bisect_right(starts, exc.index) - 1
                job = jobs[alive[at]]
                outcomes[alive.pop(at)] = bad_item(int(job.positions[exc.index - starts[at]]), exc.reason, param=self._param)
                self._metrics.failed.labels(self.verb).inc()
                continue
            except Exception as exc:  # noqa: BLE001 - an error of the verb fails its batch's requests, not the server
                failure = ApiError(500, f"{self.verb} failed: {type(exc).__name__}: {exc}", code="verb_failed")
                for j in alive:
                    outcomes[j] = failure
                break
            for j, start, stop in zip(alive, starts[:-1], starts[1:]):
                outcomes[j] = split(result, start, stop)
            break
        return outcomes


def split(result: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a batch's copied result (an array, or a choose ``(values, offsets)``)."""
    if isinstance(result, tuple):
        values, offsets = result
        return values[offsets[start] : offsets[stop]], offsets[start : stop + 1] - offsets[start]
    return result[start:stop]
