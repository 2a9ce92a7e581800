"""What the cpu and cuda backends share: session options from the executor, and replicas.

:class:`Replicas` is a runner over several sessions of one tower (one per GPU, or one per
NUMA domain). A call goes whole to the least-busy replica; a call with enough rows is cut
into contiguous row ranges that run on several replicas at once, and the outputs are
concatenated in order, so callers see exactly what one session would answer.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from uform.core.plugin import Runner

T = TypeVar("T")
MIN_ROWS = 8  # rows one replica gets at least when a call is split


def session_options(threads: int, affinity: Iterable[int] | None = None) -> Any:
    """Intra-op threads from the executor, one inter-op thread, no spinning while idle.

    With ``affinity`` (CPU ids), each of ONNX Runtime's ``threads - 1`` worker threads is
    pinned to that set (``session.intra_op_thread_affinities``, which counts processors
    from 1); the remaining share of the work runs on the thread that calls ``run``.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if affinity is not None and threads > 1:
        so.add_session_config_entry("session.intra_op_thread_affinities", affinity_string(affinity, threads))
    so.log_severity_level = 3
    return so


def ort_values(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """ONNX Runtime values over ``arrays`` without a copy (float8 arrays by their ONNX type:
    numpy feeds of them are refused), for feeds and in-memory initializers."""
    import ml_dtypes
    import onnxruntime as ort
    from onnx import TensorProto

    values = {}
    for name, array in arrays.items():
        if array.dtype == ml_dtypes.float8_e4m3fn:
            values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint8), TensorProto.FLOAT8E4M3FN)
        else:
            values[name] = ort.OrtValue.ortvalue_from_numpy(array)
    return values


class Fed:
    """A session whose big weights are graph inputs fed with every run (a
    :class:`~uform.core.plugin.Runner`); ``nbytes`` is what it holds."""

    def __init__(self, session: Any, weights: Mapping[str, np.ndarray], nbytes: int) -> None:
        self.session, self.weights, self.nbytes = session, ort_values(weights), nbytes

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(output_names, {**input_feed, **self.weights})  # type: ignore[no-any-return]


def affinity_string(cpus: Iterable[int], threads: int) -> str:
    """ONNX Runtime's affinity string: every worker thread may run on any of ``cpus``."""
    one = ",".join(str(c + 1) for c in sorted(set(cpus)))
    return ";".join([one] * (threads - 1))


def pin(cpus: Iterable[int] | None) -> None:
    """Restrict the calling thread to ``cpus`` where the platform allows (Linux)."""
    if cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))


def on_cpus(cpus: Iterable[int] | None, fn: Callable[[], T]) -> T:
    """``fn()`` on a short-lived thread pinned to ``cpus``: memory it first touches (ONNX
    Runtime's packed weights) is placed on those CPUs' NUMA node, and the caller's own
    affinity is left alone."""
    if cpus is None:
        return fn()
    chosen = list(cpus)
    with cf.ThreadPoolExecutor(1, thread_name_prefix="uform-place", initializer=pin, initargs=(chosen,)) as pool:
        return pool.submit(fn).result()


def rows_of(feed: Mapping[str, np.ndarray]) -> int:
    """The batch rows every feed shares along axis 0, or 0 when they do not share one."""
    counts = {a.shape[0] if a.ndim else -1 for a in feed.values()}
    return counts.pop() if len(counts) == 1 and min(counts) > 0 else 0


class Replicas:
    """A :class:`~uform.core.plugin.Runner` spreading calls over ``sessions``.

    ``affinities[i]``, when given, are the CPUs replica ``i`` runs on: its calls then run on
    threads pinned there (the replica's NUMA domain). Without, a whole call runs on the
    caller's thread and only split calls use the replicas' threads.
    """

    def __init__(
        self, sessions: Sequence[Runner], affinities: Sequence[Sequence[int] | None] | None = None, min_rows: int = MIN_ROWS
    ) -> None:
        if not sessions:
            raise ValueError("Replicas needs one session at least")
        self.sessions = list(sessions)
        self.affinities = list(affinities) if affinities is not None else [None] * len(self.sessions)
        self.min_rows = max(1, min_rows)
        self.busy = [0] * len(self.sessions)
        self.calls = [0] * len(self.sessions)  # calls (or parts of calls) each replica ran
        self._next = 0
        self._lock = threading.Lock()
        self._pools: list[cf.ThreadPoolExecutor | None] = [None] * len(self.sessions)

    def _acquire(self, k: int) -> list[int]:
        """The ``k`` least-busy replicas, ties broken round-robin; marked busy."""
        with self._lock:
            n = len(self.sessions)
            order = sorted(range(n), key=lambda i: (self.busy[i], (i - self._next) % n))[:k]
            self._next = (order[-1] + 1) % n
            for i in order:
                self.busy[i] += 1
                self.calls[i] += 1
            return order

    def _release(self, chosen: Iterable[int]) -> None:
        with self._lock:
            for i in chosen:
                self.busy[i] -= 1

    def _pool(self, i: int) -> cf.ThreadPoolExecutor:
        with self._lock:
            pool = self._pools[i]
            if pool is None:
                pool = cf.ThreadPoolExecutor(2, f"uform-replica{i}", initializer=pin, initargs=(self.affinities[i],))
                self._pools[i] = pool
            return pool

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """ONNX Runtime's ``run``: one replica, or row ranges over several, same answer."""
        rows = rows_of(input_feed)
        k = min(len(self.sessions), rows // self.min_rows) if rows else 1
        chosen = self._acquire(max(k, 1))
        try:
            if len(chosen) == 1:
                i = chosen[0]
                if self.affinities[i] is None:
                    return self.sessions[i].run(output_names, input_feed)
                return self._pool(i).submit(self.sessions[i].run, output_names, input_feed).result()
            bounds = np.linspace(0, rows, len(chosen) + 1).astype(np.int64)
            futures = [
                self._pool(i).submit(self.sessions[i].run, output_names, {n: a[lo:hi] for n, a in input_feed.items()})
                for i, lo, hi in zip(chosen, bounds[:-1], bounds[1:])
            ]
            cf.wait(futures)  # every part ends before an error propagates: no run outlives the call
            parts = [f.result() for f in futures]
            return [np.concatenate([p[j] for p in parts], axis=0) for j in range(len(parts[0]))]
        finally:
            self._release(chosen)

    def close(self) -> None:
        """Join the replicas' threads (they are also joined at interpreter exit)."""
        with self._lock:
            pools, self._pools = self._pools, [None] * len(self.sessions)
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True)
