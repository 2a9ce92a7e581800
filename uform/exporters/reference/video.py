"""PyTorch reference of the video tower (docs/checkpoint.md, "Video tower")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from uform.core.config import Geometry, ModelConfig

from .blocks import Stack, normalize, with_class_token
from .image import patches, pixel_geometry


class VideoTower(Stack):
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, cfg: Mapping[str, Any], model: ModelConfig) -> None:
        g = Geometry.read(cfg, "towers.video")
        super().__init__(g)
        self.image_size, self.patch_size, mean, std = pixel_geometry(cfg, "towers.video")
        self.frames = int(cfg["frames"])
        grid = self.image_size // self.patch_size
        self.patch = nn.Linear(3 * self.patch_size**2, g.width)
        self.cls = nn.Parameter(torch.zeros(g.width))
        self.pos = nn.Embedding(1 + grid * grid, g.width)
        self.time = nn.Embedding(self.frames, g.width)
        self.projection = nn.Linear(g.width, model.dimensions, bias=False)
        self.register_buffer("mean", torch.tensor(mean), persistent=False)
        self.register_buffer("std", torch.tensor(std), persistent=False)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """``frames`` uint8 [B, F, S, S, 3] (sampled, preprocessed) → embeddings [B, D]."""
        b, f, s = frames.shape[0], frames.shape[1], frames.shape[2]
        x = self.patch(patches(frames.reshape(b * f, s, s, 3), self.patch_size, self.mean, self.std))
        x = x.reshape(b, f, -1, x.shape[-1]) + self.pos.weight[1:] + self.time.weight[:, None, :]
        hidden = self.run(with_class_token(x.reshape(b, -1, x.shape[-1]), self.cls, self.pos.weight[0]))
        return normalize(self.projection(hidden[:, 0]))
