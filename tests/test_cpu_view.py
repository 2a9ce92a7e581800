"""benchmarks/cpu_view.py: a command's Python processes see a lower x86-64 class (CPUID
faulting answered by uform's _cpuid_view library), so benchmarks can measure as on an
AVX2-only machine. Skipped where the CPU or kernel has no CPUID faulting."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from oplibrary import LIBRARY

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("cpu_view", BENCHMARKS / "cpu_view.py")  # not on sys.path: benchmarks/ray.py would hide ray
assert _spec is not None and _spec.loader is not None
cpu_view = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu_view)


def flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def built() -> bool:
    import uform

    return any(Path(uform.__file__).parent.glob("_cpuid_view*.so"))


FAULTING = sys.platform == "linux" and platform.machine() == "x86_64" and "cpuid_fault" in flags()
needs_faulting = pytest.mark.skipif(not FAULTING or not built(), reason="no CPUID faulting here (the cpuid_fault flag), or the view's library is not built")
PROBE = """
import json, numpy, os
from uform.plugins.cpu import machine_classes
from uform.plugins.oplib.library import OpLibraryError, library
from uform.plugins.e4m3 import variant_of
import common
features = numpy._core._multiarray_umath.__cpu_features__
classes = machine_classes()
try:
    runnable, refusal, variant = sorted(library().runnable), library().amx_refusal, variant_of(classes[-1])
except OpLibraryError:  # the op library not built here: nothing of it to ask
    runnable = refusal = variant = None
print(json.dumps({"numpy": {k: features.get(k) for k in ("AVX2", "FMA3", "AVX512F", "AVX512_SKX")},
                  "classes": [c.value for c in classes], "runnable": runnable, "amx_refusal": refusal, "variant": variant,
                  "view": common.cpu_view()}))
"""


def in_view(view: str, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), *filter(None, [os.environ.get("PYTHONPATH")])]), **env}
    command = [sys.executable, str(BENCHMARKS / "cpu_view.py"), view, "-c", code]
    return subprocess.run(command, env=base, capture_output=True, text=True, timeout=120)


def test_the_environment_a_view_starts_processes_with() -> None:
    env = cpu_view.environment("x86-64-v3", {"PYTHONPATH": "/a", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(cpu_view.SITE), "/a"]) and env["HOME"] == "/h"
    assert env["UFORM_CPUID_VIEW"] == env["UFORM_CPU_CLASS"] == "x86-64-v3"
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.cpu.hwcaps=-AVX512F,-AVX512CD,-AVX512BW,-AVX512DQ,-AVX512VL,-AVX512ER,-AVX512PF"
    v4 = cpu_view.environment("x86-64-v4", {})
    assert v4["PYTHONPATH"] == str(cpu_view.SITE) and "GLIBC_TUNABLES" not in v4


def test_a_view_it_does_not_know_is_refused() -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "cpu_view.py"), "x86-64-v2", "-c", "pass"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "usage: python benchmarks/cpu_view.py {x86-64-v3,x86-64-v4,x86-64-v4+vnni+bf16} SCRIPT" in done.stderr
    env = {**os.environ, "PYTHONPATH": str(cpu_view.SITE), "UFORM_CPUID_VIEW": "x86-64-v9"}
    done = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cpu_view: UFORM_CPUID_VIEW='x86-64-v9' names no view: one of x86-64-v3, x86-64-v4, x86-64-v4+vnni+bf16" in done.stderr
    assert "ran" not in done.stdout


@needs_faulting
def test_every_library_of_the_process_sees_x86_64_v3() -> None:
    done = in_view("x86-64-v3", PROBE)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["numpy"]["AVX2"] and seen["numpy"]["FMA3"] and not seen["numpy"]["AVX512F"] and not seen["numpy"]["AVX512_SKX"]
    assert seen["classes"] == ["x86-64-v2", "x86-64-v3"]  # /proc/cpuinfo capped by UFORM_CPU_CLASS
    assert seen["runnable"] == (None if LIBRARY is None else ["amx-model", "avx2", "avx2-split"])  # the op library asked the CPU itself
    assert seen["view"]["class"] == "x86-64-v3" and seen["view"]["cpuid_answered"] > 0


@needs_faulting
def test_the_v4_view_keeps_avx512_and_hides_what_came_after_it() -> None:
    if "avx512f" not in flags():
        pytest.skip("this CPU has no AVX-512: the x86-64-v4 view would hide nothing it has")
    done = in_view("x86-64-v4", PROBE)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["numpy"]["AVX512F"] and seen["numpy"]["AVX512_SKX"]
    assert seen["classes"][-1] == "x86-64-v4" and seen["runnable"] == (None if LIBRARY is None else ["amx-model", "avx2", "avx2-split", "avx512"])


@needs_faulting
def test_a_view_that_hides_amx_shows_the_fallback() -> None:
    """On an AMX CPU, the x86-64-v4+vnni+bf16 view runs what a machine without tiles would:
    the op library finds no AMX and the class's variant is the vendor's (avx512 on Intel)."""
    if "avx512_bf16" not in flags():
        pytest.skip("this CPU has no AVX-512 BF16: the x86-64-v4+vnni+bf16 view is above it")
    done = in_view("x86-64-v4+vnni+bf16", PROBE)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["classes"][-1] == "x86-64-v4+vnni+bf16"
    if LIBRARY is not None:
        assert "amx" not in seen["runnable"] and seen["amx_refusal"] == "this CPU has no AMX-BF16 tiles"
        assert seen["variant"] == ("avx512" if LIBRARY.vendor == "intel" else "avx512-bf16")


@needs_faulting
def test_a_real_fault_still_kills_the_process_and_a_hidden_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('the hidden one ran')\n")
    done = in_view("x86-64-v3", "import ctypes; print('before', flush=True); ctypes.string_at(0)", PYTHONPATH=str(tmp_path))
    # the launcher's own process runs it too, before it execs the command's
    assert done.returncode == -signal.SIGSEGV and done.stdout.splitlines() == ["the hidden one ran"] * 2 + ["before"]


@needs_faulting
def test_lowp_runs_inside_the_view_and_says_so(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["--towers", "text:tiny", "--seconds", "0.02", "--parts", "towers,queries", "--runs", "uform f32,uform bf16,torch fp32"]
    env = {**os.environ, "UFORM_BENCHMARK_RESULTS": str(tmp_path)}
    command = [sys.executable, str(BENCHMARKS / "cpu_view.py"), "x86-64-v3", str(BENCHMARKS / "lowp.py"), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "\ncpu class: x86-64-v3; threads:" in done.stdout and "\nCPUID view: x86-64-v3 (every library of these processes sees that class;" in done.stdout
    result = json.loads((tmp_path / "lowp.json").read_text())
    assert result["cpu_class"] == "x86-64-v3" and result["cpu_view"]["class"] == "x86-64-v3"
    held = {r["run"]: r["held"] for r in result["runs"]}  # each run in a worker process of its own, in the view too
    assert re.search(r"\(avx2(-split)? kernels", held["uform bf16"]) and held["torch fp32"] == "f32 weights (ATen AVX2)"
