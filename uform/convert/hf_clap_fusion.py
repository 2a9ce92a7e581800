"""A fused CLAP's (``enable_fusion: true``, laion/clap-htsat-fused) patch fusion as uform tensors
(docs/checkpoint-clap.md, "Fused checkpoints"; :mod:`uform.plugins.swin.fusion` runs it).

``patch_embed.mel_conv2d`` (the crops' ``P × 3P`` convolution) becomes ``audio.patch_local``
over each patch's values in (row, column) order; ``patch_embed.fusion_model`` (the attentional
feature fusion) becomes ``audio.fusion.local.0/1`` and ``audio.fusion.global.0/1``, each 1×1
convolution with the BatchNorm after it folded in (eval mode, ``eps`` 1e-5 as transformers
builds ``BatchNorm2d``). transformers runs this fusion whatever ``fusion_type`` says except
``channel_map`` (a four-channel patch convolution), which is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .common import Taker, integer
from .sources import ConvertError

SOURCE = "audio_model.audio_encoder.patch_embed"
BATCH_NORM_EPS = 1e-5
WINDOWS = 6  # max_samples: a fused tower reads recordings up to six windows (60 s for laion's)
# (1x1 convolution, BatchNorm after it) of each attention, as nn.Sequential numbers them
LAYERS = {"local": (("local_att.0", "local_att.1"), ("local_att.3", "local_att.4")),
          "global": (("global_att.1", "global_att.2"), ("global_att.4", "global_att.5"))}  # fmt: skip


def fused(cfg: Mapping[str, Any]) -> bool:
    """Whether config.json's ``audio_config`` is a fused CLAP's."""
    return cfg.get("enable_fusion", False) is True


def fusion_tensors(t: Taker, cfg: Mapping[str, Any], where: str, patch: int, embed: int) -> dict[str, Any]:
    """Take the fusion's tensors into ``t`` and answer its fields (``cfg`` is ``audio_config``,
    ``where`` names config.json; ``patch`` and ``embed`` the stack's patch size and width)."""
    at = where + " audio_config"
    if cfg.get("fusion_type") == "channel_map":
        raise ConvertError(f"{at}: fusion_type 'channel_map' (four channels into the patch convolution) is not supported; the attentional fusion is")
    ratio = integer(cfg, "aff_block_r", at, 4)
    inner = embed // ratio
    if inner < 1:
        raise ConvertError(f"{at}: aff_block_r {ratio} leaves the fusion no width (patch_embeds_hidden_size {embed})")
    channels = integer(cfg, "patch_embed_input_channels", at, 1)
    if channels != 1:
        raise ConvertError(f"{at}: patch_embed_input_channels {channels} is not supported with enable_fusion: the fusion's crops are one channel each")
    why = at + " (patch_embeds_hidden_size, patch_size, aff_block_r)"
    t.take("audio.patch_local.weight", f"{SOURCE}.mel_conv2d.weight", (embed, 1, patch, 3 * patch), why, (embed, 3 * patch * patch))
    t.take("audio.patch_local.bias", f"{SOURCE}.mel_conv2d.bias", (embed,), why)
    for kind, layers in LAYERS.items():
        for i, (conv, bn) in enumerate(layers):
            out, into = (inner, embed) if i == 0 else (embed, inner)
            weight = t.get(f"{SOURCE}.fusion_model.{conv}.weight", (out, into, 1, 1), why).astype(np.float64).reshape(out, into)
            bias = t.get(f"{SOURCE}.fusion_model.{conv}.bias", (out,), why).astype(np.float64)
            mean, var, gamma, beta = (t.get(f"{SOURCE}.fusion_model.{bn}.{k}", (out,), why).astype(np.float64) for k in ("running_mean", "running_var", "weight", "bias"))
            if f"{SOURCE}.fusion_model.{bn}.num_batches_tracked" in t.weights:
                t.check(f"{SOURCE}.fusion_model.{bn}.num_batches_tracked", (), "BatchNorm2d's counter, unused in eval mode")
            scale = gamma / np.sqrt(var + BATCH_NORM_EPS)
            t.put(f"audio.fusion.{kind}.{i}.weight", (weight * scale[:, None]).astype(np.float32))
            t.put(f"audio.fusion.{kind}.{i}.bias", ((bias - mean) * scale + beta).astype(np.float32))
    return {"fusion": "aff", "fusion_ratio": ratio}
