"""PyTorch reference of the text tower (docs/checkpoint.md, "Text tower")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from uform.core.config import Geometry, ModelConfig

from .blocks import Stack, normalize, padding_mask, with_class_token


class TextTower(Stack):
    def __init__(self, cfg: Mapping[str, Any], model: ModelConfig) -> None:
        g = Geometry.read(cfg, "towers.text")
        super().__init__(g)
        self.embed = nn.Embedding(256, g.width)
        self.cls = nn.Parameter(torch.zeros(g.width))
        self.pos = nn.Embedding(model.context + 1, g.width)
        self.projection = nn.Linear(g.width, model.dimensions, bias=False)
        self.token_width = int(cfg.get("token_width", 0))
        if self.token_width:
            self.token_head = nn.Linear(g.width, self.token_width, bias=False)
        self.context = model.context

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``ids`` [B, L] bytes zero-padded, ``lengths`` [B] → embeddings [B, D], tokens [B, L, tw]."""
        length = ids.shape[1]
        x = self.embed(ids) + self.pos.weight[1 : length + 1]
        x = with_class_token(x, self.cls, self.pos.weight[0])
        hidden = self.run(x, padding_mask(lengths + 1, length + 1), every_token=bool(self.token_width))
        embeddings = normalize(self.projection(hidden[:, 0]))
        tokens = normalize(self.token_head(hidden[:, 1:])) if self.token_width else None
        return embeddings, tokens

    def encode(self, texts: Sequence[bytes]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Embeddings [N, D] and per-text token vectors for byte strings, truncated at context."""
        chunks = [t[: self.context] for t in texts]
        width = max((len(c) for c in chunks), default=0)
        ids = torch.zeros(len(chunks), width, dtype=torch.long)
        for i, c in enumerate(chunks):
            ids[i, : len(c)] = torch.tensor(list(c), dtype=torch.long)
        lengths = torch.tensor([len(c) for c in chunks], dtype=torch.long)
        embeddings, tokens = self(ids, lengths)
        rows = [tokens[i, : len(c)] for i, c in enumerate(chunks)] if tokens is not None else []
        return embeddings, rows
