"""PyTorch modules of the math every tower shares (docs/checkpoint.md, "Blocks").

Attribute names mirror the checkpoint's tensor names, so a tower's ``state_dict`` keys are
exactly its tensors without the tower prefix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from uform.core.config import LAYER_NORM_EPS, Geometry

NEG_INF = -1e9


class Attention(nn.Module):
    def __init__(self, g: Geometry) -> None:
        super().__init__()
        self.heads, self.head_dim = g.heads, g.head_dim
        self.qkv = nn.Linear(g.width, 3 * g.width)
        self.out = nn.Linear(g.width, g.width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scores = (q / math.sqrt(self.head_dim)) @ k.transpose(-1, -2)
        if mask is not None:
            scores = scores + mask
        context = scores.softmax(-1) @ v
        return self.out(context.transpose(1, 2).reshape(b, t, w))


class MLP(nn.Module):
    def __init__(self, g: Geometry) -> None:
        super().__init__()
        self.fc1 = nn.Linear(g.width, g.mlp_width)
        self.fc2 = nn.Linear(g.mlp_width, g.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, g: Geometry) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(g.width, eps=LAYER_NORM_EPS)
        self.attn = Attention(g)
        self.ln2 = nn.LayerNorm(g.width, eps=LAYER_NORM_EPS)
        self.mlp = MLP(g)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class Stack(nn.Module):
    """``blocks.*`` then ``ln_final``; the base of every tower module."""

    def __init__(self, g: Geometry) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(g) for _ in range(g.depth))
        self.ln_final = nn.LayerNorm(g.width, eps=LAYER_NORM_EPS)

    def run(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_final(x)


def padding_mask(lengths: torch.Tensor, tokens: int) -> torch.Tensor:
    """Additive [B, 1, 1, T] mask: 0 where ``position < lengths[b]``, -1e9 elsewhere."""
    invalid = torch.arange(tokens)[None, :] >= lengths[:, None]
    return (invalid.float() * NEG_INF)[:, None, None, :]


def causal_mask(tokens: int) -> torch.Tensor:
    """Additive [T, T] mask: -1e9 above the diagonal."""
    return torch.triu(torch.ones(tokens, tokens), diagonal=1) * NEG_INF


def normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def with_class_token(x: torch.Tensor, cls: torch.Tensor, pos0: torch.Tensor) -> torch.Tensor:
    """``[cls + pos[0], x...]`` along tokens for ``x`` [B, T, W]."""
    first = (cls + pos0).expand(x.shape[0], 1, -1)
    return torch.cat([first, x], dim=1)
