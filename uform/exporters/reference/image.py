"""PyTorch reference of the image tower (docs/checkpoint.md, "Image tower")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from uform.core.config import Geometry, ModelConfig
from uform.core.errors import CheckpointError

from .blocks import Stack, normalize, with_class_token


def pixel_geometry(cfg: Mapping[str, Any], where: str) -> tuple[int, int, list[float], list[float]]:
    size, patch = int(cfg["image_size"]), int(cfg["patch_size"])
    if size % patch and cfg.get("patch_remainder", "exact") != "drop":
        raise CheckpointError(f"config field {where}.patch_size: {patch} does not divide image_size {size}")
    return size, patch, [float(v) for v in cfg["mean"]], [float(v) for v in cfg["std"]]


def patches(pixels: torch.Tensor, patch: int, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``uint8 [N, S, S, 3]`` → ``[N, G², 3P²]``: ``(x / 255 − mean) / std``, patches in row-major
    order, each flattened in (channel, row, column) order."""
    x = (pixels.to(mean.dtype) / 255 - mean) / std
    n, s = x.shape[0], x.shape[1]
    g = s // patch
    x = x[:, : g * patch, : g * patch]  # patch_remainder 'drop': the last S % P rows and columns are in no patch
    x = x.reshape(n, g, patch, g, patch, 3).permute(0, 1, 3, 5, 2, 4)
    return x.reshape(n, g * g, 3 * patch * patch)


class ImageTower(Stack):
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, cfg: Mapping[str, Any], model: ModelConfig) -> None:
        g = Geometry.read(cfg, "towers.image")
        super().__init__(g)
        self.image_size, self.patch_size, mean, std = pixel_geometry(cfg, "towers.image")
        grid = self.image_size // self.patch_size
        self.patch = nn.Linear(3 * self.patch_size**2, g.width)
        self.cls = nn.Parameter(torch.zeros(g.width))
        self.pos = nn.Embedding(1 + grid * grid, g.width)
        self.projection = nn.Linear(g.width, model.dimensions, bias=False)
        self.register_buffer("mean", torch.tensor(mean), persistent=False)
        self.register_buffer("std", torch.tensor(std), persistent=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """``pixels`` uint8 [B, S, S, 3] (preprocessed) → embeddings [B, D]."""
        x = self.patch(patches(pixels, self.patch_size, self.mean, self.std)) + self.pos.weight[1:]
        hidden = self.run(with_class_token(x, self.cls, self.pos.weight[0]))
        return normalize(self.projection(hidden[:, 0]))
