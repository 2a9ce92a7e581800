"""The CUDA backend: ONNX Runtime's CUDA execution provider, for ``Model.load_vram``.

One replica of every tower per device in ``devices``; a tower's calls are spread over its
replicas (:class:`~uform.plugins._sessions.Replicas`: whole calls to the least-busy
replica, large batches cut into row ranges that run on every replica at once). Outputs
come back to the host and the verbs write them into the caller's arena as on the CPU.

Weights are widened from BF16 to float32 once at load and computed with TF32 tensor-core
matrix products (``COMPUTE = "f16"`` makes the weight matrix products float16, an
experimental setting); docs/backends.md gives the reasons, the classes and the install path.
Nothing here ever falls back to the CPU: a missing provider, a device that does not exist
or a class beyond a device raises :class:`~uform.UnsupportedError` naming what there is.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata as metadata
import os
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from uform.core.errors import UnsupportedError
from uform.core.hookspecs import hookimpl
from uform.core.plugin import Backend, LoadRequest, Placement, Runner
from uform.core.types import GPUClass, Scalar
from uform.core.weights import bind_external, remove_tree
from uform.plugins._sessions import Replicas, session_options

PROVIDER = "CUDAExecutionProvider"
# Each class and the compute capability it needs, lowest first; a device runs every class
# at or below its own capability.
CLASSES: tuple[tuple[GPUClass, tuple[int, int]], ...] = (
    (GPUClass.SM80, (8, 0)),
    (GPUClass.SM86, (8, 6)),
    (GPUClass.SM89, (8, 9)),
    (GPUClass.SM90, (9, 0)),
    (GPUClass.SM100, (10, 0)),
    (GPUClass.SM120, (12, 0)),
)
COMPUTE = "tf32"  # "tf32": float32 with TF32 products; "f16": weight matrix products in float16 (experimental)
SESSION_THREADS = 4  # intra-op threads per CUDA session, at most: only shape arithmetic runs on the CPU
SMI_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,name,compute_cap,memory.total,driver_version", "--format=csv"]


@dataclass(frozen=True)
class GPU:
    """One CUDA device as this process numbers it (after ``CUDA_VISIBLE_DEVICES``)."""

    index: int
    name: str
    capability: tuple[int, int]
    memory: int  # bytes
    uuid: str = ""

    def __str__(self) -> str:
        return f"{self.index} ({self.name}, sm_{self.capability[0]}{self.capability[1]})"


@dataclass(frozen=True)
class Detected:
    """The devices found, the driver's version, where they were read, or why none could be."""

    gpus: list[GPU] = field(default_factory=list)
    driver: str = ""
    source: str = ""
    reason: str | None = None
    cuda: tuple[int, int] | None = None  # the newest CUDA the driver runs, where libcuda says


# -- classes ---------------------------------------------------------------------------------


def runnable(capability: tuple[int, int]) -> list[GPUClass]:
    """The classes a device of ``capability`` runs, lowest first."""
    return [cls for cls, needed in CLASSES if needed <= capability]


def choose_class(pinned: GPUClass | str | None, gpus: Sequence[GPU]) -> GPUClass:
    """The class every device runs: the pin, or the best they share; UnsupportedError else."""
    for gpu in gpus:
        if not runnable(gpu.capability):
            raise UnsupportedError(f"CUDA device {gpu} is below {CLASSES[0][0]}, the lowest class uform runs")
    shared = min((runnable(g.capability)[-1] for g in gpus), key=lambda c: [x for x, _ in CLASSES].index(c))
    if pinned is None:
        return shared
    try:
        pinned = GPUClass(pinned)
    except ValueError:
        raise ValueError(f"gpu_class {pinned!r} is not a GPUClass; choose one of {', '.join(c.value for c in GPUClass)}") from None
    beyond = [str(g) for g in gpus if pinned not in runnable(g.capability)]
    if beyond:
        raise UnsupportedError(
            f"gpu_class {pinned} is beyond CUDA device {', '.join(beyond)}; the best class every chosen device runs is {shared}"
        )
    return pinned


# -- detection -------------------------------------------------------------------------------


def parse_nvidia_smi(text: str) -> list[GPU]:
    """Devices from ``nvidia-smi --query-gpu=index,uuid,name,compute_cap,memory.total,
    driver_version --format=csv`` (header optional), numbered as nvidia-smi numbers them."""
    gpus = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if cells[0] == "index":
            continue
        if len(cells) != 6 or not cells[0].isdigit():
            raise ValueError(f"unexpected nvidia-smi output: {line.strip()!r}")
        major, _, minor = cells[3].partition(".")
        memory = int(cells[4].split()[0]) << 20 if cells[4].split()[0].isdigit() else 0
        gpus.append(GPU(int(cells[0]), cells[2], (int(major), int(minor or 0)), memory, cells[1]))
    return gpus


