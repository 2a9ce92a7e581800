"""Version-2 test checkpoints made from transformers' CLIP and SigLIP models (random weights).

The runtime's own helper, independent of ``uform convert`` (so the runtime's tests pin the
format, not one converter): the tensors and fields docs/checkpoint.md states for version 2.
Tests import this as ``from v2ckpt import ...``; it imports torch and transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from uform.core import checkpoint
from uform.core.config import make_config

VOCAB = ["<pad>", "<bos>", "<unk>", "<eos>"] + [w for w in "a b c d e f g h cat dog on the mat red blue sky , . !".split()]


def word_tokenizer(bos: bool = True) -> str:
    """A tokenizer.json of whole words (WordLevel) with ``<bos> ... <eos>`` around each text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    single = "<bos> $A <eos>" if bos else "$A <eos>"
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=[("<bos>", 1), ("<eos>", 3)])
    return tok.to_str()


def _stack(sd: dict[str, np.ndarray], src: str, dst: str, depth: int) -> dict[str, np.ndarray]:
    out = {}
    for i in range(depth):
        s, d = f"{src}.{i}", f"{dst}.blocks.{i}"
        for part in ("weight", "bias"):
            out[f"{d}.attn.qkv.{part}"] = np.concatenate([sd[f"{s}.self_attn.{x}_proj.{part}"] for x in "qkv"])
            out[f"{d}.attn.out.{part}"] = sd[f"{s}.self_attn.out_proj.{part}"]
            out[f"{d}.ln1.{part}"] = sd[f"{s}.layer_norm1.{part}"]
            out[f"{d}.ln2.{part}"] = sd[f"{s}.layer_norm2.{part}"]
            out[f"{d}.mlp.fc1.{part}"] = sd[f"{s}.mlp.fc1.{part}"]
            out[f"{d}.mlp.fc2.{part}"] = sd[f"{s}.mlp.fc2.{part}"]
    return out


def _geometry(c: Any) -> dict[str, Any]:
    return {"width": c.hidden_size, "depth": c.num_hidden_layers, "heads": c.num_attention_heads, "mlp_width": c.intermediate_size}


ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}


