"""The e4m3 backend: BF16 and E4M3 weights on uform's op library, for ``Model.load_ram``.

The transformer's matrix products become the library's ONNX Runtime custom ops (domain
``ai.uform``): ``MatMulBF16`` over the checkpoint's BF16 matrices as stored, or, with
``quantization=Scalar.E4M3``, ``MatMulE4M3`` over the blocks' matrices quantized at load to
FLOAT8 E4M3 (FN) with a scale per output channel (other matrices stay BF16). Each matrix is
packed once, natively, straight from the checkpoint's bytes into the panels its kernels read,
and fed to the session with every run (a graph input, so ONNX Runtime neither copies nor
owns it); no float32 copy of a matrix exists and nothing is written to disk. The few small
tensors the standard ops take (norms, biases, class tokens, positions, byte embeddings;
under 1 % of the weights) are float32 initializers. With memory domains, each domain's
session has its own copy, packed on the domain's CPUs. Each attention also runs as one
``Attention`` op (:mod:`uform.plugins.oplib.attention`), and each block's GELU and residual adds
run inside the products that feed them (:mod:`uform.plugins.oplib.epilogues`).

Kernels come in variants — AVX2 FMA, AVX-512 FMA, AVX-512 BF16 dot products, AMX tiles —
and each CPU class runs the one measured fastest on its cores (docs/op-library.md, "Kernels and
CPU classes"): x86-64-v3 ``avx2``, or ``avx2-split`` where the CPU runs 256-bit operations as
two halves (AMD Zen 1 and Zen+); x86-64-v4 ``avx512``; x86-64-v4+vnni+bf16 ``avx512-bf16`` on
AMD's cores and ``avx512`` on Intel's (whose VDPBF16PS gives no more products a cycle than
float32 FMA); x86-64-amx ``amx``, or where the tiles are refused (an old kernel, a VM without
tile state) the class below's choice, said in ``uform plugins`` and the load's ``compute``.
``UFORM_AVX2_KERNELS`` and ``UFORM_AVX512_KERNELS`` name another of the class's variants. They
run on ONNX Runtime's intra-op thread pool. A class without kernels (x86-64-v2, Arm) is left
to the cpu backend, as is ``quantization=Scalar.F32``.
Exported towers never use these ops (see ``uform.exporters``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper

from uform.core.errors import CheckpointError, UnsupportedError
from uform.core.hookspecs import hookimpl
from uform.core.plugin import Backend, LoadRequest, Placement, Runner, TowerPlan
from uform.core.types import CPUClass, Scalar
from uform.core.weights import Lowered, Stored, lowered, matrix_products, shape_of, stored_bytes
from uform.plugins.oplib.attention import fuse_attention
from uform.plugins.cpu import CEILING, check_domains, choose_class, domain_plan, machine_classes, numa_nodes
from uform.plugins.oplib.epilogues import fuse_epilogues
from uform.plugins.oplib.handoff import hand_over
from uform.plugins.oplib.library import VARIANTS, OpLibrary, OpLibraryError, library
from uform.plugins.oplib.qkv import fuse_qkv
from uform.plugins.sessions.replicas import Fed, Replicas, on_cpus, ort_values, session_options

DOMAIN = "ai.uform"
MIN_ONNXRUNTIME = (1, 21)  # the C API version the library is built against
CHOICES = {  # the variants each class may run, its default first (see variant_of)
    CPUClass.X86_64_V3: ("avx2", "avx2-split"),
    CPUClass.X86_64_V4: ("avx512",),
    CPUClass.X86_64_V4_VNNI_BF16: ("avx512-bf16", "avx512"),
    CPUClass.X86_64_AMX: ("amx", "avx512-bf16", "avx512"),
}
AVX2_KERNELS = "UFORM_AVX2_KERNELS"  # the environment's choice of x86-64-v3's kernels: see variant_of
AVX512_KERNELS = "UFORM_AVX512_KERNELS"  # the same for x86-64-v4+vnni+bf16 and x86-64-amx
AVX2_VARIANTS = CHOICES[CPUClass.X86_64_V3]
FUSED_ATTENTION = frozenset(VARIANTS)  # variants whose loads run attention as one op (benchmarks/attention.py)
FUSE_EPILOGUES = True  # GELU and residual adds inside the products (benchmarks/lowp.py --parts epilogues loads without too)
HAND_OVER = True  # layer norms', attentions' and fc1's outputs handed to the products as BF16 where the kernels read x so (lowp.py --parts handoff loads without too)
FUSE_QKV = True  # each block's qkv projection and attention one op, a chunk of items at a time (lowp.py --parts qkv loads without too)
STREAM_Y = True  # products' outputs past the caches where the kernels do so (amx, from 4 MiB); False: the attribute stream=0 on each (lowp.py --parts streaming)
COMPUTE = {
    "avx2": "float32 products of weights widened in cache (avx2 kernels)",
    "avx2-split": "float32 products of weights widened in cache (avx2-split kernels: panels staged as float32)",
    "avx512": "float32 products of weights widened in cache (avx512 kernels)",
    "avx512-bf16": "bf16 products, float32 sums (avx512-bf16 kernels)",
    "amx": "bf16 tile products, float32 sums (amx kernels)",
    "amx-model": "bf16 tile products in a scalar model of the tiles, float32 sums (amx-model kernels)",
}


def probe() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return f"onnxruntime does not import ({exc})"
    version = tuple(int(p) for p in ort.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_ONNXRUNTIME:
        return f"onnxruntime {ort.__version__} is older than the op library's C API ({'.'.join(map(str, MIN_ONNXRUNTIME))})"
    try:
        lib = library()
    except OpLibraryError as exc:
        return str(exc)
    if not lib.runnable:
        return "this CPU runs none of the op library's kernels (they need AVX2 and FMA at least)"
    return None


def accepts(request: LoadRequest) -> str | None:
    if request.quantization not in (Scalar.BF16, Scalar.E4M3):
        return f"holds weights in bf16 or e4m3, not {request.quantization}"
    try:
        chosen = choose_class(request.cpu_class, machine_classes())
        variant = variant_of(chosen)
    except UnsupportedError:  # a class beyond the machine, a kernel setting naming none: the load is
        return None  # ours and fails, open_ram raising it (the host takes an accepts that raises for a bug)
    if variant is None or variant not in library().runnable:
        return f"has no kernels for cpu_class {chosen} (it has {', '.join(sorted(library().runnable))})"
    return None


def variant_of(cpu_class: CPUClass) -> str | None:
    """The kernel variant a load for ``cpu_class`` runs on this machine (None: no kernels),
    each class's choice measured on its cores (docs/op-library.md, "Kernels and CPU classes"):
    x86-64-v3 takes ``avx2-split`` where this CPU runs 256-bit operations as two 128-bit
    halves (there the ``avx2`` kernels' widening takes the FMA pipes' slots), else ``avx2``;
    x86-64-v4+vnni+bf16 takes ``avx512`` on Intel's cores (VDPBF16PS there gives no more
    products a cycle than float32 FMA: 1.5x in the kernels alone) and ``avx512-bf16`` on
    others; x86-64-amx takes ``amx`` where Linux grants the tile state, else what
    x86-64-v4+vnni+bf16 takes. ``UFORM_AVX2_KERNELS`` (x86-64-v3) and ``UFORM_AVX512_KERNELS``
    (the two classes above x86-64-v4) name another of the class's variants; UnsupportedError
    where they name none of them, or ``amx`` where the tiles are refused."""
    choices = CHOICES.get(cpu_class)
    if choices is None:
        return None
    if len(choices) == 1:
        return choices[0]
    lib = library()
    name = AVX2_KERNELS if cpu_class is CPUClass.X86_64_V3 else AVX512_KERNELS
    chosen = os.environ.get(name, "").strip()
    if chosen:
        if chosen not in choices:
            what = "AVX2 kernels" if cpu_class is CPUClass.X86_64_V3 else f"kernels of {cpu_class}"
            raise UnsupportedError(f"{name}={chosen!r} names no {what}: set it to {' or '.join(choices)}, or unset it")
        if chosen == "amx" and chosen not in lib.runnable:
            raise UnsupportedError(f"{name}=amx, but this process cannot run the amx kernels: {lib.amx_refusal}; unset it")
        return chosen
    if cpu_class is CPUClass.X86_64_V3:
        return "avx2-split" if lib.splits_256 else "avx2"
    if cpu_class is CPUClass.X86_64_AMX and "amx" in lib.runnable:
        return "amx"
    return "avx512" if lib.vendor == "intel" else "avx512-bf16"


def compute_of(cpu_class: CPUClass, variant: str) -> str:
    """What a load for ``cpu_class`` on ``variant``'s kernels computes with, in words; on an AMX
    class run without tiles, why."""
    refusal = library().amx_refusal
    if cpu_class is CPUClass.X86_64_AMX and variant != "amx" and refusal and not os.environ.get(AVX512_KERNELS, "").strip():
        return f"{COMPUTE[variant]}: amx refused ({refusal})"
    return COMPUTE[variant]


def describe_here() -> str:
    """The kernels a load on this machine would run, in words (for ``uform plugins``)."""
    try:
        best = choose_class(None, machine_classes())
    except UnsupportedError as exc:  # UFORM_CPU_CLASS names no class of this machine: what a load would say
        return f"loads fail: {exc}; library {library().path}"
    best_note = f"{best}, capped by {CEILING}" if os.environ.get(CEILING, "").strip() else str(best)
    try:
        variant = variant_of(best)
    except UnsupportedError as exc:  # the environment names no variant: what a load would say
        return f"loads for {best_note} fail: {exc}; library {library().path}"
    what = f"{compute_of(best, variant)} for {best_note}" if variant else f"no kernels for {best_note}: the cpu backend serves"
    return f"{what}; library {library().path}"


def lower(
    graph: onnx.ModelProto, weights: Mapping[str, np.ndarray], quantize: bool, variant: str, lib: OpLibrary, threads: int
) -> Lowered:
    """``graph`` with every ``Gemm(x, W, b, transB=1)`` over a checkpoint matrix made the
    library's op over ``W`` packed for ``variant`` (the blocks' matrices quantized to E4M3
    when ``quantize``), every attention one ``Attention`` op (the variant's kernel), GELUs and
    residual adds folded into the products before them, products, layer norms and attentions
    read by one product alone handing their output over as BF16
    (:mod:`uform.plugins.oplib.handoff`), each attention and its qkv projection one op there too
    (:mod:`uform.plugins.oplib.qkv`), and the remaining weights widened to float32."""
    if variant in FUSED_ATTENTION:
        graph = fuse_attention(graph, VARIANTS.index(variant))
    fed: dict[str, np.ndarray] = {}
    nodes = list(graph.graph.node)
    products = matrix_products(graph, weights)
    names = list(products.values())
    quantized = {m: quantize and ".blocks." in m for m in names}
    shapes = [shape_of(weights, m) for m in names]
    # a matrix not read yet is read into one reused buffer and packed from there (reading the
    # next one on a thread of its own while this one was packed measured no faster: 2 cores)
    stored = weights if isinstance(weights, Stored) and weights.streams else None
    scratch = np.empty(max((2 * math.prod(s) for s in shapes), default=0), np.uint8) if stored is not None else None
    last = [0]

    def fetch(i: int) -> np.ndarray:
        # a BF16 matrix read from the file is not checked finite as it is read: the packing
        # checks every weight's bits (and a refusal is read again, checked, to name it)
        last[0] = i
        return stored.fetch(names[i], scratch, skip_bf16_check=True) if stored is not None and scratch is not None else weights[names[i]]

    try:
        packed = lib.pack_all(variant, [(s, quantized[m]) for s, m in zip(shapes, names)], fetch, threads)
    except ValueError as exc:  # reading a tensor refuses non-finite weights first; this names them too
        if stored is not None and scratch is not None and not isinstance(exc, CheckpointError):
            stored.fetch(names[last[0]], scratch)  # checked: raises CheckpointError naming the tensor and its first bad weight
        raise CheckpointError(f"a matrix of the {graph.graph.name!r} tower: {exc}") from None
    for (index, matrix), (fed[matrix], scale) in zip(products.items(), packed):
        node = nodes[index]
        e4m3 = quantized[matrix]
        inputs = [node.input[0], matrix]
        if scale is not None:
            fed[f"{matrix}:scale"] = scale
            inputs.append(f"{matrix}:scale")
        if len(node.input) > 2 and node.input[2]:
            inputs.append(node.input[2])
        op = "MatMulE4M3" if e4m3 else "MatMulBF16"
        n = shape_of(weights, matrix)[0]
        # threads: the session's, which the kernels size their tasks to
        attrs: dict[str, Any] = {"variant": VARIANTS.index(variant), "n": n, "threads": threads} | ({} if STREAM_Y else {"stream": 0})
        nodes[index] = helper.make_node(op, inputs, list(node.output), name=node.name, domain=DOMAIN, **attrs)
    if FUSE_EPILOGUES:
        nodes = fuse_epilogues(graph, nodes)
    handed: set[str] = set()
    if HAND_OVER:
        nodes, handed = hand_over(graph, nodes, variant, lambda name: shape_of(weights, name) if name in weights else None)
    if FUSE_QKV:
        nodes = fuse_qkv(graph, nodes, variant)
    initializers = {name: weights[name].astype(np.float32) for name in weights if name not in fed}
    out = lowered(graph, nodes, fed, initializers)
    kept = [v for v in out.graph.graph.value_info if v.name not in handed]  # handed values are BF16 now
    del out.graph.graph.value_info[:]
    out.graph.graph.value_info.extend(kept)
    out.graph.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return out


def open_ram(request: LoadRequest) -> Placement:
    """Place every tower on the CPU through the library: one session per memory domain, each
    with the weights packed on its own CPUs (so their pages are the domain's, by first touch)."""
    import onnxruntime as ort

    lib = library()
    cpu_class = choose_class(request.cpu_class, machine_classes())
    variant = variant_of(cpu_class)
    assert variant is not None  # accepts() refused the load otherwise
    plan = domain_plan(check_domains(request.memory_domains, numa_nodes()), request.executor.threads)
    quantize = request.quantization is Scalar.E4M3
    runners: dict[str, Runner] = {}
    held = 0
    for name, tower in request.towers.items():

        def place(cpus: list[int] | None, threads: int, tower: TowerPlan = tower) -> Fed:
            low = lower(tower.graph, tower.weights, quantize, variant, lib, threads)
            values = ort_values(low.initializers)
            options = session_options(threads, cpus)
            options.register_custom_ops_library(str(lib.path))
            options.add_external_initializers(list(values), list(values.values()))  # small: copied in
            session = ort.InferenceSession(low.graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
            copied = sum(a.nbytes for a in low.initializers.values())  # ONNX Runtime's copy of the initializers
            return Fed(session, low.fed, low.nbytes + copied)

        sessions = [on_cpus(cpus, lambda cpus=cpus, threads=threads: place(cpus, threads)) for cpus, threads in plan]  # type: ignore[misc]
        request.advance(stored_bytes(tower.weights))
        pinned = [cpus for cpus, _ in plan]
        runners[name] = sessions[0] if pinned == [None] else Replicas(sessions, pinned)
        held += sum(s.nbytes for s in sessions)
    return Placement(
        runners, held, request.quantization, cpu_class=cpu_class, batch_scale=len(plan), compute=compute_of(cpu_class, variant)
    )  # fmt: skip


@hookimpl
def uform_backends() -> Iterable[Backend]:
    yield Backend(name="e4m3", placement="ram", probe=probe, open=open_ram, priority=10, accepts=accepts, detail=describe_here)