def visible(gpus: Sequence[GPU], mask: str | None) -> list[GPU]:
    """The devices ``CUDA_VISIBLE_DEVICES=mask`` leaves, renumbered from 0 as CUDA does
    (indices or UUID prefixes; the list ends at the first entry matching no device)."""
    if mask is None:
        return list(gpus)
    chosen: list[GPU] = []
    for token in (t.strip() for t in mask.split(",")):
        match = [g for g in gpus if (token.isdigit() and g.index == int(token)) or (token.startswith("GPU-") and g.uuid.startswith(token))]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return [GPU(i, g.name, g.capability, g.memory, g.uuid) for i, g in enumerate(chosen)]


def _from_driver() -> Detected:
    """Devices through the CUDA driver library (honours ``CUDA_VISIBLE_DEVICES`` itself)."""
    lib = ctypes.CDLL("nvcuda.dll" if os.name == "nt" else "libcuda.so.1")
    status = lib.cuInit(0)
    if status == 100:  # CUDA_ERROR_NO_DEVICE
        return Detected([], "", "libcuda")
    if status != 0:
        return Detected(reason=f"the CUDA driver did not initialise (cuInit error {status})", source="libcuda")
    version, count = ctypes.c_int(), ctypes.c_int()
    lib.cuDriverGetVersion(ctypes.byref(version))
    lib.cuDeviceGetCount(ctypes.byref(count))
    gpus = []
    for i in range(count.value):
        dev, major, minor, memory = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGet(ctypes.byref(dev), i)
        lib.cuDeviceGetName(name, 256, dev)
        lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
        lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
        lib.cuDeviceTotalMem_v2(ctypes.byref(memory), dev)
        gpus.append(GPU(i, name.value.decode(errors="replace"), (major.value, minor.value), memory.value))
    cuda = (version.value // 1000, version.value % 1000 // 10)
    return Detected(gpus, f"CUDA {cuda[0]}.{cuda[1]}", "libcuda", cuda=cuda)


def _from_smi() -> Detected:
    try:
        done = subprocess.run(SMI_QUERY, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Detected(reason=f"no CUDA driver found (libcuda does not load; nvidia-smi: {exc})", source="nvidia-smi")
    try:
        gpus = parse_nvidia_smi(done.stdout)
    except ValueError as exc:
        return Detected(reason=f"nvidia-smi failed: {(done.stdout + done.stderr).strip() or exc}", source="nvidia-smi")
    driver = done.stdout.strip().splitlines()[-1].rsplit(",", 1)[-1].strip() if gpus else ""
    return Detected(visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")), f"driver {driver}", "nvidia-smi")


@functools.lru_cache(maxsize=1)
def detect() -> Detected:
    """This machine's CUDA devices: from the driver library, else from ``nvidia-smi``."""
    try:
        return _from_driver()
    except (OSError, AttributeError):
        return _from_smi()


def check_devices(devices: Sequence[int] | None, gpus: Sequence[GPU]) -> list[int]:
    """``devices`` (default ``[0]``) as distinct existing ordinals; errors name what exists."""
    chosen = [0] if devices is None else devices
    if isinstance(chosen, (str, bytes)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in chosen):
        raise TypeError(f"devices must be a sequence of CUDA device ordinals (int), got {devices!r}")
    chosen = list(chosen)
    if not chosen:
        raise ValueError("devices is empty; name one CUDA device at least, e.g. devices=[0]")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"devices {chosen} names a device twice")
    missing = [d for d in chosen if not 0 <= d < len(gpus)]
    if missing:
        have = ", ".join(str(g) for g in gpus) or "none"
        raise UnsupportedError(f"CUDA devices {missing} do not exist; this process sees {len(gpus)}: {have}")
    return chosen


# -- sessions --------------------------------------------------------------------------------


def onnxruntime_providers() -> tuple[str, list[str]]:
    """The installed onnxruntime's version and its execution providers."""
    import onnxruntime as ort

    return ort.__version__, list(ort.get_available_providers())


def built_for() -> tuple[int, int] | None:
    """The CUDA version the installed onnxruntime wheel was built for, where it records one."""
    try:
        from onnxruntime.capi import build_and_package_info as build
    except ImportError:
        return None
    major, _, minor = str(getattr(build, "cuda_version", "")).partition(".")
    return (int(major), int(minor.partition(".")[0] or 0)) if major.isdigit() else None


def needed_libraries(cuda: tuple[int, int] | None) -> list[str]:
    """The libraries the CUDA provider of a wheel built for ``cuda`` cannot run without
    (cuDNN included: the provider opens it for every session), or [] when not known."""
    if cuda is None or cuda[0] < 12:
        return []
    major = cuda[0]
    return [f"libcudart.so.{major}", f"libcublas.so.{major}", f"libcublasLt.so.{major}", "libcurand.so.10", "libcudnn.so.9"]


@functools.lru_cache(maxsize=1)
def _preload() -> None:
    """``onnxruntime.preload_dlls()`` once, quietly: it loads the CUDA and cuDNN libraries of
    pip's ``nvidia-*`` wheels (``onnxruntime-gpu[cuda,cudnn]``), which are on no library path."""
    import contextlib
    import io

    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
            ort.preload_dlls()


def loads(name: str) -> bool:
    """Whether the shared library ``name`` loads in this process (by soname)."""
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def missing_libraries(cuda: tuple[int, int] | None) -> list[str]:
    """Of :func:`needed_libraries`, those that do not load, after :func:`_preload`."""
    needed = needed_libraries(cuda)
    if needed and not all(loads(n) for n in needed):
        _preload()
    return [n for n in needed if not loads(n)]


def _both_wheels() -> bool:
    names = {(d.metadata["Name"] or "").lower() for d in metadata.distributions()}
    return "onnxruntime" in names and "onnxruntime-gpu" in names


def probe() -> str | None:
    """None when CUDA sessions can start here, else why not (naming what is installed)."""
    try:
        version, providers = onnxruntime_providers()
    except ImportError as exc:
        return f"onnxruntime does not import ({exc})"
    if PROVIDER not in providers:
        hint = "install onnxruntime-gpu in place of onnxruntime (docs/backends.md)"
        if _both_wheels():
            hint = "onnxruntime and onnxruntime-gpu are both installed and overwrite each other; uninstall both, then install onnxruntime-gpu"
        return f"onnxruntime {version} has no {PROVIDER} (it has {', '.join(providers)}); {hint}"
    found = detect()
    if found.reason is not None:
        return found.reason
    if not found.gpus:
        mask = os.environ.get("CUDA_VISIBLE_DEVICES")
        return "no CUDA device is visible" + (f" (CUDA_VISIBLE_DEVICES={mask!r})" if mask is not None else "")
    cuda = built_for()
    wheel = f"onnxruntime {version}" + (f" (built for CUDA {cuda[0]}.{cuda[1]})" if cuda else "")
    if cuda is not None and found.cuda is not None and found.cuda[0] < cuda[0]:
        return (
            f"{wheel} needs a driver for CUDA {cuda[0]}, and this one runs CUDA {found.cuda[0]}.{found.cuda[1]} at most; "
            "upgrade the NVIDIA driver or install an onnxruntime-gpu built for your CUDA (docs/backends.md)"
        )
    missing = missing_libraries(cuda)
    if missing:
        return (
            f"{wheel} cannot load {', '.join(missing)}; install them with pip install 'onnxruntime-gpu[cuda,cudnn]' "
            f"or put CUDA {cuda[0] if cuda else ''} and cuDNN 9 on the library path (docs/backends.md)"
        )
    return None


def provider_options(device: int) -> dict[str, str]:
    """The CUDA execution provider's options for one replica."""
    return {"device_id": str(device), "use_tf32": "1", "cudnn_conv_algo_search": "HEURISTIC"}


def start_session(path: Path, options: Any, device: int) -> Runner:
    """A session of the tower at ``path`` on ``device``; UnsupportedError if CUDA does not start."""
    import onnxruntime as ort

    providers = [(PROVIDER, provider_options(device)), "CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as exc:  # noqa: BLE001 - the provider's own reason, named
        raise UnsupportedError(f"the CUDA execution provider cannot start on device {device}: {exc}") from exc
    session.disable_fallback()  # onnxruntime would otherwise rerun a failing call on the CPU, silently
    started = session.get_providers()
    if PROVIDER not in started:
        why = provider_load_error() or "ONNX Runtime's log above says why"
        raise UnsupportedError(
            f"the CUDA execution provider did not start on device {device} (the session got {', '.join(started)}): "
            f"{why}; docs/backends.md lists what onnxruntime-gpu needs"
        )
    return session  # type: ignore[no-any-return]


def provider_load_error() -> str | None:
    """The dynamic loader's reason the CUDA provider's library does not load, or None."""
    import onnxruntime as ort

    name = "onnxruntime_providers_cuda.dll" if os.name == "nt" else "libonnxruntime_providers_cuda.so"
    library = Path(ort.__file__).parent / "capi" / name
    if not library.exists():
        return f"{library} does not exist"
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return str(exc)
    return None


def half_products(model: onnx.ModelProto, weights: Sequence[str]) -> tuple[onnx.ModelProto, set[str]]:
    """A copy of ``model`` whose ``Gemm`` nodes multiply in float16, and the weights that
    become float16.

    Each ``Gemm`` over checkpoint weights (or embedded constants) used by no other node gets
    its activation cast to float16 before and its result cast back to float32 after; the rest
    of the graph (residual stream, LayerNorm, softmax, pooling) stays float32, as do the
    graph's inputs and outputs. Constants it multiplies become float16 in place.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    constants = {t.name: i for i, t in enumerate(g.initializer)}
    declared, halves, nodes = set(weights), set(), []
    gemms = [n for n in g.node if n.op_type == "Gemm"]
    elsewhere = {name for n in g.node if n.op_type != "Gemm" for name in n.input} | {n.input[0] for n in gemms}
    chosen = {id(n) for n in gemms if all((w in declared or w in constants) and w not in elsewhere for w in n.input[1:])}
    blocked = {w for n in gemms if id(n) not in chosen for w in n.input[1:]}  # shared with a float32 Gemm
    chosen = {id(n) for n in gemms if id(n) in chosen and not blocked.intersection(n.input[1:])}
    for node in g.node:
        operands = node.input[1:]
        if id(node) not in chosen:
            nodes.append(node)
            continue
        x16, y16 = f"{node.name}_x16", f"{node.name}_y16"
        nodes.append(helper.make_node("Cast", [node.input[0]], [x16], name=f"{node.name}_to16", to=TensorProto.FLOAT16))
        half = onnx.NodeProto()
        half.CopyFrom(node)
        half.input[0], half.output[0] = x16, y16
        nodes.append(half)
        nodes.append(helper.make_node("Cast", [y16], [node.output[0]], name=f"{node.name}_to32", to=TensorProto.FLOAT))
        for w in operands:
            if w in constants and w not in halves:
                table = numpy_helper.to_array(g.initializer[constants[w]])
                g.initializer[constants[w]].CopyFrom(numpy_helper.from_array(_halve(table), w))
            halves.add(w)
    del g.node[:]
    g.node.extend(nodes)
    return out, halves & declared


def _halve(values: np.ndarray) -> np.ndarray:
    return np.clip(values.astype(np.float32), -65504, 65504).astype(np.float16)


def _widen(stored: np.ndarray) -> np.ndarray:
    return stored.astype(np.float32)


def open_vram(request: LoadRequest) -> Placement:
    """One replica of every tower per device; UnsupportedError names what is available."""
    if request.quantization is not Scalar.BF16:
        raise UnsupportedError(
            f"quantization {request.quantization.name} is not served by the cuda backend; it runs BF16 checkpoints as stored"
        )
    if COMPUTE not in ("tf32", "f16"):
        raise ValueError(f"uform.plugins.cuda.COMPUTE must be 'tf32' or 'f16', not {COMPUTE!r}")
    reason = probe()
    if reason is not None:
        raise UnsupportedError(f"cannot place a model in VRAM: {reason}")
    gpus = detect().gpus
    devices = check_devices(request.devices, gpus)
    gpu_class = choose_class(request.gpu_class, [gpus[d] for d in devices])
    options = session_options(max(1, min(request.executor.threads, SESSION_THREADS)))
    runners: dict[str, Runner] = {}
    held = 0
    for name, tower in request.towers.items():
        graph, halves = (tower.graph, set()) if COMPUTE != "f16" else half_products(tower.graph, list(tower.weights))
        half_ids = {id(tower.weights[w]) for w in halves}  # bind_external hands convert the stored arrays

        def convert(stored: np.ndarray, half_ids: set[int] = half_ids) -> np.ndarray:
            return _halve(stored) if id(stored) in half_ids else _widen(stored)

        directory = Path(tempfile.mkdtemp(prefix=f"uform-{name}-"))
        try:
            path = bind_external(graph, tower.weights, directory, convert, request.advance)
            sessions = [start_session(path, options, d) for d in devices]
        finally:
            remove_tree(directory)
        runners[name] = sessions[0] if len(sessions) == 1 else Replicas(sessions)
        held += sum(w.size * (2 if n in halves else 4) for n, w in tower.weights.items()) * len(sessions)
    return Placement(runners, held, Scalar.BF16, gpu_class=gpu_class)


@hookimpl
def uform_backends() -> Iterable[Backend]:
    yield Backend(name="cuda", placement="vram", probe=probe, open=open_vram, priority=0)
