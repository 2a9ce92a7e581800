"""Shared fixtures: small checkpoints made on the spot, never downloaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt import make_checkpoint

# PyTorch's OpenMP threads spin between parallel regions by default: with the README's `-n auto`
# (a process a CPU), each process's spinning threads took the CPUs another process's threads were
# waiting for, and torch's tests ran slower on two processes than on one (tests/test_training.py:
# 69 s alone, 117 s with -n 2). Waiting threads sleep instead; the thread counts are as they were.
# Set here, before any test imports torch, and inherited by the Pythons the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def tiny_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint with the text tower only (token head included)."""
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-text.safetensors", "tiny", 0, ["text"])


@pytest.fixture(scope="module")
def tiny_all(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random checkpoint of every installed modality, ``tiny-all.safetensors`` (the
    mechanics do not need a trained one), made once a module."""
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-all.safetensors", "tiny", 0, None)


@pytest.fixture(scope="session")
def tiny_model(tiny_text: Path):  # type: ignore[no-untyped-def]
    import uform

    return uform.Model.load_ram(tiny_text)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CLIP model folder, ``tiny-clip``, as transformers saves it (tests/hf_models.py: random
    weights, no download), made once a module; a test edits a copy of it."""
    import hf_models

    return hf_models.make_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")


@pytest.fixture(scope="module")
def clip_file(clip_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``clip_dir`` converted to float32 by ``uform convert``."""
    from uform.convert import convert

    out = tmp_path_factory.mktemp("out") / "clip.safetensors"
    convert(clip_dir, out, dtype="f32")
    return out
