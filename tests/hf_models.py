"""Small real-family models for the conversion tests and benchmarks/models.py: transformers'
``CLIPModel`` and ``SiglipModel`` with random weights, saved with their tokenizer and image
processor as ``save_pretrained`` writes them (no download: CLIP's real BPE vocabulary comes
from open_clip_torch's package file, SigLIP's SentencePiece model is trained here on a corpus)."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

CLIP_SMALL: dict[str, Any] = {
    "text": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
    "vision": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "image_size": 32, "patch_size": 8},
    "projection_dim": 48,
}
SIGLIP_SMALL: dict[str, Any] = {
    "text": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 16},
    "vision": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "image_size": 32, "patch_size": 8},
}
# The real geometries (benchmarks/models.py)
CLIP_B32: dict[str, Any] = {
    "text": {"hidden_size": 512, "num_hidden_layers": 12, "num_attention_heads": 8, "intermediate_size": 2048},
    "vision": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "image_size": 224, "patch_size": 32},
    "projection_dim": 512,
}
CLIP_B16: dict[str, Any] = {**CLIP_B32, "vision": {**CLIP_B32["vision"], "patch_size": 16}}
SIGLIP_B16: dict[str, Any] = {
    "text": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 64},
    "vision": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "image_size": 224, "patch_size": 16},
}

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

CORPUS = [
    "a photo of a cat", "A Photo Of A DOG!", "two dogs, running; on the beach...", "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\nand    runs   of spaces", "naïve café déjà vu — crème brûlée", "Ünïcödé: ß, æ, ø, å, ñ, ç",
    "日本語のテキスト、東京タワー", "中文：一只猫坐在垫子上。", "Ελληνικά και русский текст", "emoji 🐱🐶 🎉👍🏽 👨‍👩‍👧",
    "punctuation!?!? (parens) [brackets] {braces} <angles> \"quotes\" 'single' `back`", "hyphen-ated e-mail user@example.com",
    "numbers 3.14159 1,000,000 42nd 2024-06-01", "can't won't it's they're", "", " ", "x",
    "a very long caption " * 30, "mixed CASE with ÀCCENTS and 123 digits", "café" * 50, "\u00a0non-breaking\u2003em space",
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-character table, which CLIP's BPE vocabulary is written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def clip_vocab_files(directory: Path) -> None:
    """``vocab.json`` and ``merges.txt`` of OpenAI's CLIP BPE (49408 tokens), from open_clip_torch's package."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the CLIP vocabulary comes from open_clip_torch's package: pip install open_clip_torch --no-deps")
    bpe = Path(list(spec.submodule_search_locations)[0]) / "bpe_simple_vocab_16e6.txt.gz"
    lines = gzip.open(bpe).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    merges = [tuple(line.split()) for line in lines]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n", encoding="utf-8")


def visible(model: Any) -> None:
    """The norms, biases and class embedding (initialised to ones and zeros) drawn at random
    too, so that a norm or bias read from the wrong tensor changes the embeddings."""
    import torch

    for name, p in model.named_parameters():
        if "norm" in name or "bias" in name or "class_embedding" in name or "probe" in name:
            p.add_(torch.randn_like(p) * 0.1)


