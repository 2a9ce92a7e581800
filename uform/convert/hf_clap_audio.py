"""Transformers' CLAP audio encoder (``ClapModel``'s ``audio_model.audio_encoder``: HTSAT, a Swin
transformer over the log-mel spectrogram laid out as a square image) as a uform Swin stack
(docs/checkpoint.md, "Swin stack").

The patch convolution (stride = kernel, no padding) becomes a linear map over each patch's
values in (channel, row, column) order; each block's query, key and value are stacked as one
``qkv``; the relative position bias table is kept as it is (the graph gathers it by the
window's relative positions, ``relative_position_index``, a buffer transformers derives from
the window size: its shape is checked, its values not read). ``batch_norm`` (the spectrogram's
``bn0``, folded into the front end) and the projection are left to the caller. transformers'
defaults (``ClapAudioConfig``) stand in for absent fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import hf_clap_fusion
from .common import Taker, activation, integer, norm, positive, qkv
from .sources import ConvertError

SOURCE = "audio_model.audio_encoder"
DEPTHS = [2, 2, 6, 2]  # transformers' ClapAudioConfig defaults (laion/clap-htsat-unfused's values)
HEADS = [4, 8, 16, 32]


def _pair(cfg: Mapping[str, Any], key: str, where: str, default: Any) -> tuple[int, int]:
    value = cfg.get(key, default)
    pair = [value, value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair)):
        raise ConvertError(f"{where}: field {key!r} is {value!r}, not a positive integer or a pair of them")
    return pair[0], pair[1]


def _stages(cfg: Mapping[str, Any], key: str, where: str, default: list[int]) -> list[int]:
    value = cfg.get(key, default)
    if not (isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ConvertError(f"{where}: field {key!r} is {value!r}, not a list of positive integers (one a stage)")
    return list(value)


def audio_tensors(t: Taker, cfg: Mapping[str, Any], where: str, prefix: str = "audio") -> dict[str, Any]:
    """Take the Swin stack of ``audio_model.audio_encoder`` into ``t`` as ``prefix.*`` and
    answer its config fields; ``cfg`` is config.json's ``audio_config`` (``where`` names the
    file), and a fused CLAP's patch fusion (:mod:`.hf_clap_fusion`). Refused by name: a patch convolution whose stride is not its
    kernel, or one not square, and a ``hidden_size`` that is not the last stage's width."""
    at = where + " audio_config"
    if not isinstance(cfg.get("enable_fusion", False), bool):
        raise ConvertError(f"{at}: field 'enable_fusion' is {cfg.get('enable_fusion')!r}, not true or false")
    if cfg.get("flatten_patch_embeds", True) is not True:
        raise ConvertError(f"{at}: flatten_patch_embeds {cfg.get('flatten_patch_embeds')!r} is not supported (the stack reads flattened patches)")
    size = integer(cfg, "spec_size", at, 256)
    patch, stride = _pair(cfg, "patch_size", at, 4), _pair(cfg, "patch_stride", at, [4, 4])
    if patch != stride or patch[0] != patch[1]:
        raise ConvertError(f"{at}: patch_size {list(patch)} with patch_stride {list(stride)} is not supported: only square patches that do not overlap (stride = size)")
    p = patch[0]
    channels = integer(cfg, "patch_embed_input_channels", at, 1)
    embed = integer(cfg, "patch_embeds_hidden_size", at, 96)
    depths, heads = _stages(cfg, "depths", at, DEPTHS), _stages(cfg, "num_attention_heads", at, HEADS)
    if len(heads) != len(depths):
        raise ConvertError(f"{at}: num_attention_heads {heads} does not give one head count to each of the {len(depths)} stages of depths {depths}")
    window = integer(cfg, "window_size", at, 8)
    ratio = positive(cfg, "mlp_ratio", at, 4.0)
    width = embed << (len(depths) - 1)
    if integer(cfg, "hidden_size", at, 768) != width:
        raise ConvertError(f"{at}: hidden_size {cfg.get('hidden_size', 768)} is not the last stage's width, patch_embeds_hidden_size {embed} x 2^{len(depths) - 1} = {width}")
    qkv_bias = cfg.get("qkv_bias", True)
    if not isinstance(qkv_bias, bool):
        raise ConvertError(f"{at}: field 'qkv_bias' is {qkv_bias!r}, not true or false")
    patch_norm = cfg.get("enable_patch_layer_norm", True)
    if not isinstance(patch_norm, bool):
        raise ConvertError(f"{at}: field 'enable_patch_layer_norm' is {patch_norm!r}, not true or false")

    why = at + " (patch_embeds_hidden_size, patch_size, patch_embed_input_channels)"
    t.take(f"{prefix}.patch.weight", f"{SOURCE}.patch_embed.proj.weight", (embed, channels, p, p), why, (embed, channels * p * p))
    t.take(f"{prefix}.patch.bias", f"{SOURCE}.patch_embed.proj.bias", (embed,), why)
    if patch_norm:
        norm(t, f"{prefix}.patch_norm", f"{SOURCE}.patch_embed.norm", embed, why)
    n = window * window
    for s, (depth, h) in enumerate(zip(depths, heads)):
        c, m = embed << s, int(ratio * (embed << s))
        why = f"{at} (stage {s}: width {c}, {h} heads, window_size {window}, mlp_ratio {ratio:g})"
        for i in range(depth):
            src, dst = f"{SOURCE}.layers.{s}.blocks.{i}", f"{prefix}.stages.{s}.blocks.{i}"
            a = f"{src}.attention.self"
            if qkv_bias:
                qkv(t, f"{dst}.attn", f"{a}.query", f"{a}.key", f"{a}.value", c, why)
            else:
                t.stack(f"{dst}.attn.qkv.weight", [f"{a}.{x}.weight" for x in ("query", "key", "value")], (c, c), why)
                t.put(f"{dst}.attn.qkv.bias", np.zeros(3 * c, np.float32))
            t.take(f"{dst}.attn.bias_table", f"{a}.relative_position_bias_table", ((2 * window - 1) ** 2, h), why)
            if f"{a}.relative_position_index" in t.weights:
                t.check(f"{a}.relative_position_index", (n, n), why)
            pairs = [("attention.output.dense", "attn.out", (c, c)), ("intermediate.dense", "mlp.fc1", (m, c)), ("output.dense", "mlp.fc2", (c, m))]
            for source, target, shape in pairs:
                t.take(f"{dst}.{target}.weight", f"{src}.{source}.weight", shape, why)
                t.take(f"{dst}.{target}.bias", f"{src}.{source}.bias", (shape[0],), why)
            norm(t, f"{dst}.ln1", f"{src}.layernorm_before", c, why)
            norm(t, f"{dst}.ln2", f"{src}.layernorm_after", c, why)
        if s < len(depths) - 1:
            norm(t, f"{prefix}.stages.{s}.merge.norm", f"{SOURCE}.layers.{s}.downsample.norm", 4 * c, why)
            t.take(f"{prefix}.stages.{s}.merge.reduction.weight", f"{SOURCE}.layers.{s}.downsample.reduction.weight", (2 * c, 4 * c), why)
    norm(t, f"{prefix}.ln_final", f"{SOURCE}.norm", width, at + " (hidden_size)")
    fusion = hf_clap_fusion.fusion_tensors(t, cfg, where, p, embed) if hf_clap_fusion.fused(cfg) else {}
    return fusion | {
        "image_size": size,
        "channels": channels,
        "patch_size": p,
        "embed_dim": embed,
        "depths": depths,
        "heads": heads,
        "window_size": window,
        "mlp_ratio": ratio,
        "patch_norm": patch_norm,
        "activation": activation(cfg.get("hidden_act", "gelu"), at),
        "layer_norm_eps": positive(cfg, "layer_norm_eps", at, 1e-5),
    }
