"""Transformers' ``SiglipModel`` (SigLIP, and SigLIP 2 at a fixed resolution, which the Hub
holds as ``model_type: "siglip"`` with a Gemma ``tokenizer.json``) as a uform file.

Text: every text padded with the pad token to the full context (as trained), nothing masked,
``final_layer_norm``, the context's last position, projected by ``text_model.head`` (with bias);
SigLIP 2's Gemma tokenizer lower-cases the text first, as SigLIP 2 was trained.
Image: the patch convolution (with bias), positions without a class token, the stack,
``post_layernorm``, then the multi-head attention pooling head; no projection (the pooled
state is the embedding, so the text's projection width must equal the image tower's width).
Labels: ``sigmoid(exp(logit_scale) x cosine + logit_bias)`` per label.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import Converted, Taker, Text, Vision, activation, config, geometry, hf_stack, integer, logit_scale, norm, patch_fields, positive, preprocessing, scalar, section, text_geometry, vision
from .sources import ConvertError, Weights, read_json
from .tokenizer import lowercased, tokenizer_json

TEXT_DEFAULTS = Text(width=768, depth=12, heads=12, mlp=3072, vocab=32000, context=64)  # transformers' SiglipTextConfig
IGNORED = ("text_model.embeddings.position_ids", "vision_model.embeddings.position_ids")
GEMMA = ("Gemma", "Siglip2")  # SigLIP 2's tokenizer classes: the Hub's, and transformers' Siglip2Tokenizer's saves


# The image tower's patch and position tensors taken, and its pixel fields: a fixed square's
# (square_embeddings), or SigLIP 2 NaFlex's (hf_siglip2.grid_embeddings)
Embeddings = Callable[[Path, Taker, Vision, dict[str, Any], list[str]], dict[str, Any]]


def square_embeddings(directory: Path, t: Taker, v: Vision, vision_cfg: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    why = "config.json vision_config"
    vw, patch, grid = v.width, v.patch, v.grid
    conv = "vision_model.embeddings.patch_embedding.weight"
    t.take("image.patch.weight", conv, (vw, 3, patch, patch), why + ".hidden_size, patch_size", (vw, 3 * patch * patch))
    t.take("image.patch.bias", "vision_model.embeddings.patch_embedding.bias", (vw,), why + ".hidden_size")
    t.take("image.pos.weight", "vision_model.embeddings.position_embedding.weight", (grid * grid, vw), why + ".image_size, patch_size")
    return {"image_size": v.size, "patch_size": patch} | patch_fields(v) | preprocessing(directory, "siglip", v.size, notes)


def convert(
    directory: Path, cfg: dict[str, Any], weights: Weights, source: dict[str, str], frames: int, embeddings: Embeddings = square_embeddings
) -> Converted:
    where = str(directory / "config.json")
    text_cfg, vision_cfg = section(cfg, "text_config", where), section(cfg, "vision_config", where)
    t = Taker(weights, ignore=lambda n: n in IGNORED)
    notes: list[str] = []

    # text
    g = text_geometry(text_cfg, where, TEXT_DEFAULTS)
    tw, td, th, tm, vocab, context = g.width, g.depth, g.heads, g.mlp, g.vocab, g.context
    dimensions = integer(text_cfg, "projection_size", where + " text_config") if text_cfg.get("projection_size") is not None else tw
    why = "config.json text_config"
    t.take("text.embed.weight", "text_model.embeddings.token_embedding.weight", (vocab, tw), why + ".vocab_size, hidden_size")
    t.take("text.pos.weight", "text_model.embeddings.position_embedding.weight", (context, tw), why + ".max_position_embeddings, hidden_size")
    hf_stack(t, "text_model", "text", tw, td, tm, why)
    norm(t, "text.ln_final", "text_model.final_layer_norm", tw, why)
    t.take("text.projection.weight", "text_model.head.weight", (dimensions, tw), why + ".projection_size, hidden_size")
    t.take("text.projection.bias", "text_model.head.bias", (dimensions,), why + ".projection_size")
    tokenizer, pad_id = tokenizer_json(directory, "siglip", vocab, notes)
    tokenizer_config = directory / "tokenizer_config.json"
    tok_cfg = read_json(tokenizer_config) if tokenizer_config.is_file() else {}
    gemma = str(tok_cfg.get("tokenizer_class", "")).startswith(GEMMA)  # transformers' Gemma tokenizer pads on the left by default
    if gemma:  # SigLIP 2 was trained on lower-cased texts: transformers' Siglip2Tokenizer lower-cases, its GemmaTokenizer does not
        own = tokenizer
        tokenizer = lowercased(tokenizer, str(directory / "tokenizer.json"))
        if tokenizer != own:
            notes.append(
                "texts are lower-cased before the Gemma tokenizer, as SigLIP 2 was trained and transformers' Siglip2Tokenizer does "
                "(its GemmaTokenizer, which AutoTokenizer gives for this directory, does not)"
            )
    if tok_cfg.get("padding_side", "left" if gemma else "right") == "left":
        notes.append("the source's tokenizer pads on the left; uform pads after the text, as SigLIP was trained (tokenizer(..., padding_side='right') gives the same)")
    text = geometry(tw, td, th, tm, where + " text_config") | {
        "token_width": 0,
        "activation": activation(text_cfg.get("hidden_act", "gelu_pytorch_tanh"), where + " text_config"),
        "layer_norm_eps": positive(text_cfg, "layer_norm_eps", where + " text_config", 1e-6),
        "class_token": False,
        "pooling": "final_position",
        "projection": "linear_bias",
        "tokenizer": "tokenizer.json",
        "vocab_size": vocab,
        "context": context,
        "mask": "none",
        "pad_to_context": True,
        "pad_id": pad_id,
    }

    # image
    v = vision(vision_cfg, where, 16)
    vw, vd, vh, vm = v.width, v.depth, v.heads, v.mlp
    if vision_cfg.get("vision_use_head", True) is False:
        raise ConvertError(f"{where}: vision_config.vision_use_head false (no attention pooling head) is not supported")
    if vw != dimensions:
        raise ConvertError(
            f"{where}: the image embedding's width (vision_config.hidden_size {vw}) differs from the text's "
            f"(text_config.projection_size {dimensions}); SigLIP compares them directly"
        )
    why = "config.json vision_config"
    pixels = embeddings(directory, t, v, vision_cfg, notes)
    hf_stack(t, "vision_model", "image", vw, vd, vm, why)
    norm(t, "image.ln_final", "vision_model.post_layernorm", vw, why)
    h = "vision_model.head"
    t.take("image.pool.probe", f"{h}.probe", (1, 1, vw), why + ".hidden_size", (vw,))
    t.take("image.pool.attn.qkv.weight", f"{h}.attention.in_proj_weight", (3 * vw, vw), why + ".hidden_size")
    t.take("image.pool.attn.qkv.bias", f"{h}.attention.in_proj_bias", (3 * vw,), why + ".hidden_size")
    t.take("image.pool.attn.out.weight", f"{h}.attention.out_proj.weight", (vw, vw), why + ".hidden_size")
    t.take("image.pool.attn.out.bias", f"{h}.attention.out_proj.bias", (vw,), why + ".hidden_size")
    norm(t, "image.pool.ln", f"{h}.layernorm", vw, why)
    t.take("image.pool.mlp.fc1.weight", f"{h}.mlp.fc1.weight", (vm, vw), why + ".intermediate_size, hidden_size")
    t.take("image.pool.mlp.fc1.bias", f"{h}.mlp.fc1.bias", (vm,), why + ".intermediate_size")
    t.take("image.pool.mlp.fc2.weight", f"{h}.mlp.fc2.weight", (vw, vm), why + ".hidden_size, intermediate_size")
    t.take("image.pool.mlp.fc2.bias", f"{h}.mlp.fc2.bias", (vw,), why + ".hidden_size")
    image = geometry(vw, vd, vh, vm, where + " vision_config") | {
        "activation": activation(vision_cfg.get("hidden_act", "gelu_pytorch_tanh"), where + " vision_config"),
        "layer_norm_eps": positive(vision_cfg, "layer_norm_eps", where + " vision_config", 1e-6),
        "class_token": False,
        "ln_pre": False,
        "pooling": "attention",
        "projection": "none",
    } | pixels

    scale = logit_scale(t)
    bias = scalar(t, "logit_bias", "the model's logit bias")
    tensors = t.finish()
    towers = {"text": text, "image": image, "video": {"from": "image", "frames": frames}}
    out = config(dimensions, context, towers, source, {"kind": "sigmoid", "scale": scale, "bias": bias})
    return Converted(out, tensors, tokenizer, notes, list(weights.files))
