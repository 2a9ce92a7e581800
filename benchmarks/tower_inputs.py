"""What the tower benchmarks (lowp.py, tower_profile.py) feed and load: texts of equal length,
random pictures of a tower's size, and a uform run's model as lowp.py names runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

TEXT_BYTES = 86


def texts(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    words = "a red circle moves left while two blue squares rest under the bright yellow star".split()
    out = []
    for _ in range(n):
        line = " ".join(rng.choice(words, 40))
        out.append(line[:TEXT_BYTES].ljust(TEXT_BYTES).encode())
    return out


def pictures(path: Path, n: int) -> np.ndarray:
    """``n`` random pictures of the image tower's size in the checkpoint at ``path``."""
    from uform.core.config import ModelConfig
    from uform.core.safetensors import parse

    size = int(ModelConfig.from_metadata(parse(memoryview(path.read_bytes())).metadata).towers["image"]["image_size"])
    return np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def load(run: str, path: Path) -> Any:
    """The model a uform run (or ``ort int8 nbits``) names: its weights and, in brackets, a
    pinned CPU class."""
    import uform

    name, _, pin = run.partition(" [")
    quantization = {"uform f32": "f32", "uform bf16": "bf16", "ort int8 nbits": "i8"}.get(name, "e4m3")
    return uform.Model.load_ram(path, quantization=quantization, cpu_class=uform.CPUClass(pin.rstrip("]")) if pin else None)
