"""CUDA devices and GPU classes: what this process sees, and the class every device runs.

Devices are read from the CUDA driver (``libcuda``, which honours ``CUDA_VISIBLE_DEVICES``
itself), else from ``nvidia-smi``, renumbered by ``CUDA_VISIBLE_DEVICES`` as CUDA does. A
device runs every :class:`~uform.GPUClass` at or below its compute capability; a load runs
as the best class every chosen device runs, or as the pin when every device can.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from uform.core.errors import UnsupportedError
from uform.core.types import GPUClass, gpu_devices, pin

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
    pinned = pin(pinned, GPUClass, "gpu_class")
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
    chosen = gpu_devices(devices)
    missing = [d for d in chosen if not 0 <= d < len(gpus)]
    if missing:
        have = ", ".join(str(g) for g in gpus) or "none"
        raise UnsupportedError(f"CUDA devices {missing} do not exist; this process sees {len(gpus)}: {have}")
    return chosen
