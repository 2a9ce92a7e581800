"""Transformers' ``ClapModel`` (LAION's CLAP: laion/clap-htsat-unfused, laion/larger_clap_general,
laion/larger_clap_music) as a uform file: a RoBERTa text tower and an HTSAT audio tower.

Text (RoBERTa, as ``get_text_features`` runs it): word embeddings plus positions counted over
the tokens that are not ``pad_token_id`` from ``pad_token_id + 1`` (``positions: non_pad``; the
rows from ``pad_token_id`` on, with the one token type's embedding added, are the file's
``text.pos.weight``), the embeddings' LayerNorm (``ln_pre``), post-norm blocks (exact
GELU), padding masked, the first token (the tokenizer's ``<s>``) through the pooler (``Linear``,
``tanh``) and the projection (``Linear``, ``ReLU``, ``Linear``). Audio: the front end and Swin
stack of :mod:`.hf_clap_audio`, the same projection. Labels: softmax over
``exp(logit_scale_a)`` x cosine (``logits_per_audio``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .bert import bert_stack, model_max_length
from .common import Converted, Taker, Text, activation, config, geometry, integer, logit_scale, norm, positive, section, text_geometry
from .hf_clap_audio import audio_tensors
from .hf_clap_front import front
from .sources import ConvertError, Weights
from .tokenizer import tokenizer_json

TEXT_DEFAULTS = Text(width=768, depth=12, heads=12, mlp=3072, vocab=50265, context=514)  # transformers' ClapTextConfig
# buffers; and logit_scale_t, the scale of logits_per_text (uform's labels score one recording against texts: logit_scale_a)
IGNORED = ("text_model.embeddings.position_ids", "text_model.embeddings.token_type_ids", "logit_scale_t")
TEXT = "text_model"


def convert(directory: Path, cfg: dict[str, Any], weights: Weights, source: dict[str, str], frames: int) -> Converted:
    where = str(directory / "config.json")
    text_cfg, audio_cfg = section(cfg, "text_config", where), section(cfg, "audio_config", where)
    dimensions = integer(cfg, "projection_dim", where, 512)
    t = Taker(weights, ignore=lambda n: n in IGNORED)
    notes: list[str] = []
    for at, sub in (("", cfg), (" text_config", text_cfg), (" audio_config", audio_cfg)):
        if sub.get("projection_hidden_act", "relu") != "relu":
            raise ConvertError(f"{where}{at}: projection_hidden_act {sub['projection_hidden_act']!r} is not supported; supported: 'relu'")
    text, tokenizer = text_tower(directory, t, text_cfg, where, notes)
    projection(t, "text", "text_projection", text["width"], dimensions, where + " text_config")
    audio = front(directory, t, audio_cfg, where, notes) | audio_tensors(t, audio_cfg, where)
    width = integer(audio_cfg, "hidden_size", where + " audio_config", 768)  # the last stage's width (hf_clap_audio checks it)
    projection(t, "audio", "audio_projection", width, dimensions, where + " audio_config")
    scale = logit_scale(t, "logit_scale_a")
    tensors = t.finish()
    towers = {"text": text, "audio": audio}
    out = config(dimensions, text["context"], towers, source, {"kind": "softmax", "scale": scale, "bias": 0.0})
    return Converted(out, tensors, tokenizer, notes, list(weights.files))


def projection(t: Taker, target: str, source: str, width: int, dimensions: int, why: str) -> None:
    """``ClapProjectionLayer`` (``linear1`` [D, W], ReLU, ``linear2`` [D, D]) as ``target.projection.0`` and ``.1``."""
    for i, (layer, columns) in enumerate((("linear1", width), ("linear2", dimensions))):
        t.take(f"{target}.projection.{i}.weight", f"{source}.{layer}.weight", (dimensions, columns), why + ".hidden_size, projection_dim")
        t.take(f"{target}.projection.{i}.bias", f"{source}.{layer}.bias", (dimensions,), why + ".projection_dim")


def text_tower(directory: Path, t: Taker, text_cfg: dict[str, Any], where: str, notes: list[str]) -> tuple[dict[str, Any], str]:
    """The RoBERTa text tower's tensors taken into ``t``, its fields and its tokenizer's JSON text."""
    at = where + " text_config"
    g = text_geometry(text_cfg, where, TEXT_DEFAULTS)
    w, vocab = g.width, g.vocab
    pad = text_cfg.get("pad_token_id", 1)
    if not isinstance(pad, int) or isinstance(pad, bool) or not 0 <= pad < g.context - 1:
        raise ConvertError(f"{at}: field 'pad_token_id' is {pad!r}, not a token id below max_position_embeddings - 1 ({g.context - 1})")
    types = integer(text_cfg, "type_vocab_size", at, 1)
    context = g.context - pad - 1  # RoBERTa's positions start past the pad token's id
    tokenizer, _ = tokenizer_json(directory, "clap", vocab, notes)  # uform pads with pad_token_id: padding is masked, whatever its id
    longest = model_max_length(directory)
    if longest is not None and longest < context:
        context = longest
    why = "config.json text_config"
    e = f"{TEXT}.embeddings"
    t.take("text.embed.weight", f"{e}.word_embeddings.weight", (vocab, w), why + ".vocab_size, hidden_size")
    positions = np.asarray(t.get(f"{e}.position_embeddings.weight", (g.context, w), why + ".max_position_embeddings, hidden_size"), np.float32)
    token_type = np.asarray(t.get(f"{e}.token_type_embeddings.weight", (types, w), why + ".type_vocab_size, hidden_size"), np.float32)
    t.put("text.pos.weight", positions[pad : pad + 1 + context] + token_type[0])  # row 0 the pad token's; every token is of type 0
    norm(t, "text.ln_pre", f"{e}.LayerNorm", w, why)
    bert_stack(t, TEXT, "text", w, g.depth, g.mlp, why)
    t.take("text.pooler.weight", f"{TEXT}.pooler.dense.weight", (w, w), why + ".hidden_size")
    t.take("text.pooler.bias", f"{TEXT}.pooler.dense.bias", (w,), why + ".hidden_size")
    fields = geometry(w, g.depth, g.heads, g.mlp, at) | {
        "token_width": 0,
        "activation": activation(text_cfg.get("hidden_act", "gelu"), at),
        "layer_norm_eps": positive(text_cfg, "layer_norm_eps", at, 1e-12),
        "norm": "post",
        "class_token": False,
        "ln_pre": True,
        "pooling": "first_token",
        "pooler": "tanh",
        "projection": "mlp",
        "tokenizer": "tokenizer.json",
        "vocab_size": vocab,
        "context": context,
        "mask": "padding",
        "pad_id": pad,
        "positions": "non_pad",
    }
    return fields, tokenizer

