"""What the image and video plugins share: pixel geometry, preprocessing, inputs, patch tokens.

Preprocessing (docs/checkpoint.md, "Image tower"): an 8-bit RGB picture is resized with
Pillow's bicubic filter so that its shorter side is ``S`` (the longer side rounded half up),
then its central ``S x S`` square is cut out. Both image verbs and every video frame go
through :func:`fit`, so equal RGB pixels always give equal tower inputs, byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from uform.core.config import Geometry, integer, numbers
from uform.core.errors import CheckpointError
from uform.core.graph import GraphBuilder

if TYPE_CHECKING:
    from PIL import Image

MAX_IMAGE_SIZE = 4096  # bound on a tower's S, so a hostile config cannot ask for absurd inputs
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


@dataclass(frozen=True)
class Pixels:
    """A tower's pixel geometry: ``S``, ``P`` and the per-channel normalisation."""

    image_size: int
    patch_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def grid(self) -> int:
        """``G``: patches per side."""
        return self.image_size // self.patch_size

    @classmethod
    def read(cls, cfg: Mapping[str, Any], where: str) -> Pixels:
        size = integer(cfg, "image_size", where, 1, MAX_IMAGE_SIZE)
        patch = integer(cfg, "patch_size", where, 1, size)
        if size % patch:
            raise CheckpointError(f"config field {where}.patch_size: {patch} does not divide image_size {size}")
        mean = numbers(cfg, "mean", where, 3, -1000.0, 1000.0)
        std = numbers(cfg, "std", where, 3, 1e-6, 1000.0)
        return cls(size, patch, mean, std)


def read_geometry(cfg: Mapping[str, Any], where: str) -> tuple[Geometry, Pixels]:
    return Geometry.read(cfg, where), Pixels.read(cfg, where)


def patch_tokens(b: GraphBuilder, pixels: str, prefix: str, px: Pixels, width: int) -> str:
    """``uint8 [N, S, S, 3]`` → ``[N, G², W]``: normalised, cut into patches flattened in
    (channel, row, column) order, each through ``prefix.patch`` (one Gemm)."""
    s, p, g = px.image_size, px.patch_size, px.grid
    x = b.op("Cast", pixels, to=b.float_type)
    x = b.op("Div", x, b.scalar(255.0))
    x = b.op("Sub", x, b.const(np.asarray(px.mean, np.float32), "mean"))
    x = b.op("Div", x, b.const(np.asarray(px.std, np.float32), "std"))
    x = b.op("Reshape", x, b.ints([-1, g, p, g, p, 3]))  # [N, gy, py, gx, px, c]
    x = b.op("Transpose", x, perm=[0, 1, 3, 5, 2, 4])  # [N, gy, gx, c, py, px]
    x = b.linear(b.op("Reshape", x, b.ints([-1, 3 * p * p])), f"{prefix}.patch")
    return b.op("Reshape", x, b.ints([-1, g * g, width]))  # type: ignore[no-any-return]


def pixels_input(b: GraphBuilder, name: str, dims: list[int | str]) -> str:
    return b.input(name, TensorProto.UINT8, dims)


# -- preprocessing ---------------------------------------------------------------------


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """The size after the resize: shorter side ``size``, longer side ``round_half_up(side * size / shorter)``."""
    if width <= height:
        return size, max(1, (2 * height * size + width) // (2 * width))
    return max(1, (2 * width * size + height) // (2 * height)), size


def fit(image: Image.Image, size: int) -> np.ndarray:
    """An RGB picture as the tower's ``uint8 [size, size, 3]``: bicubic resize, central crop."""
    from PIL import Image

    target = resized_size(image.width, image.height, size)
    if target != image.size:
        image = image.resize(target, Image.Resampling.BICUBIC)
    array = np.asarray(image)
    top, left = (target[1] - size) // 2, (target[0] - size) // 2
    return np.ascontiguousarray(array[top : top + size, left : left + size])


def from_array(array: np.ndarray) -> Image.Image:
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(array), mode="RGB")
