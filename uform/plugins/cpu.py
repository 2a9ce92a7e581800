"""The CPU backend: ONNX Runtime's CPU execution provider, for ``Model.load_ram``.

Weights are stored BF16; the CPU execution provider has no BF16 MatMul, so they are
widened to float32 once at load and handed to ONNX Runtime as external data, which it
reads into its own pre-packed form: the process then holds one float32 copy of the
weights (twice the checkpoint's bytes) and nothing of the checkpoint itself.
"""

from __future__ import annotations

import os
import platform
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from uform.core.errors import UnsupportedError
from uform.core.hookspecs import hookimpl
from uform.core.plugin import Backend, LoadRequest, Placement
from uform.core.types import CPUClass, Scalar
from uform.core.weights import bind_external, remove_tree

# Flags each class needs, lowest class first; a machine runs every class whose flags it has.
X86_CLASSES: tuple[tuple[CPUClass, frozenset[str]], ...] = (
    (CPUClass.X86_64_V2, frozenset({"sse4_2", "popcnt", "ssse3"})),
    (CPUClass.X86_64_V3, frozenset({"avx2", "fma", "f16c", "bmi2", "movbe"})),
    (CPUClass.X86_64_V4, frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
    (CPUClass.X86_64_V4_VNNI_BF16, frozenset({"avx512_vnni", "avx512_bf16"})),
    (CPUClass.X86_64_AMX, frozenset({"amx_tile", "amx_bf16", "amx_int8"})),
)
ARM_CLASSES: tuple[tuple[CPUClass, frozenset[str]], ...] = (
    (CPUClass.ARM64_NEON, frozenset({"asimd"})),
    (CPUClass.ARM64_SVE, frozenset({"sve"})),
)


def classes_from_cpuinfo(text: str) -> list[CPUClass]:
    """The classes a CPU can run, lowest first, from the text of ``/proc/cpuinfo``."""
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
            break
    table = ARM_CLASSES if "asimd" in flags else X86_CLASSES
    runnable: list[CPUClass] = []
    needed: set[str] = set()
    for cls, required in table:  # each class also needs everything below it
        needed |= required
        if not needed <= flags:
            break
        runnable.append(cls)
    return runnable


def machine_classes() -> list[CPUClass]:
    try:
        with open("/proc/cpuinfo") as f:
            return classes_from_cpuinfo(f.read())
    except OSError:
        return [CPUClass.ARM64_NEON] if platform.machine().lower() in ("arm64", "aarch64") else [CPUClass.X86_64_V2]


def choose_class(pinned: CPUClass | None, runnable: Sequence[CPUClass]) -> CPUClass:
    """The pinned class if the machine runs it, else its best; UnsupportedError otherwise."""
    best = runnable[-1] if runnable else None
    if pinned is None:
        if best is None:
            raise UnsupportedError("this CPU reaches no class uform supports (x86-64-v2 or arm64-neon at least)")
        return best
    pinned = CPUClass(pinned)
    if pinned not in runnable:
        raise UnsupportedError(f"cpu_class {pinned} is beyond this machine; the best class it runs is {best or 'none'}")
    return pinned


def numa_nodes(root: str = "/sys/devices/system/node") -> list[int]:
    try:
        names = os.listdir(root)
    except OSError:
        return [0]
    nodes = sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())
    return nodes or [0]


def check_domains(domains: Sequence[int] | None, nodes: Sequence[int]) -> None:
    if domains is None:
        return
    unknown = [d for d in domains if d not in nodes]
    if unknown or not domains:
        raise UnsupportedError(f"memory_domains {list(domains)} name unknown NUMA nodes; this machine has {list(nodes)}")


def session_options(threads: int) -> Any:
    """Intra-op threads from the executor, one inter-op thread, no spinning while idle."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def _widen(stored: np.ndarray) -> np.ndarray:
    return stored.astype(np.float32)


def probe() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return f"onnxruntime does not import ({exc})"
    if "CPUExecutionProvider" not in ort.get_available_providers():
        return "this onnxruntime build has no CPUExecutionProvider"
    return None


def open_ram(request: LoadRequest) -> Placement:
    import onnxruntime as ort

    if request.quantization is not Scalar.BF16:
        raise UnsupportedError(
            f"quantization {request.quantization.name} is not served by the cpu backend; it runs BF16 checkpoints as stored"
        )
    cpu_class = choose_class(request.cpu_class, machine_classes())
    check_domains(request.memory_domains, numa_nodes())
    options = session_options(request.executor.threads)
    runners, held = {}, 0
    for name, plan in request.towers.items():
        directory = Path(tempfile.mkdtemp(prefix=f"uform-{name}-"))
        try:
            path = bind_external(plan.graph, plan.weights, directory, _widen, request.advance)
            runners[name] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        finally:
            remove_tree(directory)
        held += sum(w.size * 4 for w in plan.weights.values())
    return Placement(runners, held, Scalar.BF16, cpu_class=cpu_class)


@hookimpl
def uform_backends() -> Iterable[Backend]:
    yield Backend(name="cpu", placement="ram", probe=probe, open=open_ram, priority=0)
