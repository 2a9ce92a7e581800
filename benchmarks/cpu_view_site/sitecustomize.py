"""Turns the CPUID view on at the start of every Python process of a benchmark run under
``benchmarks/cpu_view.py`` (which puts this folder first on ``PYTHONPATH``), before any
library asks the CPU what it runs; then hands over to the ``sitecustomize`` this one hides."""

from __future__ import annotations

import ctypes
import errno
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

VIEW = "UFORM_CPUID_VIEW"  # the class the processes see, set by benchmarks/cpu_view.py
LIBRARY = "UFORM_CPUID_VIEW_LIBRARY"  # set here: the library that answers, for the benchmarks' reports
LEVELS = {"x86-64-v3": 3, "x86-64-v4": 4, "x86-64-v4+vnni+bf16": 5}  # 5: AMX hidden, nothing else


def library() -> Path:
    """``uform/_cpuid_view*.so``, found without importing uform (whose imports ask the CPU)."""
    spec = importlib.util.find_spec("uform")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if (path := Path(folder) / f"_cpuid_view{suffix}").is_file():
                return path
    raise SystemExit(f"cpu_view: uform's _cpuid_view library is not built beside {folders or 'uform (not installed)'}: install the package (pip install -e .) on Linux x86-64")


def turn_on(view: str) -> None:
    if view not in LEVELS:
        raise SystemExit(f"cpu_view: {VIEW}={view!r} names no view: one of {', '.join(LEVELS)}")
    path = library()
    failed = ctypes.CDLL(str(path)).uform_cpuid_view(LEVELS[view])
    if failed == errno.ENODEV:
        raise SystemExit("cpu_view: this CPU or kernel has no CPUID faulting (no cpuid_fault in /proc/cpuinfo's flags): measure on a machine of that class instead")
    if failed:
        raise SystemExit(f"cpu_view: turning the view on failed: {os.strerror(failed)}")
    os.environ[LIBRARY] = str(path)


def hand_over() -> None:
    """Runs the next ``sitecustomize`` on the path, as Python would have without this one."""
    here = Path(__file__).parent.resolve()
    rest = [p for p in sys.path if Path(p or ".").resolve() != here]
    spec = importlib.machinery.PathFinder.find_spec(__name__, rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get(VIEW):
    turn_on(os.environ[VIEW])
hand_over()
