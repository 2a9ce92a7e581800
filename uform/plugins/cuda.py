"""The CUDA backend: ONNX Runtime's CUDA execution provider, for ``Model.load_vram``.

One replica of every tower per device in ``devices``; a tower's calls are spread over its
replicas (:class:`~uform.plugins.sessions.replicas.Replicas`: whole calls to the least-busy
replica, large batches cut into row ranges that run on every replica at once). Outputs
come back to the host and the verbs write them into the caller's arena as on the CPU.

Weights are widened from BF16 to float32 once at load and computed with TF32 tensor-core
matrix products, and ``describe().quantization`` says F32 (``COMPUTE = "f16"`` makes the
weight matrix products float16, an experimental setting, and says F16). With
``quantization=Scalar.E4M3`` on a class with FP8 (sm_89 and later) the blocks' matrices are
held in VRAM as E4M3 codes with a scale per output row and ONNX Runtime's
``DequantizeLinear`` (FLOAT8E4M3FN) makes each product's weights on the device; older
classes refuse it with the reason. docs/gpus.md gives the reasons, the classes and the
install path.
Nothing here ever falls back to the CPU: a missing provider, a driver older than the
wheel's CUDA, a CUDA or cuDNN library that does not load, a device that does not exist or a
class beyond a device raises :class:`~uform.UnsupportedError` naming what there is. Devices
and classes are read in :mod:`uform.plugins.sessions.gpus`.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata as metadata
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from uform.core.errors import UnsupportedError
from uform.core.hookspecs import hookimpl
from uform.core.plugin import Backend, LoadRequest, Placement, Runner, TowerPlan
from uform.core.types import GPUClass, Scalar
from uform.plugins.sessions import dequantize
from uform.plugins.sessions.gpus import check_devices, choose_class, detect
from uform.plugins.sessions.half import half_products as half_products  # tests and docs/gpus.md name it here too
from uform.plugins.sessions.half import halve as _halve
from uform.plugins.sessions.replicas import Replicas, session_options
from uform.plugins.sessions.widened import widen, widened_sessions

PROVIDER = "CUDAExecutionProvider"
INSTALLING = 'docs/gpus.md, "Installing for GPUs"'  # the page and section the refusals send a reader to
COMPUTE = "tf32"  # "tf32": float32 with TF32 products; "f16": weight matrix products in float16 (experimental)
SESSION_THREADS = 4  # intra-op threads per CUDA session, at most: only shape arithmetic runs on the CPU
FP8_CLASSES = frozenset({GPUClass.SM89, GPUClass.SM90, GPUClass.SM100, GPUClass.SM120})  # FP8 tensor cores
BATCH_SCALE = 4  # per device: verbs' batches hold this many times their CPU-sized bounds (not yet tuned on a GPU)


# -- the wheel and its libraries -------------------------------------------------------------


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
        hint = f"install onnxruntime-gpu[cuda,cudnn] in place of onnxruntime ({INSTALLING})"
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
            f"upgrade the NVIDIA driver or install an onnxruntime-gpu built for your CUDA ({INSTALLING})"
        )
    missing = missing_libraries(cuda)
    if missing:
        return (
            f"{wheel} cannot load {', '.join(missing)}; install them with pip install 'onnxruntime-gpu[cuda,cudnn]' "
            f"or put CUDA {cuda[0] if cuda else ''} and cuDNN 9 on the library path ({INSTALLING})"
        )
    return None


# -- sessions --------------------------------------------------------------------------------


def provider_options(device: int) -> dict[str, str]:
    """The CUDA execution provider's options for one replica."""
    return {"device_id": str(device), "use_tf32": "1", "cudnn_conv_algo_search": "HEURISTIC"}


