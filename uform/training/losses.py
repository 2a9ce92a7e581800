"""The towers' losses: every meaning's fixed target (:func:`prototypes`), the contrastive loss
against them, the text tower's embeddings of the captions, and the clips' losses with their
auxiliary ones (where the moving shape is, and looking at it).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from uform.demo.variety.captions import meanings
from uform.exporters.reference.blocks import Block, normalize, with_class_token
from uform.exporters.reference.image import patches
from uform.exporters.reference.text import TextTower
from uform.exporters.reference.video import VideoTower

from .settings import MODALITIES
from .steps import towers_in_bf16


def prototypes(dimensions: int, seed: int) -> dict[str, torch.Tensor]:
    """Every meaning's target embedding, fixed for the run: the normalised sum of a random
    vector for each of its attributes' values (colour and shape share theirs between
    pictures and clips; counts, directions and the sounds' kind, pitch and rhythm have their
    own). Meanings that differ in one attribute of three are at cosine 2/3."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    vectors: dict[tuple[str, str], torch.Tensor] = {}

    def vector(kind: str, value: str) -> torch.Tensor:
        if (kind, value) not in vectors:
            vectors[kind, value] = torch.randn(dimensions, generator=generator)
        return vectors[kind, value]

    kinds = {"image": ("colour", "shape", "count"), "video": ("colour", "shape", "direction"), "audio": ("sound", "pitch", "rhythm")}
    out = {}
    for modality in MODALITIES:
        rows = [sum((vector(k, a) for k, a in zip(kinds[modality], m.attributes) if a), torch.zeros(dimensions)) for m in meanings(modality)]
        out[modality] = F.normalize(torch.stack(rows), dim=1)
    return out


def text_embeddings(tower: TextTower, captions: list[str], groups: int = 1) -> torch.Tensor:
    """The text tower's embeddings of ``captions``, in their order; with ``groups`` > 1 encoded
    in that many groups of like length (sorted by length: each group is padded only to its own
    longest), which gives the same embeddings with less padding."""
    if groups <= 1 or len(captions) < 2 * groups:
        embeddings, _ = tower.encode([c.encode() for c in captions])
        return embeddings
    data = [c.encode() for c in captions]
    order = sorted(range(len(data)), key=lambda i: len(data[i]))
    parts = [list(p) for p in np.array_split(np.array(order), groups)]
    encoded = torch.cat([tower.encode([data[i] for i in p])[0] for p in parts])
    return encoded[torch.argsort(torch.tensor([i for p in parts for i in p]))]