def clip_file(model: Any, path: Path, dtype: Any = np.float32, frames: int = 2, name: str = "random-clip") -> Path:
    """A transformers ``CLIPModel`` as a version-2 uform file (text, image, video from image)."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    tc, vc = model.config.text_config, model.config.vision_config
    t: dict[str, np.ndarray] = {
        "text.embed.weight": sd["text_model.embeddings.token_embedding.weight"],
        "text.pos.weight": sd["text_model.embeddings.position_embedding.weight"],
        "text.ln_final.weight": sd["text_model.final_layer_norm.weight"],
        "text.ln_final.bias": sd["text_model.final_layer_norm.bias"],
        "text.projection.weight": sd["text_projection.weight"],
        "image.patch.weight": sd["vision_model.embeddings.patch_embedding.weight"].reshape(vc.hidden_size, -1),
        "image.patch.bias": np.zeros(vc.hidden_size, np.float32),
        "image.cls": sd["vision_model.embeddings.class_embedding"],
        "image.pos.weight": sd["vision_model.embeddings.position_embedding.weight"],
        "image.ln_pre.weight": sd["vision_model.pre_layrnorm.weight"],
        "image.ln_pre.bias": sd["vision_model.pre_layrnorm.bias"],
        "image.ln_final.weight": sd["vision_model.post_layernorm.weight"],
        "image.ln_final.bias": sd["vision_model.post_layernorm.bias"],
        "image.projection.weight": sd["visual_projection.weight"],
    }
    t |= _stack(sd, "text_model.encoder.layers", "text", tc.num_hidden_layers)
    t |= _stack(sd, "vision_model.encoder.layers", "image", vc.num_hidden_layers)
    text = _geometry(tc) | {
        "activation": ACTIVATIONS[tc.hidden_act], "layer_norm_eps": tc.layer_norm_eps, "class_token": False,
        "pooling": "last_token", "tokenizer": "tokenizer.json", "vocab_size": tc.vocab_size,
        "context": tc.max_position_embeddings, "mask": "causal", "pad_id": 0,
    }  # fmt: skip
    image = _geometry(vc) | {
        "activation": ACTIVATIONS[vc.hidden_act], "layer_norm_eps": vc.layer_norm_eps, "ln_pre": True,
        "image_size": vc.image_size, "patch_size": vc.patch_size, "resize_rounding": "floor",
        "mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711],
    }  # fmt: skip
    source = {"family": "clip", "name": name, "architecture": "CLIPModel", "converter": "tests/v2ckpt.py"}
    labels = {"kind": "softmax", "scale": float(np.exp(sd["logit_scale"]))}
    config = make_config(
        model.config.projection_dim, tc.max_position_embeddings, {"text": text, "image": image, "video": {"from": "image", "frames": frames}},
        format_version=2, extra={"source": source, "labels": labels}, extras={"tokenizer": word_tokenizer()},
    )  # fmt: skip
    checkpoint.save(path, config, {k: np.ascontiguousarray(v.astype(dtype)) for k, v in t.items()})
    return path


def siglip_file(model: Any, path: Path, dtype: Any = np.float32) -> Path:
    """A transformers ``SiglipModel`` as a version-2 uform file (text, image)."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    tc, vc = model.config.text_config, model.config.vision_config
    w = vc.hidden_size
    t: dict[str, np.ndarray] = {
        "text.embed.weight": sd["text_model.embeddings.token_embedding.weight"],
        "text.pos.weight": sd["text_model.embeddings.position_embedding.weight"],
        "text.ln_final.weight": sd["text_model.final_layer_norm.weight"],
        "text.ln_final.bias": sd["text_model.final_layer_norm.bias"],
        "text.projection.weight": sd["text_model.head.weight"],
        "text.projection.bias": sd["text_model.head.bias"],
        "image.patch.weight": sd["vision_model.embeddings.patch_embedding.weight"].reshape(w, -1),
        "image.patch.bias": sd["vision_model.embeddings.patch_embedding.bias"],
        "image.pos.weight": sd["vision_model.embeddings.position_embedding.weight"],
        "image.ln_final.weight": sd["vision_model.post_layernorm.weight"],
        "image.ln_final.bias": sd["vision_model.post_layernorm.bias"],
        "image.pool.probe": sd["vision_model.head.probe"].reshape(w),
        "image.pool.attn.qkv.weight": sd["vision_model.head.attention.in_proj_weight"],
        "image.pool.attn.qkv.bias": sd["vision_model.head.attention.in_proj_bias"],
        "image.pool.attn.out.weight": sd["vision_model.head.attention.out_proj.weight"],
        "image.pool.attn.out.bias": sd["vision_model.head.attention.out_proj.bias"],
    }
    for part in ("weight", "bias"):
        t[f"image.pool.ln.{part}"] = sd[f"vision_model.head.layernorm.{part}"]
        t[f"image.pool.mlp.fc1.{part}"] = sd[f"vision_model.head.mlp.fc1.{part}"]
        t[f"image.pool.mlp.fc2.{part}"] = sd[f"vision_model.head.mlp.fc2.{part}"]
    t |= _stack(sd, "text_model.encoder.layers", "text", tc.num_hidden_layers)
    t |= _stack(sd, "vision_model.encoder.layers", "image", vc.num_hidden_layers)
    text = _geometry(tc) | {
        "activation": ACTIVATIONS[tc.hidden_act], "layer_norm_eps": tc.layer_norm_eps, "class_token": False,
        "pooling": "final_position", "projection": "linear_bias", "tokenizer": "tokenizer.json", "vocab_size": tc.vocab_size,
        "context": tc.max_position_embeddings, "mask": "none", "pad_to_context": True, "pad_id": 0,
    }  # fmt: skip
    image = _geometry(vc) | {
        "activation": ACTIVATIONS[vc.hidden_act], "layer_norm_eps": vc.layer_norm_eps, "class_token": False,
        "pooling": "attention", "projection": "none", "image_size": vc.image_size, "patch_size": vc.patch_size,
        "resize": "square", "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3,
    }  # fmt: skip
    labels = {"kind": "sigmoid", "scale": float(np.exp(sd["logit_scale"][0])), "bias": float(sd["logit_bias"][0])}
    config = make_config(
        w, tc.max_position_embeddings, {"text": text, "image": image}, format_version=2,
        extra={"source": {"family": "siglip", "name": "random-siglip"}, "labels": labels}, extras={"tokenizer": word_tokenizer(bos=False)},
    )  # fmt: skip
    checkpoint.save(path, config, {k: np.ascontiguousarray(v.astype(dtype)) for k, v in t.items()})
    return path


def dumps(path: Path) -> dict[str, Any]:
    """The config JSON of a checkpoint file (for tests that edit it)."""
    from uform.core import safetensors

    return json.loads(safetensors.parse(memoryview(path.read_bytes())).metadata["uform"])
