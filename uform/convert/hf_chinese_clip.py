"""Transformers' ``ChineseCLIPModel`` (OFA-Sys/chinese-clip-vit-base-patch16, -large-patch14,
-large-patch14-336px, -huge-patch14) as a uform file: a BERT text tower (RoBERTa-wwm, Chinese)
and a CLIP ViT image tower.

Text (as ``get_text_features`` runs it): word embeddings plus absolute positions from 0 (the
first ``context`` rows, with the type-0 token type's row added, are the file's
``text.pos.weight``: every token is of type 0), the embeddings' LayerNorm (``ln_pre``),
post-norm blocks (exact GELU), padding masked, the first token's state (``[CLS]``; the text
model is built without its pooler) projected without bias. The tokenizer is BERT's WordPiece
(:mod:`.wordpiece`). Image: as :mod:`.hf_clip` (``pre_layrnorm``, the stack, ``post_layernorm`` on
the class token, projected without bias); the preprocessing is a square resize where
``preprocessor_config.json`` asks for no crop (the Hub's files), else CLIP's shorter side and
central crop. Labels: softmax over ``exp(logit_scale)`` x cosine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .bert import bert_stack, model_max_length
from .common import CLIP_MEAN, CLIP_STD, Converted, Taker, Text, activation, config, geometry, integer, logit_scale, norm, positive, preprocessing, section, text_geometry
from .hf_clip import image_tower
from .sources import ConvertError, Weights, preprocessor_config
from .tokenizer import tokenizer_json

TEXT_DEFAULTS = Text(width=768, depth=12, heads=12, mlp=3072, vocab=30522, context=512)  # transformers' ChineseCLIPTextConfig
TEXT = "text_model"
BUFFERS = ("text_model.embeddings.position_ids", "text_model.embeddings.token_type_ids", "vision_model.embeddings.position_ids")
POOLER = "text_model.pooler."  # a text pooler some checkpoints carry: ChineseCLIPModel builds none, get_text_features reads none


def convert(directory: Path, cfg: dict[str, Any], weights: Weights, source: dict[str, str], frames: int) -> Converted:
    where = str(directory / "config.json")
    text_cfg, vision_cfg = sub_config(cfg, "text", where), sub_config(cfg, "vision", where)
    dimensions = integer(cfg, "projection_dim", where, 512)
    t = Taker(weights, ignore=lambda n: n in BUFFERS or n.startswith(POOLER))
    notes: list[str] = []
    if any(n.startswith(POOLER) for n in weights.names()):
        notes.append("text_model.pooler left out: ChineseCLIPModel builds its text model without it (get_text_features projects the [CLS] state)")

    text, tokenizer = text_tower(directory, t, text_cfg, where, notes)
    t.take("text.projection.weight", "text_projection.weight", (dimensions, text["width"]), "config.json projection_dim, text_config.hidden_size")

    image, size = image_tower(t, vision_cfg, where, dimensions)
    image |= image_preprocessing(directory, size, notes)

    scale = logit_scale(t)
    tensors = t.finish()
    towers = {"text": text, "image": image, "video": {"from": "image", "frames": frames}}
    out = config(dimensions, text["context"], towers, source, {"kind": "softmax", "scale": scale, "bias": 0.0})
    return Converted(out, tensors, tokenizer, notes, list(weights.files))


def text_tower(directory: Path, t: Taker, text_cfg: dict[str, Any], where: str, notes: list[str]) -> tuple[dict[str, Any], str]:
    """The BERT text tower's tensors taken into ``t``, its fields and its tokenizer's JSON text."""
    at = where + " text_config"
    g = text_geometry(text_cfg, where, TEXT_DEFAULTS)
    w = g.width
    if text_cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ConvertError(f"{at}: position_embedding_type {text_cfg['position_embedding_type']!r} is not supported; supported: 'absolute'")
    types = integer(text_cfg, "type_vocab_size", at, 2)
    tokenizer, pad_id = tokenizer_json(directory, "chinese_clip", g.vocab, notes)
    context = g.context
    longest = model_max_length(directory)
    if longest is not None and longest < context:
        context = longest
    why = "config.json text_config"
    e = f"{TEXT}.embeddings"
    t.take("text.embed.weight", f"{e}.word_embeddings.weight", (g.vocab, w), why + ".vocab_size, hidden_size")
    positions = np.asarray(t.get(f"{e}.position_embeddings.weight", (g.context, w), why + ".max_position_embeddings, hidden_size"), np.float32)
    token_type = np.asarray(t.get(f"{e}.token_type_embeddings.weight", (types, w), why + ".type_vocab_size, hidden_size"), np.float32)
    t.put("text.pos.weight", positions[:context] + token_type[0])  # every token is of type 0
    norm(t, "text.ln_pre", f"{e}.LayerNorm", w, why)
    bert_stack(t, TEXT, "text", w, g.depth, g.mlp, why)
    fields = geometry(w, g.depth, g.heads, g.mlp, at) | {
        "token_width": 0,
        "activation": activation(text_cfg.get("hidden_act", "gelu"), at),
        "layer_norm_eps": positive(text_cfg, "layer_norm_eps", at, 1e-12),
        "norm": "post",
        "class_token": False,
        "ln_pre": True,
        "pooling": "first_token",
        "projection": "linear",
        "tokenizer": "tokenizer.json",
        "vocab_size": g.vocab,
        "context": context,
        "mask": "padding",
        "pad_id": pad_id,
    }
    return fields, tokenizer


def image_preprocessing(directory: Path, size: int, notes: list[str]) -> dict[str, Any]:
    """``ChineseCLIPImageProcessor``'s steps: with ``do_center_crop`` false (the Hub's
    ``preprocessor_config.json``) the picture is resized to ``size`` x ``size`` whole (a
    ``size`` of height and width; a ``shortest_edge`` would leave a picture that is not
    square, which the model refuses), else (and without the file, the processor's defaults)
    CLIP's shorter side to ``size`` and the central crop. Mean and std default to CLIP's."""
    found = preprocessor_config(directory, "image_processor")
    if found is None or found[0].get("do_center_crop", True):
        return preprocessing(directory, "clip", size, notes)
    cfg, where = found
    if not (isinstance(cfg.get("size"), dict) and {"height", "width"} <= set(cfg["size"])):
        raise ConvertError(
            f"{where}: size {cfg.get('size')!r} without a center crop is not supported: ChineseCLIPImageProcessor then keeps "
            f"the picture's aspect, which is not the tower's square {size}x{size}; supported: size height and width {size}"
        )
    out = preprocessing(directory, "square", size, notes)
    if cfg.get("do_normalize", True):  # the square families' defaults are 0.5; ChineseCLIP's are CLIP's
        out |= {"mean": out["mean"] if "image_mean" in cfg else CLIP_MEAN, "std": out["std"] if "image_std" in cfg else CLIP_STD}
    return out


def sub_config(cfg: dict[str, Any], tower: str, where: str) -> dict[str, Any]:
    """``{tower}_config``, or where a config of transformers 4's first writers holds
    ``{tower}_config_dict``, that: ``ChineseCLIPConfig`` builds the sub-config from it alone (its
    fields over the defaults), whatever ``{tower}_config`` says."""
    legacy = section(cfg, f"{tower}_config_dict", where)
    return legacy if cfg.get(f"{tower}_config_dict") is not None else section(cfg, f"{tower}_config", where)

