"""SigLIP 2 NaFlex pictures: each picture resized to the grid of patches its aspect ratio gives,
cut into patches, and the position table resized to that grid (docs/checkpoint.md, "Image tower").

The grid (:func:`grid_for`) is transformers' ``get_image_size_for_max_num_patches``: one scale
for both sides, found by a binary search, each side ``max(P, ceil(side · scale / P) · P)``,
the scale at most 100, the patches at most ``max_patches``. The picture is resized to
``gh·P x gw·P`` with Pillow's bilinear filter, no crop (``Siglip2ImageProcessorPil``'s pixels,
level for level). The position table, a ``G0 x G0`` grid, is resized to ``gh x gw`` by a matrix
(:func:`positions`, ``[gh·gw, G0²]``) fed to the graph: bilinear, antialiased, corners not
aligned, as ``F.interpolate`` computes it (to 1.4e-7). ONNX Runtime's antialiased ``Resize``
is not torch's where it shrinks (16 to 2: cosine 0.99995 on a 2000x40 strip), so it is not used.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image

MAX_SCALE = 100.0  # transformers' bound on the scale (a 1x1 picture is 7x7 patches at 16/256)
EPS = 1e-5  # the binary search's stopping width, transformers'


def grid_for(height: int, width: int, patch: int, max_patches: int) -> tuple[int, int]:
    """``(rows, columns)`` of patches a ``width x height`` picture is resized to."""

    def scaled(scale: float, size: int) -> int:
        return max(patch, math.ceil(size * scale / patch) * patch)

    lo, hi = EPS / 10, MAX_SCALE
    while hi - lo >= EPS:
        mid = (lo + hi) / 2
        if (scaled(mid, height) // patch) * (scaled(mid, width) // patch) <= max_patches:
            lo = mid
        else:
            hi = mid
    return scaled(lo, height) // patch, scaled(lo, width) // patch


def _axis(n: int, g0: int) -> np.ndarray:
    """``[n, g0]``: the weights of one axis of an antialiased bilinear resize from ``g0`` to ``n``."""
    scale = g0 / n
    support = max(scale, 1.0)
    center = (np.arange(n) + 0.5) * scale - 0.5
    w = np.clip(1 - np.abs(np.arange(g0)[None, :] - center[:, None]) / support, 0, None)
    out: np.ndarray = w / w.sum(1, keepdims=True)
    return out


@functools.lru_cache(maxsize=64)
def positions(rows: int, columns: int, g0: int) -> np.ndarray:
    """``float32 [rows·columns, g0²]``: the position table's ``g0 x g0`` grid resized to
    ``rows x columns`` (read-only; a few common photo shapes fall on few grids, so it is cached)."""
    out: np.ndarray = np.einsum("ia,jb->ijab", _axis(rows, g0), _axis(columns, g0)).reshape(rows * columns, g0 * g0).astype(np.float32)
    out.setflags(write=False)
    return out


def fit_image(image: Image.Image, patch: int, max_patches: int, bicubic: bool = False) -> Image.Image:
    """The picture resized (bilinear, as SigLIP 2's processor does, or bicubic; no crop) to its grid, in its own mode."""
    rows, columns = grid_for(image.height, image.width, patch, max_patches)
    return resize_to(image, rows * patch, columns * patch, bicubic)


def resize_to(image: Image.Image, height: int, width: int, bicubic: bool = False) -> Image.Image:
    """The picture resized (bilinear or bicubic, no crop) to ``width x height``, in its own mode."""
    from PIL import Image

    resample = Image.Resampling.BICUBIC if bicubic else Image.Resampling.BILINEAR
    return image if image.size == (width, height) else image.resize((width, height), resample)


def patches(fitted: np.ndarray, patch: int) -> np.ndarray:
    """``uint8 [gh·P, gw·P, 3]`` → ``uint8 [gh·gw, 3·P²]``: patches in row order, each flattened
    in (channel, row, column) order, as the image tower's patch weights are."""
    h, w = fitted.shape[0] // patch, fitted.shape[1] // patch
    out: np.ndarray = fitted.reshape(h, patch, w, patch, 3).transpose(0, 2, 4, 1, 3).reshape(h * w, 3 * patch * patch)
    return out


def grid_of(fitted: np.ndarray, patch: int) -> tuple[int, int]:
    return fitted.shape[0] // patch, fitted.shape[1] // patch
