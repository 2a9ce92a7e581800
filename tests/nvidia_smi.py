"""The captured nvidia-smi outputs (tests/data/nvidia) as the cuda tests read them, and the
GPU classes they name."""

from __future__ import annotations

from pathlib import Path

from uform import GPUClass
from uform.plugins.sessions import gpus as gpu_info


DATA = Path(__file__).parent / "data" / "nvidia"
SM80, SM86, SM89, SM90, SM100 = GPUClass.SM80, GPUClass.SM86, GPUClass.SM89, GPUClass.SM90, GPUClass.SM100


def gpus(name: str) -> list[gpu_info.GPU]:
    return gpu_info.parse_nvidia_smi((DATA / name).read_text())
