"""Small public value types: scalars, hardware classes, output selections, descriptions."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple, TypeVar


class Scalar(str, enum.Enum):
    """A numeric type for weights (``quantization``) or for outputs (``outputs_scalar``)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    I8 = "i8"
    B1 = "b1"

    def __str__(self) -> str:
        return self.value


class CPUClass(str, enum.Enum):
    """Instruction-set levels a RAM model can be packed for, lowest first per architecture."""

    X86_64_V2 = "x86-64-v2"  # SSE4.2, POPCNT
    X86_64_V3 = "x86-64-v3"  # AVX2, FMA, F16C
    X86_64_V4 = "x86-64-v4"  # AVX-512 F/BW/CD/DQ/VL
    X86_64_V4_VNNI_BF16 = "x86-64-v4+vnni+bf16"  # AVX-512 VNNI and AVX-512 BF16
    X86_64_AMX = "x86-64-amx"  # AMX tiles with BF16 and INT8
    ARM64_NEON = "arm64-neon"
    ARM64_SVE = "arm64-sve"

    def __str__(self) -> str:
        return self.value


class GPUClass(str, enum.Enum):
    """NVIDIA compute capabilities a VRAM model can run as."""

    SM80 = "sm_80"  # Ampere A100
    SM86 = "sm_86"  # Ampere RTX 30, A10, A40
    SM89 = "sm_89"  # Ada L4, L40, RTX 40
    SM90 = "sm_90"  # Hopper H100, H200
    SM100 = "sm_100"  # Blackwell B200
    SM120 = "sm_120"  # Blackwell RTX 50

    def __str__(self) -> str:
        return self.value


Pin = TypeVar("Pin", CPUClass, GPUClass)


def pin(value: object, kind: type[Pin], what: str) -> Pin:
    """``value`` (the enum or its string value) as a ``kind`` pin; ValueError naming ``what``
    and the choices otherwise."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not a {kind.__name__}; choose one of {', '.join(c.value for c in kind)}") from None


def gpu_devices(devices: Sequence[int] | None) -> list[int]:
    """``devices`` (default ``[0]``) as distinct ordinals, judged before any backend looks for
    CUDA: a caller's mistake is the same error on a machine with GPUs and on one without."""
    chosen = [0] if devices is None else devices
    if isinstance(chosen, (str, bytes)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in chosen):
        raise TypeError(f"devices must be a sequence of CUDA device ordinals (int), got {devices!r}")
    chosen = list(chosen)
    if not chosen:
        raise ValueError("devices is empty; name one CUDA device at least, e.g. devices=[0]")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"devices {chosen} names a device twice")
    return chosen


class Outputs(enum.Flag):
    """What an encode call writes: pooled embeddings, per-token vectors, or both."""

    EMBEDDINGS = enum.auto()
    TOKENS = enum.auto()


class ModelDescription(NamedTuple):
    """What a loaded model reports about itself (a tuple of 8 named fields)."""

    dimensions: int
    """Scalars per embedding row; Matryoshka prefixes of it are embeddings too."""
    context: int
    """Tokens (bytes) one text may span before it is truncated."""
    quantization: Scalar
    """The scalar the transformer blocks' weights are held in."""
    memory_usage: int
    """Bytes the model holds; activations are the executor's."""
    cpu_class: CPUClass | None
    """The class a RAM model was packed for, or None for a VRAM model."""
    gpu_class: GPUClass | None
    """The class every replica of a VRAM model runs as, or None for a RAM model."""
    token_width: int
    """Scalars per token vector; 0 when the checkpoint carries no token head."""
    choice_temperature_groups: int
    """Question types text_choose was calibrated over: 0 without the byte decoder, 1 uncalibrated."""
