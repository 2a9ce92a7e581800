"""Shared fixtures: small checkpoints made on the spot, never downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt import make_checkpoint


@pytest.fixture(scope="session")
def tiny_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint with the text tower only (token head included)."""
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-text.safetensors", "tiny", 0, ["text"])


@pytest.fixture(scope="session")
def tiny_model(tiny_text: Path):  # type: ignore[no-untyped-def]
    import uform

    return uform.Model.load_ram(tiny_text)
