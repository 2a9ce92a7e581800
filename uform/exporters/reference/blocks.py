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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, first: bool = False) -> torch.Tensor:
        """[B, T, W] → [B, T, W]; with ``first``, the first token's output alone ([B, 1, W])."""
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if first:
            q = q[:, :, :1]
            mask = mask[:1] if mask is not None and mask.dim() == 2 else mask  # a causal mask's first row
        scores = (q / math.sqrt(self.head_dim)) @ k.transpose(-1, -2)
        if mask is not None:
            scores = scores + mask
        context = scores.softmax(-1).to(v.dtype) @ v  # a bf16 or fp16 model's scores were widened by the float32 mask
        return self.out(context.transpose(1, 2).reshape(b, q.shape[2], w))


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, first: bool = False) -> torch.Tensor:
        """With ``first``, the first token's output alone ([B, 1, W]): keys and values from
        every token, its query, output projection and MLP alone (the same math for it)."""
        mine = x[:, :1] if first else x
        mine = mine + self.attn(self.ln1(x), mask, first)
        return mine + self.mlp(self.ln2(mine))


class Stack(nn.Module):
    """``blocks.*`` then ``ln_final``; the base of every tower module.

    ``class_token_only`` (off: the reference runs every token, as docs/checkpoint.md writes
    the math): the last block runs for the first token alone and ``run`` answers [B, 1, W],
    for a tower whose caller reads its class token only (training sets it: the same loss and
    gradients for a quarter of the last block)."""

    class_token_only = False

    def __init__(self, g: Geometry) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(g) for _ in range(g.depth))
        self.ln_final = nn.LayerNorm(g.width, eps=LAYER_NORM_EPS)

    def run(self, x: torch.Tensor, mask: torch.Tensor | None = None, every_token: bool = False) -> torch.Tensor:
        """The stack over ``x`` [B, T, W]: [B, T, W], or [B, 1, W] with ``class_token_only``
        (unless ``every_token``: a caller that reads every token)."""
        last = len(self.blocks) - 1 if self.class_token_only and not every_token else -1
        for i, block in enumerate(self.blocks):
            x = block(x, mask, i == last)
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
