"""The CPU backend: ONNX Runtime's CPU execution provider, for ``Model.load_ram``.

It serves the loads the e4m3 backend (uform's op library) does not: ``quantization=F32``,
and BF16 or E4M3 where the library is missing or has no kernels for the CPU class.

- F32 and BF16: the CPU execution provider has no BF16 matrix product, so weights are
  widened to float32 once at load and handed to ONNX Runtime as external data, which it
  reads into its own pre-packed form: the process holds one float32 copy of the weights
  (twice the checkpoint's bytes) per memory domain. ``describe().quantization`` says F32.
- E4M3: the blocks' matrices are quantized at load and each product runs on weights that
  a standard ``DequantizeLinear`` makes on every run (see :mod:`uform.plugins.sessions.dequantize`);
  nothing is written to disk.

Classes and NUMA domains are described in docs/backends.md.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from uform.core.errors import UnsupportedError
from uform.core.hookspecs import hookimpl
from uform.core.plugin import Backend, LoadRequest, Placement, Runner, TowerPlan
from uform.core.types import CPUClass, Scalar, pin
from uform.plugins.sessions import dequantize
from uform.plugins.sessions.replicas import Fed, Replicas, on_cpus, ort_values, session_options
from uform.plugins.sessions.widened import widen, widened_sessions

# Flags each class adds to the one before it, lowest class first; a machine runs every
# class whose flags (and those of every class below it) it has.
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
CEILING = "UFORM_CPU_CLASS"  # the environment's cap on the classes this machine is taken to run
NODE_ROOT = "/sys/devices/system/node"  # where Linux lists NUMA nodes (tests point it elsewhere)
CPUINFO = "/proc/cpuinfo"


def flags_from_cpuinfo(text: str) -> set[str]:
    """The feature flags every processor of ``/proc/cpuinfo`` lists (x86 ``flags``, Arm
    ``Features``): their intersection, so a class is one every core can run."""
    common: set[str] | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            listed = set(value.split())
            common = listed if common is None else common & listed
    return common or set()


def classes_from_cpuinfo(text: str) -> list[CPUClass]:
    """The classes a CPU can run, lowest first, from the text of ``/proc/cpuinfo``."""
    flags = flags_from_cpuinfo(text)
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
    """The classes this machine runs, lowest first (from ``/proc/cpuinfo`` on Linux), up to
    ``UFORM_CPU_CLASS`` where the environment sets it (:func:`capped`)."""
    try:
        with open(CPUINFO) as f:
            found = classes_from_cpuinfo(f.read())
    except OSError:  # not Linux: the baseline of the architecture
        found = [CPUClass.ARM64_NEON] if platform.machine().lower() in ("arm64", "aarch64") else [CPUClass.X86_64_V2]
    return capped(found, os.environ.get(CEILING, ""))


def capped(runnable: Sequence[CPUClass], ceiling: str) -> list[CPUClass]:
    """``runnable`` without the classes above ``ceiling`` (a CPUClass value; empty: no cap).
    Every process of a fleet then loads for one class, whatever its CPU: the same kernels and
    the same sums (docs/backends.md, "CPU classes"). UnsupportedError where ``ceiling`` names
    no class, or one of another architecture."""
    if not ceiling.strip():
        return list(runnable)
    try:
        cap = CPUClass(ceiling.strip())
    except ValueError:
        raise UnsupportedError(f"{CEILING}={ceiling!r} names no CPU class: set it to one of {', '.join(c.value for c in CPUClass)}, or unset it") from None
    if runnable and _architecture(runnable[-1]) != _architecture(cap):
        raise UnsupportedError(f"{CEILING}={cap} is a class of {_architecture(cap)}, and this machine is {_architecture(runnable[-1])}: unset it or name one of {', '.join(c.value for c in runnable)}")
    order = list(CPUClass)
    return [c for c in runnable if order.index(c) <= order.index(cap)]


def _architecture(cls: CPUClass) -> str:
    return "arm64" if cls.value.startswith("arm64") else "x86-64"


def choose_class(pinned: CPUClass | str | None, runnable: Sequence[CPUClass]) -> CPUClass:
    """The pinned class if the machine runs it, else its best; UnsupportedError otherwise."""
    best = runnable[-1] if runnable else None
    if pinned is None:
        if best is None:
            raise UnsupportedError("this CPU reaches no class uform supports (x86-64-v2 or arm64-neon at least)")
        return best
    pinned = pin(pinned, CPUClass, "cpu_class")
    if pinned not in runnable:
        where = f"the best class it runs is {best}" if best else "it runs no class uform supports"
        if best is not None and _architecture(best) != _architecture(pinned):
            where = f"this machine is {_architecture(best)} and {where}"
        raise UnsupportedError(f"cpu_class {pinned} is beyond this machine; {where}")
    return pinned


def numa_nodes(root: str | None = None) -> list[int]:
    """The NUMA node ids of this machine; ``[0]`` where the platform does not list them."""
    try:
        names = os.listdir(root or NODE_ROOT)
    except OSError:
        return [0]
    nodes = sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())
    return nodes or [0]


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` (Linux's cpulist format) → ``[0, 1, 2, 3, 8, 10, 11]``."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def allowed_cpus() -> set[int] | None:
    """The CPUs this process may run on, or None where the platform cannot say."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def node_cpus(node: int, root: str | None = None) -> list[int] | None:
    """The CPUs of ``node`` this process may run on; None where nodes are not listed."""
    try:
        with open(os.path.join(root or NODE_ROOT, f"node{node}", "cpulist")) as f:
            listed = parse_cpulist(f.read())
    except OSError:
        return None
    allowed = allowed_cpus()
    return [c for c in listed if allowed is None or c in allowed]


