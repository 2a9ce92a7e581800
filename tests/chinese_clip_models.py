"""A random ``ChineseCLIPModel`` at the geometry of OFA-Sys/chinese-clip-vit-base-patch16 (depth
cut to 2 and 2), saved as ``save_pretrained`` writes it, with a ``vocab.txt`` written here (no
download): BERT's special tokens, CJK characters whole and as ``##`` continuations, full-width
punctuation, English words and ``##`` pieces, and the Hub files' tokenizer and image processor
configs as remembered (``do_lower_case``, a square resize without a crop)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# chinese-clip-vit-base-patch16's geometry: RoBERTa-wwm-base (BERT) text, ViT-B/16 image
BASE16: dict[str, Any] = {
    "text": {"hidden_size": 768, "num_hidden_layers": 2, "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2},
    "vision": {"hidden_size": 768, "num_hidden_layers": 2, "num_attention_heads": 12, "intermediate_size": 3072, "image_size": 224, "patch_size": 16},
    "projection_dim": 512,
}
SMALL: dict[str, Any] = {
    "text": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 64, "type_vocab_size": 2},
    "vision": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "image_size": 32, "patch_size": 8},
    "projection_dim": 48,
}

HAN = "一只猫狗的照片在海滩上跑两个人中文文本混合标点全角长超杰尼龟妙蛙种子小火龙皮卡丘天日本語表情控制字符这里例子国路径查询值和是不了我你他她们大小好看红色"
WORDS = "a photo of cat dog the beach on two running un aff able play runner s mixed text naive cafe deja vu creme brulee full width em space http www com example user"
PIECES = "##s ##ing ##aff ##able ##er ##ed ##ly ##e ##a ##o ##t ##n ##r ##l ##c ##d ##i ##u ##p ##h ##m"
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + list("，。！？、；：（）《》“”‘’【】…—")
TEXTS = [
    "一只猫的照片", "杰尼龟", "妙蛙种子", "小火龙", "皮卡丘", "a photo of a cat", "A Photo Of A DOG!", "猫cat混合mixed文本",
    "ＦＵＬＬＷＩＤＴＨ！全角，标点。", "naïve café déjà vu — crème brûlée", "ÀÉÎÕÜ ß æ ø å ñ ç", "emoji 🐱🐶 🎉 表情",
    "  leading and trailing spaces  ", "tabs\tand\nnewlines\r\nand    runs", "(parens) [brackets] {braces} “引号” 【括号】",
    "user@example.com 3.14 1,000", "unaffable playing runner's", "x", "\u00a0non-breaking\u2003em space\u200bzero width",
    "控制\x00字符\x07在\ufffd这里", "日本語のテキスト 한국어", "[MASK] 和 [UNK]", "a" * 120, "超长的中文文本" * 100,
    "https://例子.中国/路径?查询=值", "红色的大狗在海滩上跑", "",
]  # fmt: skip


def vocabulary() -> list[str]:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [chr(c) for c in range(ord("0"), ord("9") + 1)] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens += PUNCT + ["🐱", "🎉"]
    han = list(dict.fromkeys(HAN))
    tokens += han + ["##" + c for c in han[::3]]
    tokens += WORDS.split() + PIECES.split() + ["##" + chr(c) for c in range(ord("0"), ord("9") + 1)]
    return list(dict.fromkeys(tokens))


def make_chinese_clip(directory: Path, geometry: dict[str, Any] = BASE16, processor: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """A ``ChineseCLIPModel`` of ``geometry`` with random weights (``seed``), its ``vocab.txt``,
    ``tokenizer_config.json`` and ``preprocessor_config.json`` (``processor``; None: a square resize, no crop, as the Hub files)
    written into ``directory``."""
    import torch
    from transformers import ChineseCLIPConfig, ChineseCLIPModel

    directory.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512}))
    size = geometry["vision"]["image_size"]
    pre = {key: {"height": size, "width": size} for key in ("size", "crop_size")} | {"do_center_crop": False} if processor is None else dict(processor)
    pre |= {"do_normalize": True, "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "resample": 3, "image_processor_type": "ChineseCLIPImageProcessor",
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}  # fmt: skip
    (directory / "preprocessor_config.json").write_text(json.dumps(pre))
    torch.manual_seed(seed)
    cfg = ChineseCLIPConfig(text_config=geometry["text"] | {"vocab_size": len(vocab)}, vision_config=geometry["vision"], projection_dim=geometry["projection_dim"])
    model = ChineseCLIPModel(cfg).eval()
    with torch.no_grad():  # the init's LayerNorms are identities and its biases zeros: give them values
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or "layrnorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.02)
    model.save_pretrained(str(directory))
    return directory
