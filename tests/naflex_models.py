"""A random transformers ``Siglip2Model`` (SigLIP 2 NaFlex) saved as the Hub holds one, and the
six pictures the NaFlex tests and docs/models.md's figures use (tests/test_naflex.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from hf_models import train_spiece, visible

# patch 16, a 16 x 16 position grid, 256 patches at most: the real base geometry's pixels, a small stack
NAFLEX_SMALL: dict[str, Any] = {
    "text": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 16},
    "vision": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "patch_size": 16, "num_patches": 256},
}
# name: (width, height)
SIZES = {"square": (640, 640), "2:1": (800, 400), "1:3": (300, 900), "tiny": (5, 3), "huge": (4000, 3000), "strip": (2000, 40)}


def make_siglip2(directory: Path, geometry: dict[str, Any] = NAFLEX_SMALL, seed: int = 0, max_patches: int = 256) -> Path:
    """A random Siglip2Model of ``geometry`` with SigLIP 2's Gemma tokenizer and image processor."""
    import torch
    from transformers import GemmaTokenizer, Siglip2Config, Siglip2ImageProcessor, Siglip2Model

    spm = directory / "_gemma"
    shutil.copy(train_spiece(spm, 160), spm / "tokenizer.model")
    GemmaTokenizer.from_pretrained(str(spm)).save_pretrained(directory)
    shutil.rmtree(spm)
    vocab = len(json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]) + 8
    torch.manual_seed(seed)
    config = Siglip2Config(text_config={**geometry["text"], "vocab_size": vocab, "pad_token_id": 1}, vision_config=geometry["vision"])
    model = Siglip2Model(config).eval()
    with torch.no_grad():
        visible(model)
        model.logit_scale.fill_(2.3)
        model.logit_bias.fill_(-1.5)
    model.save_pretrained(directory)
    Siglip2ImageProcessor(max_num_patches=max_patches, patch_size=geometry["vision"]["patch_size"]).save_pretrained(directory)
    return directory


def picture(width: int, height: int, seed: int = 0) -> np.ndarray:
    """``uint8 [height, width, 3]``: smooth random colour (noise resized up), so resizes matter."""
    from PIL import Image

    base = np.random.default_rng(seed).integers(0, 256, (max(2, height // 8 + 1), max(2, width // 8 + 1), 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(base).resize((width, height), Image.Resampling.BICUBIC))


def reference(model: Any, pixels: list[np.ndarray], max_patches: int = 256) -> np.ndarray:
    """transformers' normalised ``get_image_features`` of each picture alone (its PIL processor)."""
    import torch
    from PIL import Image
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    proc = Siglip2ImageProcessorPil(max_num_patches=max_patches, patch_size=model.config.vision_config.patch_size)
    rows = []
    for p in pixels:
        with torch.no_grad():
            out = model.get_image_features(**proc(images=[Image.fromarray(p)], return_tensors="pt"))
        rows.append(getattr(out, "pooler_output", out)[0].numpy().astype(np.float64))
    ref = np.stack(rows)
    return ref / np.linalg.norm(ref, axis=1, keepdims=True)