def make_clip(directory: Path, geometry: dict[str, Any] = CLIP_SMALL, seed: int = 0, act: str = "quick_gelu") -> Path:
    """A random CLIPModel of ``geometry`` saved with its tokenizer and image processor."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config={**geometry["text"], "hidden_act": act}, vision_config={**geometry["vision"], "hidden_act": act},
        projection_dim=geometry["projection_dim"],
    )  # fmt: skip
    model = CLIPModel(config).eval()
    with torch.no_grad():
        visible(model)
        model.logit_scale.fill_(4.0)
    model.save_pretrained(directory)
    vocab = directory / "_vocab"
    clip_vocab_files(vocab)
    CLIPTokenizer(str(vocab / "vocab.json"), str(vocab / "merges.txt")).save_pretrained(directory)
    for f in vocab.iterdir():
        f.unlink()
    vocab.rmdir()
    size = geometry["vision"]["image_size"]
    CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size}).save_pretrained(directory)
    return directory


def train_spiece(directory: Path, vocab: int = 160) -> Path:
    """A SentencePiece unigram model trained on a made-up corpus (SigLIP's tokenizer is one)."""
    import io

    import sentencepiece as spm

    words = ["cat", "dog", "photo", "of", "a", "the", "running", "beach", "red", "blue", "circle", "square", "café", "naïve"]
    sentences = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(6)) for i in range(300)] + CORPUS
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab, model_type="unigram",
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, minloglevel=2)  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "spiece.model"
    path.write_bytes(model.getvalue())
    return path


def make_siglip(directory: Path, geometry: dict[str, Any] = SIGLIP_SMALL, seed: int = 0, vocab: int = 160, gemma: bool = False) -> Path:
    """A random SiglipModel of ``geometry`` saved with a SigLIP tokenizer (``spiece.model``; with
    ``gemma``, SigLIP 2's: a Gemma ``tokenizer.json`` made from the same SentencePiece model)
    and image processor."""
    import shutil

    import torch
    from transformers import GemmaTokenizer, SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipTokenizer

    if gemma:
        spm = directory / "_gemma"
        shutil.copy(train_spiece(spm, vocab), spm / "tokenizer.model")
        GemmaTokenizer.from_pretrained(str(spm)).save_pretrained(directory)
        shutil.rmtree(spm)
        import json as _json

        vocab = len(_json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]) + 8  # room for added tokens
    torch.manual_seed(seed)
    config = SiglipConfig(text_config={**geometry["text"], "vocab_size": vocab, "pad_token_id": 1}, vision_config=geometry["vision"])
    model = SiglipModel(config).eval()
    with torch.no_grad():
        visible(model)
        model.logit_scale.fill_(2.3)
        model.logit_bias.fill_(-1.5)
    model.save_pretrained(directory)
    if not gemma:
        spiece = train_spiece(directory / "_spm", vocab)
        SiglipTokenizer(str(spiece), model_max_length=geometry["text"]["max_position_embeddings"]).save_pretrained(directory)
        spiece.unlink()
        spiece.parent.rmdir()
    size = geometry["vision"]["image_size"]
    SiglipImageProcessor(size={"height": size, "width": size}).save_pretrained(directory)
    return directory


OPEN_CLIP_SMALL: dict[str, Any] = {
    "embed_dim": 48,
    "vision_cfg": {"layers": 2, "width": 64, "patch_size": 8, "image_size": 32, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 4, "layers": 2},
}


def make_open_clip(directory: Path, geometry: dict[str, Any] = OPEN_CLIP_SMALL, seed: int = 0, quick_gelu: bool = False) -> tuple[Path, Any]:
    """A random open_clip ``CLIP`` saved as open_clip publishes one (``open_clip_config.json`` and
    ``open_clip_pytorch_model.bin``, no tokenizer.json); answers the directory and the model."""
    import torch
    from open_clip import CLIP
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(seed)
    model = CLIP(embed_dim=geometry["embed_dim"], vision_cfg=CLIPVisionCfg(**geometry["vision_cfg"]),
                 text_cfg=CLIPTextCfg(**geometry["text_cfg"]), quick_gelu=quick_gelu).eval()  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or "bias" in name or "class_embedding" in name:
                p.add_(torch.randn_like(p) * 0.1)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), directory / "open_clip_pytorch_model.bin")
    cfg = {"model_cfg": {**geometry, "quick_gelu": quick_gelu}, "preprocess_cfg": {"mean": CLIP_MEAN, "std": CLIP_STD}}
    (directory / "open_clip_config.json").write_text(json.dumps(cfg))
    return directory, model
