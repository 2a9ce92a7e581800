"""Executors: the threads a model's calls use, and receivers that run verbs on them.

An :class:`Executor` is a thread budget. ONNX Runtime sessions created by a load use
``threads`` intra-op threads; decoding and preprocessing fan out over a pool of the same
size; :meth:`Executor.submit` runs whole calls for ``Model.deferred``. Each call prepares
its next batch on a look-ahead thread of its own (:class:`Prefetcher`), so concurrent calls
never queue behind one another's preparation, and nothing a call started outlives it.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


MAX_THREADS = 1024
"""The most ``threads`` (and ``calls``) an :class:`Executor` takes: more than any CPU has cores.
ONNX Runtime's spinning intra-op threads past it made a load take seconds and its close hang
(4,096 threads on 2 cores: minutes)."""


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise ValueError(f"Executor {name} must be an integer from 1 to {MAX_THREADS}, got {value!r}")


def check_executor(executor: object) -> None:
    """TypeError unless ``executor`` is an :class:`Executor` (a load's, ``on``'s, ``deferred``'s)."""
    if not isinstance(executor, Executor):
        raise TypeError(f"executor must be a uform.Executor, got {type(executor).__name__}")


class Executor:
    """Threads for ONNX Runtime's intra-op work and for decoding and preprocessing.

    ``threads`` defaults to the cores this process may run on. ``calls`` bounds how many
    deferred calls run at once (default 1: calls queue in order). Use as a context manager,
    or call :meth:`close`, to join the threads.
    """

    def __init__(self, threads: int | None = None, *, calls: int = 1) -> None:
        if threads is not None:
            _check_count("threads", threads)
        _check_count("calls", calls)
        self.threads = threads or available_cores()
        self.calls = calls
        self._lock = threading.Lock()
        self._workers: cf.ThreadPoolExecutor | None = None
        self._dispatch: cf.ThreadPoolExecutor | None = None
        self._pid = os.getpid()  # the process whose threads the pools hold

    def __repr__(self) -> str:
        return f"Executor(threads={self.threads}, calls={self.calls})"

    def _forget_a_parents_pools(self) -> None:
        """In a child of ``os.fork`` the pools' threads are not there: work given them waited
        forever and ``close`` hung joining them, and the lock may have been held by another thread
        at the fork. The child drops them (the parent's are the parent's) and starts its own."""
        if self._pid != os.getpid():
            self._lock, self._workers, self._dispatch, self._pid = threading.Lock(), None, None, os.getpid()

    def _pool(self, attr: str, size: int, prefix: str) -> cf.ThreadPoolExecutor:
        self._forget_a_parents_pools()
        with self._lock:
            pool: cf.ThreadPoolExecutor | None = getattr(self, attr)
            if pool is None:
                pool = cf.ThreadPoolExecutor(size, thread_name_prefix=prefix)
                setattr(self, attr, pool)
            return pool

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(x) for x in items]`` over the worker threads; the first error (in item order)
        propagates once no item is running any more: items not started are cancelled, items
        running are waited for, so no ``fn`` outlives the call."""
        items = list(items)
        if len(items) <= 1 or self.threads == 1:
            return [fn(x) for x in items]
        pool = self._pool("_workers", self.threads, "uform-work")
        futures = [pool.submit(fn, x) for x in items]
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()
            cf.wait(futures)

    def prefetcher(self) -> Prefetcher:
        """A look-ahead thread for one call (use it as a context manager)."""
        return Prefetcher()

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Deferred[R]:
        """Run a whole call on the dispatch threads and answer a :class:`Deferred`."""
        return Deferred(self._pool("_dispatch", self.calls, "uform-call").submit(fn, *args, **kwargs))

    def close(self) -> None:
        """Wait for running work and join every thread."""
        self._forget_a_parents_pools()
        with self._lock:
            pools = [p for p in (self._dispatch, self._workers) if p is not None]
            self._dispatch = self._workers = None
        for pool in pools:
            pool.shutdown(wait=True)

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Prefetcher:
    """One call's look-ahead thread: prepares batch ``k + 1`` while batch ``k`` computes.

    Each call gets its own (concurrent calls never wait for each other's preparation), made
    on the first :meth:`submit`. Leaving the ``with`` block, however the call ends (a result,
    an error, a cancellation), cancels work not yet started and waits for work running,
    retrieving its error, so nothing the call started reads the caller's inputs afterwards.
    """

    def __init__(self) -> None:
        self._pool: cf.ThreadPoolExecutor | None = None
        self._futures: list[cf.Future[Any]] = []

    def submit(self, fn: Callable[[], R]) -> cf.Future[R]:
        """Run ``fn`` on this call's look-ahead thread."""
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="uform-prefetch")
        future = self._pool.submit(fn)
        # only what may still run is kept for close(): a finished future holds its batch (the
        # stacked feeds), so keeping them all held every batch of the call until it ended
        self._futures = [f for f in self._futures if not f.done()] + [future]
        return future

    def close(self) -> None:
        """Cancel what has not started, wait for what runs, join the thread."""
        for f in self._futures:
            f.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for f in self._futures:
            if not f.cancelled():
                f.exception()  # retrieved: an abandoned batch's error goes with it
        self._pool, self._futures = None, []

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Deferred(Generic[R]):
    """The answer of a verb called through ``model.deferred(executor)``."""

    def __init__(self, future: cf.Future[R]) -> None:
        self._future = future

    def result(self, timeout: float | None = None) -> R:
        """Block until the call ends; answer its result or raise its error."""
        return self._future.result(timeout)

    def done(self) -> bool:
        """Whether the call has ended, either way."""
        return self._future.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block until the call ends; answer its error, or None when it succeeded."""
        return self._future.exception(timeout)


class On(Generic[T]):
    """A receiver whose verbs run with an executor and block until done (``model.on(ex)``).

    ``verb`` answers the receiver's verb of a name, already bound to the executor, and raises
    ``AttributeError`` for a name that is no verb; ``T`` is what it answers for (``Model``).
    """

    def __init__(self, verb: Callable[[str], Callable[..., Any]]) -> None:
        self._verb = verb

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return self._verb(name)


class DeferredOn(Generic[T]):
    """A receiver whose verbs are submitted to ``executor`` and answer a :class:`Deferred`
    (``verb`` as for :class:`On`)."""

    def __init__(self, verb: Callable[[str], Callable[..., Any]], executor: Executor) -> None:
        self._verb = verb
        self._executor = executor

    def __getattr__(self, name: str) -> Callable[..., Deferred[Any]]:
        verb = self._verb(name)

        def submit(*args: Any, **kwargs: Any) -> Deferred[Any]:
            return self._executor.submit(verb, *args, **kwargs)

        return submit
