"""Runs a command's Python processes as on a machine of a lower x86-64 class.

    python benchmarks/cpu_view.py x86-64-v3 benchmarks/lowp.py --seconds 2
    python benchmarks/cpu_view.py x86-64-v3 -m uform.cli plugins

On a machine with AVX-512, every library of the command's Python processes — ONNX Runtime's
MLAS, PyTorch (ATen, oneDNN, MKL), numpy, glibc's string functions and uform itself — then
chooses the kernels it would choose on an AVX2-only machine (``x86-64-v3``), or on one without
AVX-512's later extensions (``x86-64-v4``: no VNNI, no BF16), while the cores, caches and clock
stay this machine's. So the float32 path that the pinned AVX2 kernels are judged against is
MLAS at AVX2, the peer an AVX2-only machine has (docs/benchmarks.md, "AVX2"; how it was checked:
docs/notes/benchmarks-history.md, "Measuring as an AVX2-only machine: a CPUID view"). How:

- Linux's CPUID faulting: each process turns it on at startup (``cpu_view_site/sitecustomize.py``,
  first on ``PYTHONPATH``) and the handler of uform's ``_cpuid_view`` library
  (native/cpuid_view) answers each ``cpuid`` with the class's missing feature bits cleared;
- ``UFORM_CPU_CLASS`` caps the classes uform reads from ``/proc/cpuinfo``, which the view cannot
  change;
- ``GLIBC_TUNABLES`` hides AVX-512 from glibc, which asked the CPU before Python started.

The hardware still runs every instruction: code that uses AVX-512 without asking is not caught.
A real fault still goes to the handler that was there before (Python's ``faulthandler`` where
``PYTHONFAULTHANDLER`` or ``-X faulthandler`` set it), but ``faulthandler.enable()`` called
inside the view puts its handler in front of the view's: the next ``cpuid`` then ends the
process as a segmentation fault.
Needs Linux x86-64 with the ``cpuid_fault`` flag (most KVM and Firecracker guests of recent
kernels, Intel since Ivy Bridge, AMD since Zen 4); it says so where it is missing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SITE = Path(__file__).parent / "cpu_view_site"
GLIBC_HIDDEN = {  # glibc.cpu.hwcaps names a view hides from glibc's own choice of string functions
    "x86-64-v3": ["AVX512F", "AVX512CD", "AVX512BW", "AVX512DQ", "AVX512VL", "AVX512ER", "AVX512PF"],
    "x86-64-v4": [],
    "x86-64-v4+vnni+bf16": [],  # AMX hidden: an AMX CPU runs what it would without tiles
}


def environment(view: str, base: dict[str, str]) -> dict[str, str]:
    """``base`` with what a process needs to start inside ``view``."""
    env = dict(base, UFORM_CPUID_VIEW=view, UFORM_CPU_CLASS=view)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), *filter(None, [base.get("PYTHONPATH")])])
    if GLIBC_HIDDEN[view]:
        hidden = "glibc.cpu.hwcaps=" + ",".join(f"-{name}" for name in GLIBC_HIDDEN[view])
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [base.get("GLIBC_TUNABLES"), hidden]))
    return env


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in GLIBC_HIDDEN:
        raise SystemExit(f"usage: python benchmarks/cpu_view.py {{{','.join(GLIBC_HIDDEN)}}} SCRIPT [ARGS...] | -m MODULE [ARGS...]")
    view, command = argv[0], argv[1:]
    sys.stdout.flush()
    sys.stderr.flush()  # execve drops what Python still buffers
    os.execve(sys.executable, [sys.executable, *command], environment(view, dict(os.environ)))


if __name__ == "__main__":
    main(sys.argv[1:])
