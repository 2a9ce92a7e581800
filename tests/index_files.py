"""What the index tests share: the tiny text-and-image checkpoints (the ``ckpt`` and ``other_ckpt``
fixtures, and ``model`` loaded from the first), pictures made on the spot (picture, photos), an
image's embedding by the model's own verb, an index's stored rows, and Reads (the files an update
opens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import uform
import uform.index.update as update
from ckpt import make_checkpoint
from uform.index import Index


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.safetensors", "tiny", 0, ["text", "image"])


@pytest.fixture(scope="module")
def other_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "other.safetensors", "tiny", 1, ["text", "image"])


@pytest.fixture(scope="module")
def model(ckpt: Path) -> Iterator[uform.Model]:
    with uform.Model.load_ram(ckpt) as m:
        yield m


def picture(seed: int, size: int = 24) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))


def photos(root: Path, count: int = 6, start: int = 0) -> Path:
    (root / "sub").mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        picture(i).save(root / ("sub" if i % 2 else "") / f"p{i}.png")
    return root


def embedding(model: uform.Model, path: Path) -> np.ndarray:
    return np.array(model.image_encode([str(path)], uform.Arena()).embeddings[0])


def stored(index: Index) -> dict[str, np.ndarray]:
    return {e.path: e.embedding for e in index.entries()}


class Reads:
    """Counts the files an update opens (``uform.index.update.read``), optionally acting first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, before: Any = None) -> None:
        self.paths: list[str] = []
        real = update.read

        def read(path: str) -> Any:
            self.paths.append(path)
            if before is not None:
                before(path)
            return real(path)

        monkeypatch.setattr(update, "read", read)
