"""Making test checkpoints (tests import this as ``from ckpt import make_checkpoint``)."""

from __future__ import annotations

from pathlib import Path

from uform.core import checkpoint
from uform.core.host import get_host


def make_checkpoint(path: Path, preset: str = "tiny", seed: int = 0, modalities: list[str] | None = None) -> Path:
    """Write a random-initialised checkpoint of ``modalities`` (all installed when None)."""
    config, tensors = checkpoint.new(get_host(), preset, seed, modalities)
    checkpoint.save(path, config, tensors)
    return path
