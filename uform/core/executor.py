"""Executors: the threads a model's calls use, and receivers that run verbs on them.

An :class:`Executor` is a thread budget. ONNX Runtime sessions created by a load use
``threads`` intra-op threads; decoding and preprocessing fan out over a pool of the same
size; :meth:`Executor.submit` runs whole calls for ``Model.deferred``.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Executor:
    """Threads for ONNX Runtime's intra-op work and for decoding and preprocessing.

    ``threads`` defaults to the cores this process may run on. ``calls`` bounds how many
    deferred calls run at once (default 1: calls queue in order). Use as a context manager,
    or call :meth:`close`, to join the threads.
    """

    def __init__(self, threads: int | None = None, *, calls: int = 1) -> None:
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"Executor threads must be a positive integer, got {threads!r}")
        if not isinstance(calls, int) or calls < 1:
            raise ValueError(f"Executor calls must be a positive integer, got {calls!r}")
        self.threads = threads or available_cores()
        self.calls = calls
        self._lock = threading.Lock()
        self._workers: cf.ThreadPoolExecutor | None = None
        self._dispatch: cf.ThreadPoolExecutor | None = None
        self._prefetch: cf.ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"Executor(threads={self.threads}, calls={self.calls})"

    def _pool(self, attr: str, size: int, prefix: str) -> cf.ThreadPoolExecutor:
        with self._lock:
            pool: cf.ThreadPoolExecutor | None = getattr(self, attr)
            if pool is None:
                pool = cf.ThreadPoolExecutor(size, thread_name_prefix=prefix)
                setattr(self, attr, pool)
            return pool

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(x) for x in items]`` over the worker threads; the first error propagates."""
        items = list(items)
        if len(items) <= 1 or self.threads == 1:
            return [fn(x) for x in items]
        return list(self._pool("_workers", self.threads, "uform-work").map(fn, items))

    def prefetch(self, fn: Callable[[], R]) -> cf.Future[R]:
        """Run ``fn`` on the prefetch thread, to prepare the next batch while one computes."""
        return self._pool("_prefetch", 1, "uform-prefetch").submit(fn)

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Deferred[R]:
        """Run a whole call on the dispatch threads and answer a :class:`Deferred`."""
        return Deferred(self._pool("_dispatch", self.calls, "uform-call").submit(fn, *args, **kwargs))

    def close(self) -> None:
        """Wait for running work and join every thread."""
        with self._lock:
            pools = [p for p in (self._dispatch, self._prefetch, self._workers) if p is not None]
            self._dispatch = self._prefetch = self._workers = None
        for pool in pools:
            pool.shutdown(wait=True)

    def __enter__(self) -> Executor:
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
    """A receiver whose verbs run with ``executor`` and block until done (``model.on(ex)``)."""

    def __init__(self, target: T, executor: Executor) -> None:
        self._target = target
        self._executor = executor

    def __getattr__(self, name: str) -> Callable[..., Any]:
        verb = getattr(self._target, "_bound_verb")(name, self._executor)
        return verb  # type: ignore[no-any-return]


class DeferredOn(Generic[T]):
    """A receiver whose verbs are submitted to ``executor`` and answer a :class:`Deferred`."""

    def __init__(self, target: T, executor: Executor) -> None:
        self._target = target
        self._executor = executor

    def __getattr__(self, name: str) -> Callable[..., Deferred[Any]]:
        verb = getattr(self._target, "_bound_verb")(name, self._executor)

        def submit(*args: Any, **kwargs: Any) -> Deferred[Any]:
            return self._executor.submit(verb, *args, **kwargs)

        return submit
