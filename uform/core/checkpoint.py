"""Opening checkpoints, and making new ones deterministically from presets and a seed."""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np

from . import safetensors
from .config import ModelConfig, make_config
from .errors import CheckpointError, UnsupportedError
from .host import Host

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"dimensions": 32, "context": 32},
    "small": {"dimensions": 256, "context": 128},
    "base": {"dimensions": 512, "context": 512},
}


def map_file(path: str | os.PathLike[str]) -> mmap.mmap:
    """A read-only map of a checkpoint file; errors name the path and the reason."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise CheckpointError(f"{p}: the file is empty")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except IsADirectoryError:
        raise CheckpointError(f"{p}: is a directory, not a checkpoint file") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no such checkpoint file") from None


def new(
    host: Host, preset: str, seed: int, modalities: Sequence[str] | None = None
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """A random-initialised checkpoint: the same arguments always give the same tensors.

    Each tensor is drawn from its own generator, seeded by ``seed`` and the tensor's name,
    so the values do not depend on which other towers are present.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    chosen = list(host.modalities) if modalities is None else list(modalities)
    unknown = [m for m in chosen if m not in host.modalities]
    if unknown:
        raise UnsupportedError(f"no installed plugin provides the modalities {unknown}; installed: {sorted(host.modalities)}")
    if not chosen:
        raise ValueError("a checkpoint needs one modality at least")
    towers = {host.modalities[m].tower.name: host.modalities[m].tower for m in sorted(chosen)}
    shape = PRESETS[preset]
    config = make_config(shape["dimensions"], shape["context"], {name: t.presets[preset] for name, t in towers.items()})
    tensors: dict[str, np.ndarray] = {}
    for name, tower in towers.items():
        parsed = tower.read(config.towers[name], config)
        for tensor, spec in tower.tensors(parsed, config).items():
            digest = hashlib.sha256(f"{seed}:{tensor}".encode()).digest()
            rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            values = rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(spec.std) + np.float32(spec.mean)
            tensors[tensor] = values.astype(ml_dtypes.bfloat16)
    return config, tensors


def save(path: str | os.PathLike[str], config: ModelConfig, tensors: dict[str, np.ndarray]) -> None:
    """Write a checkpoint: tensors BF16, config JSON in ``__metadata__["uform"]``."""
    safetensors.write(path, tensors, config.to_metadata())
