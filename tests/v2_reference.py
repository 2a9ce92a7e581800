"""The math of docs/checkpoint.md's version-2 towers in numpy (float64), read from a uform
file: an implementation independent of uform's graphs, so a converted file can be checked
against transformers' features before, and beside, uform's own runtime."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

DT = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32}


def read(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, str]]:
    """The config, every tensor (float64) and the metadata of a uform file."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__")
    body = data[8 + n :]
    tensors = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        tensors[name] = np.frombuffer(body[a:b], DT[e["dtype"]]).reshape(e["shape"]).astype(np.float64)
    return json.loads(meta["uform"]), tensors, meta


def _ln(x: np.ndarray, T: dict[str, np.ndarray], p: str, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * T[p + ".weight"] + T[p + ".bias"]


def _act(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "gelu":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if kind == "quick_gelu":
        return x / (1 + np.exp(-1.702 * x))
    raise ValueError(kind)


def _lin(x: np.ndarray, T: dict[str, np.ndarray], p: str) -> np.ndarray:
    y = x @ T[p + ".weight"].T
    return y + T[p + ".bias"] if p + ".bias" in T else y


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, mask: np.ndarray | None) -> np.ndarray:
    tq, tk, w = q.shape[0], k.shape[0], q.shape[1]
    d = w // heads
    qh, kh, vh = (a.reshape(-1, heads, d).transpose(1, 0, 2) for a in (q, k, v))
    s = qh @ kh.transpose(0, 2, 1) / math.sqrt(d)
    if mask is not None:
        s = s + mask
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return (s @ vh).transpose(1, 0, 2).reshape(tq, w)


def _stack(x: np.ndarray, T: dict[str, np.ndarray], t: str, cfg: dict[str, Any], mask: np.ndarray | None) -> np.ndarray:
    eps, act = cfg.get("layer_norm_eps", 1e-5), cfg.get("activation", "gelu")
    w = cfg["width"]
    for i in range(cfg["depth"]):
        p = f"{t}.blocks.{i}"
        h = _ln(x, T, p + ".ln1", eps)
        qkv = _lin(h, T, p + ".attn.qkv")
        x = x + _lin(_attention(qkv[:, :w], qkv[:, w : 2 * w], qkv[:, 2 * w :], cfg["heads"], mask), T, p + ".attn.out")
        x = x + _lin(_act(_lin(_ln(x, T, p + ".ln2", eps), T, p + ".mlp.fc1"), act), T, p + ".mlp.fc2")
    return _ln(x, T, t + ".ln_final", eps)


def _project(pooled: np.ndarray, T: dict[str, np.ndarray], t: str, cfg: dict[str, Any]) -> np.ndarray:
    kind = cfg.get("projection", "linear")
    e = pooled if kind == "none" else _lin(pooled, T, t + ".projection")
    return e / max(float(np.linalg.norm(e)), 1e-12)


def text(path_or_read: Any, ids: list[list[int]]) -> np.ndarray:
    """Embeddings [B, D] of the token ids (special tokens included, cut to the context)."""
    cfg, T, _ = read(path_or_read) if isinstance(path_or_read, (str, Path)) else path_or_read
    c = cfg["towers"]["text"]
    out = []
    for row in ids:
        row = list(row)
        n = len(row)
        if c.get("pad_to_context"):
            row = row + [c.get("pad_id", 0)] * (c["context"] - n)
        x = T["text.embed.weight"][row] + T["text.pos.weight"][: len(row)]
        mask = None
        if c.get("mask") == "causal":
            mask = np.triu(np.full((len(row), len(row)), -1e9), 1)
        h = _stack(x, T, "text", c, mask)
        pooled = h[n - 1] if c.get("pooling") == "last_token" else h[len(row) - 1]
        out.append(_project(pooled, T, "text", c))
    return np.array(out)


def image(path_or_read: Any, pixels: np.ndarray) -> np.ndarray:
    """Embeddings [B, D] of normalised pixels [B, 3, S, S] (what the image processor gives)."""
    cfg, T, _ = read(path_or_read) if isinstance(path_or_read, (str, Path)) else path_or_read
    c = cfg["towers"]["image"]
    s, p = c["image_size"], c["patch_size"]
    g = s // p
    out = []
    for img in pixels.astype(np.float64):
        patches = img.reshape(3, g, p, g, p).transpose(1, 3, 0, 2, 4).reshape(g * g, 3 * p * p)
        x = _lin(patches, T, "image.patch")
        eps = c.get("layer_norm_eps", 1e-5)
        if c.get("class_token", True):
            x = np.concatenate([T["image.cls"][None], x]) + T["image.pos.weight"]
        else:
            x = x + T["image.pos.weight"]
        if c.get("ln_pre"):
            x = _ln(x, T, "image.ln_pre", eps)
        h = _stack(x, T, "image", c, None)
        if c.get("pooling", "class") == "attention":
            w = c["width"]
            qkv_w, qkv_b = T["image.pool.attn.qkv.weight"], T["image.pool.attn.qkv.bias"]
            q = T["image.pool.probe"][None] @ qkv_w[:w].T + qkv_b[:w]
            k = h @ qkv_w[w : 2 * w].T + qkv_b[w : 2 * w]
            v = h @ qkv_w[2 * w :].T + qkv_b[2 * w :]
            o = _lin(_attention(q, k, v, c["heads"], None), T, "image.pool.attn.out")
            o = o + _lin(_act(_lin(_ln(o, T, "image.pool.ln", eps), T, "image.pool.mlp.fc1"), c.get("activation", "gelu")), T, "image.pool.mlp.fc2")
            pooled = o[0]
        else:
            pooled = h[0]
        out.append(_project(pooled, T, "image", c))
    return np.array(out)