def contrastive(media: torch.Tensor, texts: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """CLIP-style loss over a closed caption space: ``texts`` holds one vector for every
    meaning (the prototypes), ``labels`` each item's meaning. Media → text is a cross-entropy
    over all the meanings; text → media, for each meaning present in the batch, a
    cross-entropy whose target spreads evenly over the items carrying it."""
    logits = scale.exp().clamp(max=100.0) * media @ texts.T  # [items, meanings]
    to_text = F.cross_entropy(logits, labels)
    present: torch.Tensor = torch.unique(labels)
    target = (labels[None, :] == present[:, None]).float()  # [present, items]
    target = target / target.sum(1, keepdim=True)
    to_media: torch.Tensor = -(target * logits.T[present].log_softmax(1)).sum(1).mean()
    return (to_text + to_media) / 2


def clip_losses(tower: VideoTower, where: nn.Linear, scale: torch.Tensor, target: torch.Tensor, data: np.ndarray,
                labelled: np.ndarray, weight: float, autocast: bool = False) -> dict[str, torch.Tensor]:  # fmt: skip
    """A batch of clips' losses: ``video``, the contrastive loss against the clips' prototypes
    ``target``, and with ``weight`` > 0 the auxiliary ``place`` (where the shape is in each
    frame, read from the class token's final state by ``where``) and ``look`` (attention on it).
    With ``autocast`` the tower runs in BF16 autocast, the losses in float32."""
    with towers_in_bf16(autocast):
        media, hidden, attention = video_forward(tower, torch.from_numpy(data))
    media, hidden, attention = media.float(), hidden.float(), attention.float()
    parts = {"video": contrastive(media, target, torch.from_numpy(labelled), scale)}
    if weight:
        place, seen, cover = motion(data, tower.patch_size)
        parts["place"] = weight * ((where(hidden) - place) ** 2 * seen).sum() / seen.sum().clamp(min=1)
        parts["look"] = weight * attention_loss(attention, cover)
    return parts


def video_forward(tower: VideoTower, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The video tower's embeddings, its class token's final hidden state, and the log of the
    class token's attention in the first block (``[B, heads, F, patches]``; what the
    auxiliary losses read). The tower's own forward, unrolled."""
    b, f, s = frames.shape[0], frames.shape[1], frames.shape[2]
    x = tower.patch(patches(frames.reshape(b * f, s, s, 3), tower.patch_size, tower.mean, tower.std))
    x = x.reshape(b, f, -1, x.shape[-1]) + tower.pos.weight[1:] + tower.time.weight[:, None, :]
    x = with_class_token(x.reshape(b, -1, x.shape[-1]), tower.cls, tower.pos.weight[0])
    first = tower.blocks[0]
    assert isinstance(first, Block)
    heads, width = first.attn.heads, first.attn.head_dim
    q, k, _ = first.attn.qkv(first.ln1(x)).view(b, x.shape[1], 3, heads, width).permute(2, 0, 3, 1, 4)
    attention = ((q[:, :, :1] / math.sqrt(width)) @ k.transpose(-1, -2))[:, :, 0].log_softmax(-1)  # [B, heads, 1 + F·P]
    hidden = tower.run(x)
    return normalize(tower.projection(hidden[:, 0])), hidden[:, 0], attention[:, :, 1:].reshape(b, heads, f, -1)


def motion(frames: np.ndarray, patch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the moving shape is in each frame of each clip: the pixels that differ from the
    clip's per-pixel median over its frames. Answers its centre ``[B, 2F]`` (x and y in
    -1 … 1), a weight ``[B, 2F]`` of 0 where a frame shows too little of it, and the share of
    each patch it covers ``[B, F, patches]``."""
    f = torch.from_numpy(np.ascontiguousarray(frames)).float()  # [B, F, S, S, 3]
    moving = ((f - f.median(dim=1, keepdim=True).values).abs().sum(-1) > 60).float()  # [B, F, S, S]
    b, n, size = moving.shape[0], moving.shape[1], moving.shape[2]
    grid = torch.linspace(-1, 1, size)
    weight = moving.sum((2, 3))
    x = (moving * grid[None, None, None, :]).sum((2, 3)) / weight.clamp(min=1)
    y = (moving * grid[None, None, :, None]).sum((2, 3)) / weight.clamp(min=1)
    g = size // patch
    cover = moving.reshape(b, n, g, patch, g, patch).mean((3, 5)).reshape(b, n, g * g)
    return torch.stack([x, y], -1).reshape(b, -1), (weight > 3).float().repeat_interleave(2, 1), cover


def attention_loss(attention: torch.Tensor, cover: torch.Tensor) -> torch.Tensor:
    """Head ``h`` of the first block's class token is taught to look at the moving shape in
    frame ``h`` (for as many heads as frames): the cross-entropy of its attention against
    the patches the shape covers there, over the clips whose frame ``h`` shows it."""
    total, counted = torch.zeros(()), 0
    for h in range(min(attention.shape[1], attention.shape[2])):
        target = cover[:, h]
        shown = target.sum(-1) > 0.05
        if bool(shown.any()):
            target = target[shown] / target[shown].sum(-1, keepdim=True)
            total = total - (target * attention[shown, h, h]).sum(-1).mean()
            counted += 1
    return total / max(counted, 1)
