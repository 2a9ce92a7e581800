"""Helpers shared by the benchmarks: timing, machine facts, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("UFORM_BENCHMARK_RESULTS") or Path(__file__).parent / "results")  # the env var: for smoke runs


def rate(fn: Callable[[], Any], items: int, seconds: float = 2.0, warmup: int = 1, runs: int = 0) -> float:
    """Items per second of ``fn`` (which handles ``items`` items a call): the best of runs
    filling ``seconds`` after ``warmup`` runs, and at least ``runs`` of them; with ``runs`` 0, a
    warm-up slower than ``seconds`` is the answer (first-call costs included)."""
    for _ in range(warmup):
        t = time.perf_counter()
        fn()
        took = time.perf_counter() - t
        if took > seconds and runs == 0:
            return items / took
    best, spent, done = float("inf"), 0.0, 0
    while spent < seconds or done < max(runs, 1):
        t = time.perf_counter()
        fn()
        took = time.perf_counter() - t
        best, spent, done = min(best, took), spent + took, done + 1
    return items / best


def latency(fn: Callable[[], Any], seconds: float) -> float:
    """Median seconds of ``fn`` over runs filling ``seconds`` (at least 5, after one warm-up)."""
    fn()
    times: list[float] = []
    while sum(times) < seconds or len(times) < 5:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(statistics.median(times))


def cpu_peak_gflops() -> tuple[float, str]:
    """FP32 peak of this CPU from its flags and clock: cores x FLOP/cycle x GHz."""
    flags, mhz = set(), 0.0
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            if key.strip() == "cpu MHz" and not mhz:
                mhz = float(value)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    per_cycle = 64 if "avx512f" in flags else 32 if "fma" in flags else 16  # 2 FMA ports x lanes x 2
    ghz = mhz / 1000 or 2.5
    return cores * per_cycle * ghz, f"{cores} cores x {per_cycle} FP32 FLOP/cycle x {ghz:.2f} GHz ({platform.processor() or platform.machine()})"


def cpu_view() -> dict[str, Any] | None:
    """The CPUID view this process runs in (``benchmarks/cpu_view.py``): the class its libraries
    see and how many ``cpuid`` instructions the view answered so far; None outside one."""
    view, library = os.environ.get("UFORM_CPUID_VIEW"), os.environ.get("UFORM_CPUID_VIEW_LIBRARY")
    if not view or not library:
        return None
    import ctypes

    answer = ctypes.CDLL(library).uform_cpuid_view_answered
    answer.restype = ctypes.c_long
    return {"class": view, "cpuid_answered": int(answer())}


def describe_view(view: dict[str, Any] | None) -> str:
    """A line saying what the libraries of this process saw of the CPU."""
    if view is None:
        return "CPUID: this machine's own (no view)"
    return f"CPUID view: {view['class']} (every library of these processes sees that class; {view['cpuid_answered']} cpuid answered here)"


def save(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
