"""A fused CLAP's patch embedding (transformers' ``ClapAudioPatchEmbed`` with ``enable_fusion``):
the image's four channels to the patch embeddings the Swin stack reads.

Channel 0 is embedded as an unfused stack's image (``prefix.patch``). For a recording marked
``longer``, channels 1 to 3 (its three crops) each go through ``prefix.patch_local`` (transformers'
``mel_conv2d``: a ``P × 3P`` kernel, stride ``P × 3P``, no padding, so the last
``S mod 3P`` columns are left out), their ``⌊S / 3P⌋`` columns side by side (crop 1, 2, 3) and
zero-padded to the grid's width; then the attentional feature fusion (``ClapAudioAFFBlock``,
BatchNorms folded into the 1×1 convolutions, as Gemms per token)::

    x = g + l
    a = local.1(ReLU(local.0(x))) + global.1(ReLU(global.0(mean of x over the tokens)))
    out = 2 · g · σ(a) + 2 · l · (1 − σ(a))

A recording not ``longer`` keeps channel 0's embedding bit for bit (a ``Where`` per item).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from uform.core.config import integer
from uform.core.errors import CheckpointError
from uform.core.graph import GraphBuilder
from uform.core.plugin import TensorSpec

from .stack import patch_embedding, token_mean
from .tower import SwinTower

FIELDS = frozenset({"fusion_ratio"})
ATTENTIONS = ("local", "global")


def read_ratio(cfg: Mapping[str, Any], w: str, t: SwinTower) -> int:
    """``fusion_ratio`` (transformers' ``aff_block_r``): the fusion's inner width is ``embed_dim // fusion_ratio``."""
    ratio = integer(cfg, "fusion_ratio", w, 1, t.embed_dim)
    if t.channels != 1:
        raise CheckpointError(f"config field {w}.channels: {t.channels}; a fused tower's patches take one channel of the four")
    if t.grid < 3 or t.patch_size * 3 > t.image_size:
        raise CheckpointError(f"config field {w}.patch_size: {t.patch_size}; a fused tower's crops are read 3 patches wide, wider than image_size {t.image_size}")
    return ratio


def tensors(t: SwinTower, ratio: int, prefix: str) -> dict[str, TensorSpec]:
    e, inner, p = t.embed_dim, t.embed_dim // ratio, t.patch_size
    out = {f"{prefix}.patch_local.weight": TensorSpec((e, 3 * p * p)), f"{prefix}.patch_local.bias": TensorSpec((e,))}
    for kind in ATTENTIONS:
        q = f"{prefix}.fusion.{kind}"
        out.update({
            f"{q}.0.weight": TensorSpec((inner, e)), f"{q}.0.bias": TensorSpec((inner,)),
            f"{q}.1.weight": TensorSpec((e, inner)), f"{q}.1.bias": TensorSpec((e,)),
        })  # fmt: skip
    return out


def patches(b: GraphBuilder, image: str, longer: str, t: SwinTower, prefix: str) -> str:
    """``image`` [B, 4, S, S] and ``longer`` bool [B] to the patch embeddings [B · grid², embed_dim]."""
    e, p, g, s = t.embed_dim, t.patch_size, t.grid, t.image_size
    wide = s // (3 * p)  # each crop's columns of patches
    glob = patch_embedding(b, b.op("Slice", image, b.ints([0]), b.ints([1]), b.ints([1])), t, prefix)  # [B·g², E]
    crops = b.op("Slice", image, b.ints([1, 0]), b.ints([4, wide * 3 * p]), b.ints([1, 3]))  # [B, 3, S, wide·3P]
    crops = b.op("Reshape", crops, b.ints([-1, 3, g, p, wide, 3 * p]))
    crops = b.op("Reshape", b.op("Transpose", crops, perm=[0, 1, 2, 4, 3, 5]), b.ints([-1, 3 * p * p]))  # (row, column)
    local = b.op("Reshape", b.linear(crops, f"{prefix}.patch_local"), b.ints([-1, 3, g, wide, e]))
    local = b.op("Reshape", b.op("Transpose", local, perm=[0, 2, 1, 3, 4]), b.ints([-1, g, 3 * wide, e]))  # crops side by side
    if 3 * wide < g:
        local = b.op("Pad", local, b.ints([0, 0, 0, 0, 0, 0, g - 3 * wide, 0]))
    local = b.op("Reshape", local, b.ints([-1, e]))
    x = b.op("Add", glob, local)

    def attention(v: str, kind: str) -> str:
        q = f"{prefix}.fusion.{kind}"
        return b.linear(b.op("Relu", b.linear(v, f"{q}.0")), f"{q}.1")

    tokens = b.op("Reshape", x, b.ints([-1, g * g, e]))
    mean = token_mean(b, tokens, g * g, e)  # [B, E]
    mix = b.op("Add", b.op("Reshape", attention(x, "local"), b.ints([-1, g * g, e])), b.op("Unsqueeze", attention(mean, "global"), b.ints([1])))
    weight = b.op("Reshape", b.op("Sigmoid", mix), b.ints([-1, e]))
    two = b.scalar(2.0)
    fused = b.op("Add", b.op("Mul", b.op("Mul", two, glob), weight), b.op("Mul", b.op("Mul", two, local), b.op("Sub", b.scalar(1.0), weight)))
    chosen = b.op("Where", b.op("Reshape", longer, b.ints([-1, 1, 1])), b.op("Reshape", fused, b.ints([-1, g * g, e])), b.op("Reshape", glob, b.ints([-1, g * g, e])))
    return b.op("Reshape", chosen, b.ints([-1, e]))  # type: ignore[no-any-return]