def check_domains(domains: Sequence[int] | None, nodes: Sequence[int]) -> list[int] | None:
    """``domains`` as a list of known, distinct nodes; UnsupportedError names the nodes that exist."""
    if domains is None:
        return None
    if isinstance(domains, (str, bytes)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in domains):
        raise TypeError(f"memory_domains must be a sequence of NUMA node ids (int), got {domains!r}")
    chosen = list(domains)
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"memory_domains {chosen} names a node twice")
    unknown = [d for d in chosen if d not in nodes]
    if unknown or not chosen:
        what = f"name unknown NUMA nodes {unknown}" if unknown else "is empty"
        raise UnsupportedError(f"memory_domains {chosen} {what}; this machine has NUMA nodes {list(nodes)}")
    return chosen


def domain_plan(domains: list[int] | None, threads: int, root: str | None = None) -> list[tuple[list[int] | None, int]]:
    """Per replica: the CPUs it is pinned to (None: unpinned) and its intra-op threads.

    Without ``memory_domains`` there is one unpinned replica with the executor's threads.
    With them there is one replica per node, the executor's threads shared evenly among
    them and never more than a node has CPUs this process may use.
    """
    if domains is None:
        return [(None, threads)]
    plan: list[tuple[list[int] | None, int]] = []
    for node in domains:
        cpus = node_cpus(node, root)
        if cpus is not None and not cpus:
            raise UnsupportedError(f"NUMA node {node} has no CPU this process may run on (allowed: {sorted(allowed_cpus() or [])})")
        share = max(1, threads // len(domains))
        plan.append((cpus, min(share, len(cpus)) if cpus else share))
    return plan


def probe() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return f"onnxruntime does not import ({exc})"
    if "CPUExecutionProvider" not in ort.get_available_providers():
        return "this onnxruntime build has no CPUExecutionProvider"
    return None


def accepts(request: LoadRequest) -> str | None:
    if request.quantization not in (Scalar.F32, Scalar.BF16, Scalar.E4M3):
        return f"holds weights in f32, bf16 or e4m3, not {request.quantization}"
    return None


def open_ram(request: LoadRequest) -> Placement:
    """Place every tower on the CPU: one session per memory domain (one without domains)."""
    cpu_class = choose_class(request.cpu_class, machine_classes())
    domains = check_domains(request.memory_domains, numa_nodes())
    plan = domain_plan(domains, request.executor.threads)
    runners: dict[str, Runner] = {}
    held = 0
    for name, tower in request.towers.items():
        if request.quantization is Scalar.E4M3:
            sessions, bytes_held = _dequantizing(tower, plan, request.advance)
        else:
            sessions, bytes_held = _widened(name, tower, plan, request.advance)
        pinned = [cpus for cpus, _ in plan]
        runners[name] = sessions[0] if pinned == [None] else Replicas(sessions, pinned)
        held += bytes_held
    quantization, compute = (
        (Scalar.E4M3, "float32 products of E4M3 weights dequantized on every run (DequantizeLinear)")
        if request.quantization is Scalar.E4M3
        else (Scalar.F32, "float32 products (ONNX Runtime's MLAS)")
    )
    return Placement(runners, held, quantization, cpu_class=cpu_class, batch_scale=len(plan), compute=compute)


Plan = list[tuple[list[int] | None, int]]


def _widened(name: str, tower: TowerPlan, plan: Plan, advance: Callable[[int], None]) -> tuple[list[Any], int]:
    """Sessions over float32 weights that ONNX Runtime reads from a temporary file and packs."""
    import onnxruntime as ort

    def start(path: Path, cpus: list[int] | None, threads: int) -> Any:
        options = session_options(threads, cpus)
        return on_cpus(cpus, lambda: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]))

    sessions = widened_sessions(name, tower.graph, tower.weights, widen, advance, lambda path: [start(path, cpus, threads) for cpus, threads in plan])
    return sessions, sum(w.size * 4 for w in tower.weights.values()) * len(sessions)


def _dequantizing(tower: TowerPlan, plan: Plan, advance: Callable[[int], None]) -> tuple[list[Any], int]:
    """Sessions over E4M3 codes dequantized before each product, read from memory."""
    import onnxruntime as ort

    low = dequantize.lower(tower.graph, tower.weights)
    advance(sum(w.nbytes for w in tower.weights.values()))
    values, model = ort_values(low.initializers), low.graph.SerializeToString()

    def start(cpus: list[int] | None, threads: int) -> Any:
        options = session_options(threads, cpus)
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED  # each weight dropped after its product
        options.add_external_initializers(list(values), list(values.values()))  # small: copied in
        session = on_cpus(cpus, lambda: ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]))
        return Fed(session, low.fed, low.nbytes)  # the codes are fed: one copy, shared by the domains

    sessions = [start(cpus, threads) for cpus, threads in plan]
    return sessions, low.nbytes + sum(a.nbytes for a in low.initializers.values()) * len(sessions)  # + each session's copy


@hookimpl
def uform_backends() -> Iterable[Backend]:
    yield Backend(name="cpu", placement="ram", probe=probe, open=open_ram, priority=0, accepts=accepts)
