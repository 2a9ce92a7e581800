"""PyTorch reference of the byte decoder (docs/checkpoint.md, "Byte decoder")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from uform.core.config import Geometry, ModelConfig

from .blocks import Stack, causal_mask

BEGIN = 256


class DecoderTower(Stack):
    """A causal byte model: next-byte logits after each text, and ``text_choose``'s math."""

    def __init__(self, cfg: Mapping[str, Any], model: ModelConfig) -> None:
        g = Geometry.read(cfg, "towers.decoder")
        super().__init__(g)
        self.embed = nn.Embedding(257, g.width)
        self.pos = nn.Embedding(model.context + 1, g.width)
        self.head = nn.Linear(g.width, 256)
        self.context = model.context
        self.temperatures = tuple(model.choice_temperatures)

    def forward(self, ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """``ids`` [B, T] (begin token first, zero right-padded), ``last`` [B] → logits [B, 256]."""
        tokens = ids.shape[1]
        x = self.embed(ids) + self.pos.weight[:tokens]
        hidden = self.run(x, causal_mask(tokens), every_token=True)
        return self.head(hidden[torch.arange(ids.shape[0]), last])

    def logits(self, texts: Sequence[bytes]) -> torch.Tensor:
        """Next-byte logits [N, 256] for byte strings, each cut to its last ``context`` bytes."""
        chunks = [t[max(0, len(t) - self.context) :] for t in texts]
        width = max((len(c) for c in chunks), default=0)
        ids = torch.zeros(len(chunks), width + 1, dtype=torch.long)
        ids[:, 0] = BEGIN
        for i, c in enumerate(chunks):
            ids[i, 1 : len(c) + 1] = torch.tensor(list(c), dtype=torch.long)
        return self(ids, torch.tensor([len(c) for c in chunks], dtype=torch.long))

    def choose(self, texts: Sequence[bytes], choices: Sequence[bytes], groups: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Per text, the softmax over its choice bytes of ``logits / choice_temperatures[group]``."""
        logits = self.logits(texts)
        groups = [0] * len(texts) if groups is None else groups
        rows = []
        for i, (choice, g) in enumerate(zip(choices, groups)):
            rows.append((logits[i, list(choice)] / self.temperatures[g]).softmax(-1))
        return rows
