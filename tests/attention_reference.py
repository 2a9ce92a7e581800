"""Attention in float64 numpy: what the op library's attention kernels are checked against
(tests/test_e4m3_attention.py, tests/test_attention_tiles.py)."""

from __future__ import annotations

import numpy as np


def attention_reference(qkv: np.ndarray, items: int, heads: int, mask: np.ndarray | None, causal: bool) -> np.ndarray:
    rows, triple = qkv.shape
    tokens, width = rows // items, triple // 3
    x = qkv.reshape(items, tokens, 3, heads, width // heads).astype(np.float64)
    q, k, v = (x[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(width // heads)
    if mask is not None:
        scores = scores + (mask[None, None] if causal else mask[:, None, None, :])
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return (weights @ v).transpose(0, 2, 1, 3).reshape(rows, width)