def start_session(model: Path | bytes, options: Any, device: int) -> Runner:
    """A session of the tower (a file, or a serialized model) on ``device``; UnsupportedError
    if CUDA does not start."""
    import onnxruntime as ort

    providers = [(PROVIDER, provider_options(device)), "CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(model if isinstance(model, bytes) else str(model), options, providers=providers)
    except Exception as exc:  # noqa: BLE001 - the provider's own reason, named
        raise UnsupportedError(f"the CUDA execution provider cannot start on device {device}: {exc}") from exc
    session.disable_fallback()  # onnxruntime would otherwise rerun a failing call on the CPU, silently
    started = session.get_providers()
    if PROVIDER not in started:
        why = provider_load_error() or "ONNX Runtime's log above says why"
        raise UnsupportedError(
            f"the CUDA execution provider did not start on device {device} (the session got {', '.join(started)}): "
            f"{why}; {INSTALLING}, lists what onnxruntime-gpu needs"
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


def accepts(request: LoadRequest) -> str | None:
    if request.quantization not in (Scalar.F32, Scalar.BF16, Scalar.E4M3):
        return f"holds weights in f32, bf16 (as f32) or e4m3, not {request.quantization}"
    return None


def open_vram(request: LoadRequest) -> Placement:
    """One replica of every tower per device; UnsupportedError names what is available."""
    if COMPUTE not in ("tf32", "f16"):
        raise ValueError(f"uform.plugins.cuda.COMPUTE must be 'tf32' or 'f16', not {COMPUTE!r}")
    reason = probe() or accepts(request)
    if reason is not None:
        raise UnsupportedError(f"cannot place a model in VRAM: {reason}")
    gpus = detect().gpus
    devices = check_devices(request.devices, gpus)
    gpu_class = choose_class(request.gpu_class, [gpus[d] for d in devices])
    e4m3 = request.quantization is Scalar.E4M3
    if e4m3 and gpu_class not in FP8_CLASSES:
        raise UnsupportedError(
            f"quantization e4m3 needs FP8 on the GPU (sm_89 and later: Ada, Hopper, Blackwell); "
            f"devices {devices} run as {gpu_class}: load bf16 instead"
        )
    threads = max(1, min(request.executor.threads, SESSION_THREADS))
    runners: dict[str, Runner] = {}
    held = 0
    for name, tower in request.towers.items():
        if e4m3:
            sessions, bytes_held = _fp8_sessions(tower, devices, threads, request.advance)
        else:
            sessions, bytes_held = _float_sessions(name, tower, devices, session_options(threads), request.advance)
        runners[name] = sessions[0] if len(sessions) == 1 else Replicas(sessions)
        held += bytes_held
    quantization, compute = (
        (Scalar.E4M3, "float32 products of E4M3 weights dequantized on the device (DequantizeLinear)")
        if e4m3
        else (Scalar.F16, "float16 products") if COMPUTE == "f16" else (Scalar.F32, "float32 weights, TF32 products")
    )
    return Placement(runners, held, quantization, gpu_class=gpu_class, batch_scale=BATCH_SCALE * len(devices), compute=compute)


def _float_sessions(name: str, tower: TowerPlan, devices: list[int], options: Any, advance: Callable[[int], None]) -> tuple[list[Runner], int]:
    """Sessions over weights widened to float32 (or float16 products), read from a temporary file."""
    graph, halves = (tower.graph, set()) if COMPUTE != "f16" else half_products(tower.graph, list(tower.weights))
    half_ids = {id(tower.weights[w]) for w in halves}  # bind_external hands convert the stored arrays

    def convert(stored: np.ndarray) -> np.ndarray:
        return _halve(stored) if id(stored) in half_ids else widen(stored)

    sessions = widened_sessions(name, graph, tower.weights, convert, advance, lambda path: [start_session(path, options, d) for d in devices])
    return sessions, sum(w.size * (2 if n in halves else 4) for n, w in tower.weights.items()) * len(sessions)


def _fp8_sessions(tower: TowerPlan, devices: list[int], threads: int, advance: Callable[[int], None]) -> tuple[list[Runner], int]:
    """Sessions over the blocks' matrices as E4M3 codes in VRAM, dequantized before each product."""
    low = dequantize.lower(tower.graph, tower.weights)
    advance(sum(w.nbytes for w in tower.weights.values()))
    model = dequantize.embedded(low)  # each device copies it in
    sessions = [start_session(model, session_options(threads), device) for device in devices]
    return sessions, low.nbytes * len(sessions)


@hookimpl
def uform_backends() -> Iterable[Backend]:
    yield Backend(name="cuda", placement="vram", probe=probe, open=open_vram, priority=0, accepts=accepts)
