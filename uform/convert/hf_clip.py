"""Transformers' ``CLIPModel`` (OpenAI's and LAION's CLIPs as the Hub holds them) as a uform file.

Text: token and position embeddings, a causal pre-norm stack, ``final_layer_norm``, the
end-of-text token's state (each text's last real token) projected without bias. Image: the
patch convolution (no bias: a zero ``image.patch.bias``), the class token, ``pre_layrnorm``
(``ln_pre``), the stack, ``post_layernorm`` on the class token, projected without bias.
Labels: softmax over ``exp(logit_scale)`` x cosine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .common import Converted, Taker, Text, activation, config, geometry, hf_stack, integer, logit_scale, norm, patch_fields, positive, preprocessing, section, text_geometry, vision
from .sources import ConvertError, Weights
from .tokenizer import tokenizer_json

TEXT_DEFAULTS = Text(width=512, depth=12, heads=8, mlp=2048, vocab=49408, context=77)  # transformers' CLIPTextConfig
IGNORED = ("text_model.embeddings.position_ids", "vision_model.embeddings.position_ids")


def convert(directory: Path, cfg: dict[str, Any], weights: Weights, source: dict[str, str], frames: int) -> Converted:
    where = str(directory / "config.json")
    text_cfg, vision_cfg = section(cfg, "text_config", where), section(cfg, "vision_config", where)
    dimensions = integer(cfg, "projection_dim", where, 512)
    t = Taker(weights, ignore=lambda n: n in IGNORED)
    notes: list[str] = []

    # text
    g = text_geometry(text_cfg, where, TEXT_DEFAULTS)
    tw, td, th, tm, vocab, context = g.width, g.depth, g.heads, g.mlp, g.vocab, g.context
    why = "config.json text_config"
    t.take("text.embed.weight", "text_model.embeddings.token_embedding.weight", (vocab, tw), why + ".vocab_size, hidden_size")
    t.take("text.pos.weight", "text_model.embeddings.position_embedding.weight", (context, tw), why + ".max_position_embeddings, hidden_size")
    hf_stack(t, "text_model", "text", tw, td, tm, why)
    norm(t, "text.ln_final", "text_model.final_layer_norm", tw, why)
    t.take("text.projection.weight", "text_projection.weight", (dimensions, tw), "config.json projection_dim, text_config.hidden_size")
    tokenizer, pad_id = tokenizer_json(directory, "clip", vocab, notes)
    text = geometry(tw, td, th, tm, where + " text_config") | {
        "token_width": 0,
        "activation": activation(text_cfg.get("hidden_act", "quick_gelu"), where + " text_config"),
        "layer_norm_eps": positive(text_cfg, "layer_norm_eps", where + " text_config", 1e-5),
        "class_token": False,
        "pooling": "last_token",
        "projection": "linear",
        "tokenizer": "tokenizer.json",
        "vocab_size": vocab,
        "context": context,
        "mask": "causal",
        "pad_to_context": False,
        "pad_id": pad_id,
        "end_token": _end_token(text_cfg, vocab, where + " text_config"),
    }

    image, size = image_tower(t, vision_cfg, where, dimensions)
    image |= preprocessing(directory, "clip", size, notes)

    scale = logit_scale(t)
    tensors = t.finish()
    towers = {"text": text, "image": image, "video": {"from": "image", "frames": frames}}
    out = config(dimensions, context, towers, source, {"kind": "softmax", "scale": scale, "bias": 0.0})
    return Converted(out, tensors, tokenizer, notes, list(weights.files))




def image_tower(t: Taker, vision_cfg: dict[str, Any], where: str, dimensions: int) -> tuple[dict[str, Any], int]:
    """transformers' CLIP vision tower (``vision_model``, ``visual_projection``) taken into ``t``: its
    fields but the preprocessing, and its image size (CLIP's and Chinese-CLIP's alike)."""
    v = vision(vision_cfg, where, 32)
    why = "config.json vision_config"
    conv = "vision_model.embeddings.patch_embedding.weight"
    t.take("image.patch.weight", conv, (v.width, 3, v.patch, v.patch), why + ".hidden_size, patch_size", (v.width, 3 * v.patch * v.patch))
    t.put("image.patch.bias", np.zeros(v.width, np.float32))
    t.take("image.cls", "vision_model.embeddings.class_embedding", (v.width,), why + ".hidden_size")
    t.take("image.pos.weight", "vision_model.embeddings.position_embedding.weight", (1 + v.grid * v.grid, v.width), why + ".image_size, patch_size")
    norm(t, "image.ln_pre", "vision_model.pre_layrnorm", v.width, why)
    hf_stack(t, "vision_model", "image", v.width, v.depth, v.mlp, why)
    norm(t, "image.ln_final", "vision_model.post_layernorm", v.width, why)
    t.take("image.projection.weight", "visual_projection.weight", (dimensions, v.width), "config.json projection_dim, vision_config.hidden_size")
    fields = geometry(v.width, v.depth, v.heads, v.mlp, where + " vision_config") | {
        "activation": activation(vision_cfg.get("hidden_act", "quick_gelu"), where + " vision_config"),
        "layer_norm_eps": positive(vision_cfg, "layer_norm_eps", where + " vision_config", 1e-5),
        "class_token": True,
        "ln_pre": True,
        "pooling": "class",
        "projection": "linear",
        "image_size": v.size,
        "patch_size": v.patch,
    } | patch_fields(v)
    return fields, v.size


def _end_token(text_cfg: dict[str, Any], vocab: int, where: str) -> int | str:
    """Where transformers' CLIP pools the text: at the first ``eos_token_id``, or where that is 2
    (the configs written before it was used, OpenAI's among them) at the first of the row's
    largest id (``argmax``)."""
    eos = text_cfg.get("eos_token_id", 49407)
    if eos == 2:
        return "max"
    if not isinstance(eos, int) or isinstance(eos, bool) or not 0 <= eos < vocab:
        raise ConvertError(f"{where}: field 'eos_token_id' is {eos!r}, not a token id below vocab_size {vocab}")
    return eos
