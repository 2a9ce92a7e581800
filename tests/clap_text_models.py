"""A random transformers ``ClapModel`` saved as the Hub holds one, with a RoBERTa byte-level BPE
tokenizer trained here (no vocabulary reaches these machines), and the texts the CLAP text tests
read (tests/test_clap_text.py, tests/test_converted_clap.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hf_models import CORPUS

# The real text geometry's ends (RoBERTa: 514 positions, pad id 1, post-norm, eps 1e-12), a small stack.
TEXT_SMALL: dict[str, Any] = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
# The real audio layout (spec_size 256, 64 mel bins, patch 4, window 8, four stages), narrow and shallow.
AUDIO_SMALL: dict[str, Any] = {"patch_embeds_hidden_size": 16, "hidden_size": 128, "depths": [1, 1, 2, 1], "num_attention_heads": [1, 2, 2, 4]}
PROJECTION = 32
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids 0 .. 3; <mask> here 4
TEXTS = [
    *CORPUS,
    "the sound of rain on a tin roof", "a dog barks twice, then a car passes", "<s> looks special </s>",
    "line one\nline two\n\n\nline five", "a <pad> in the text, and <pad><pad> twice", "trailing newline\n", "\t", "ab" * 700, "x" * 3000, "🎵" * 200,
    " ".join(str(i) for i in range(900)),  # past the context's 512 tokens: cut as truncation=True cuts
]


def train_bpe(directory: Path, vocab: int = 600) -> tuple[Path, Path]:
    """``vocab.json`` and ``merges.txt`` of a byte-level BPE (GPT-2's and RoBERTa's kind: every
    byte a token, then merges) trained on ``TEXTS``, RoBERTa's special tokens first."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS * 3, vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS, show_progress=False)
    directory.mkdir(parents=True, exist_ok=True)
    names = bpe.save_model(str(directory))
    return Path(names[0]), Path(names[1])


def make_clap(directory: Path, seed: int = 0, text: dict[str, Any] = TEXT_SMALL, audio: dict[str, Any] = AUDIO_SMALL, tokenizer_json: bool = True) -> Path:
    """A random ClapModel saved with its RoBERTa tokenizer (only ``vocab.json`` and ``merges.txt``
    unless ``tokenizer_json``) and an unfused model's feature extractor; norms and biases drawn
    at random too."""
    import torch
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, RobertaTokenizer

    from hf_models import visible

    bpe = directory / "_bpe"
    vocab_file, merges_file = train_bpe(bpe)
    # model_max_length 512: laion/clap-htsat-unfused's tokenizer_config.json (from memory), its 514 positions less RoBERTa's offset 2
    tokenizer = RobertaTokenizer.from_pretrained(str(bpe), model_max_length=512)
    tokenizer.save_pretrained(directory)
    if tokenizer_json:
        vocab_file.unlink()
        merges_file.unlink()
    else:  # the slow tokenizer's files alone
        (directory / "tokenizer.json").unlink()
        vocab_file.rename(directory / "vocab.json")
        merges_file.rename(directory / "merges.txt")
    bpe.rmdir()
    vocab = len(tokenizer) + 3  # a few rows past the tokenizer's ids, as RoBERTa's 50265 has
    torch.manual_seed(seed)
    config = ClapConfig(text_config={**text, "vocab_size": vocab}, audio_config=audio, projection_dim=PROJECTION)
    model = ClapModel(config).eval()
    with torch.no_grad():
        visible(model)
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "token_type" in name or "batch_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        bn = model.audio_model.audio_encoder.batch_norm
        bn.running_mean.normal_(0, 5.0)
        bn.running_var.uniform_(0.5, 30.0)
    model.save_pretrained(directory)
    ClapFeatureExtractor(truncation="rand_trunc").save_pretrained(directory)  # an unfused model's (laion/clap-htsat-unfused)
    return directory


def clap_text_file(directory: Path, path: Path) -> Path:
    """The text tower of the ClapModel saved in ``directory`` as a version-2 uform file, with the
    tensors and fields docs/checkpoint.md states (independent of ``uform convert``, so these tests
    pin the format): RoBERTa's positions (``non_pad``: the table from ``pad_token_id`` on) with the token type's row added,
    ``ln_pre`` the embeddings' LayerNorm, post-norm blocks, the pooler, the MLP projection."""
    import json

    import numpy as np
    from safetensors.numpy import load_file

    from uform.core import checkpoint
    from uform.core.config import make_config

    sd = load_file(str(directory / "model.safetensors"))
    tc = json.loads((directory / "config.json").read_text())["text_config"]
    pad, e = tc["pad_token_id"], "text_model.embeddings"
    context = tc["max_position_embeddings"] - pad - 1
    t = {
        "text.embed.weight": sd[f"{e}.word_embeddings.weight"],
        "text.pos.weight": sd[f"{e}.position_embeddings.weight"][pad:] + sd[f"{e}.token_type_embeddings.weight"][0],
        "text.ln_pre.weight": sd[f"{e}.LayerNorm.weight"], "text.ln_pre.bias": sd[f"{e}.LayerNorm.bias"],
        "text.pooler.weight": sd["text_model.pooler.dense.weight"], "text.pooler.bias": sd["text_model.pooler.dense.bias"],
    }  # fmt: skip
    for i in range(tc["num_hidden_layers"]):
        s, d = f"text_model.encoder.layer.{i}", f"text.blocks.{i}"
        for part in ("weight", "bias"):
            t[f"{d}.attn.qkv.{part}"] = np.concatenate([sd[f"{s}.attention.self.{x}.{part}"] for x in ("query", "key", "value")])
            t[f"{d}.attn.out.{part}"] = sd[f"{s}.attention.output.dense.{part}"]
            t[f"{d}.ln1.{part}"] = sd[f"{s}.attention.output.LayerNorm.{part}"]
            t[f"{d}.mlp.fc1.{part}"] = sd[f"{s}.intermediate.dense.{part}"]
            t[f"{d}.mlp.fc2.{part}"] = sd[f"{s}.output.dense.{part}"]
            t[f"{d}.ln2.{part}"] = sd[f"{s}.output.LayerNorm.{part}"]
    for i in (0, 1):
        for part in ("weight", "bias"):
            t[f"text.projection.{i}.{part}"] = sd[f"text_projection.linear{i + 1}.{part}"]
    tower = {
        "width": tc["hidden_size"], "depth": tc["num_hidden_layers"], "heads": tc["num_attention_heads"], "mlp_width": tc["intermediate_size"],
        "layer_norm_eps": tc["layer_norm_eps"], "norm": "post", "class_token": False, "ln_pre": True, "pooling": "first_token",
        "pooler": "tanh", "projection": "mlp", "tokenizer": "tokenizer.json", "vocab_size": tc["vocab_size"], "context": context, "pad_id": pad, "positions": "non_pad",
    }  # fmt: skip
    tokenizer = (directory / "tokenizer.json").read_text(encoding="utf-8")
    config = make_config(tc["projection_dim"], context, {"text": tower}, format_version=2, extras={"tokenizer": tokenizer})
    checkpoint.save(path, config, {k: np.ascontiguousarray(v, np.float32) for k, v in t.items()})
    return path
