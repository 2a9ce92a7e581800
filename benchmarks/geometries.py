"""The popular Hub checkpoints' geometries, each built from its config's numbers with random
weights and one layer a tower (no download), converted, and compared with the family's own
model (transformers' CLIPModel / SiglipModel, open_clip's CLIP) at a float32 load: what
docs/models.md's table of Hub ids says uform does with each.

    python benchmarks/geometries.py                 # every row (about 10 minutes on 2 Zen 3 cores)
    python benchmarks/geometries.py --only so400m   # the rows whose id holds the word
    python benchmarks/geometries.py --heads         # so400m's attention, 16 heads of 72 against 18 of 64

Widths, heads, MLP widths, image and patch sizes and text contexts are the Hub configs' as
written below; depth is 1 (the Hub's in the `layers` column of the table), and the text
vocabularies are small stand-ins (CLIP: OpenAI's real 49,408-token BPE; SigLIP: a SentencePiece
of 160 tokens; SigLIP 2: a Gemma tokenizer.json made from it), which changes no geometry.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import hf_models  # noqa: E402

TEXTS = ["a photo of a cat", "A Photo Of A DOG!", "naïve café", "a very long caption " * 30]


def clip(text: tuple[int, int, int], vision: tuple[int, int, int], size: int, patch: int, proj: int, act: str) -> dict[str, Any]:
    """(width, heads, mlp) of each tower: CLIPConfig's fields, one layer each."""
    return {"family": "clip", "act": act, "projection_dim": proj,
            "text": {"hidden_size": text[0], "num_attention_heads": text[1], "intermediate_size": text[2], "num_hidden_layers": 1},
            "vision": {"hidden_size": vision[0], "num_attention_heads": vision[1], "intermediate_size": vision[2], "num_hidden_layers": 1,
                       "image_size": size, "patch_size": patch}}  # fmt: skip


def siglip(text: tuple[int, int, int], vision: tuple[int, int, int], size: int, patch: int, context: int = 64, gemma: bool = False,
           projection: int | None = None) -> dict[str, Any]:  # fmt: skip
    t = {"hidden_size": text[0], "num_attention_heads": text[1], "intermediate_size": text[2], "num_hidden_layers": 1, "max_position_embeddings": context}
    if projection is not None:
        t["projection_size"] = projection
    return {"family": "siglip2" if gemma else "siglip", "gemma": gemma, "text": t,
            "vision": {"hidden_size": vision[0], "num_attention_heads": vision[1], "intermediate_size": vision[2], "num_hidden_layers": 1,
                       "image_size": size, "patch_size": patch}}  # fmt: skip


B, L, SO = (768, 12, 3072), (1024, 16, 4096), (1152, 16, 4304)
ROWS: dict[str, dict[str, Any]] = {
    "openai/clip-vit-base-patch32": clip((512, 8, 2048), B, 224, 32, 512, "quick_gelu"),
    "openai/clip-vit-base-patch16": clip((512, 8, 2048), B, 224, 16, 512, "quick_gelu"),
    "openai/clip-vit-large-patch14": clip(B, L, 224, 14, 768, "quick_gelu"),
    "openai/clip-vit-large-patch14-336": clip(B, L, 336, 14, 768, "quick_gelu"),
    "laion/CLIP-ViT-H-14-laion2B-s32B-b79K": clip(L, (1280, 16, 5120), 224, 14, 1024, "gelu"),
    "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k": clip((1280, 20, 5120), (1664, 16, 8192), 224, 14, 1280, "gelu"),
    "facebook/metaclip-b32-400m": clip((512, 8, 2048), B, 224, 32, 512, "quick_gelu"),
    "apple/DFN5B-CLIP-ViT-H-14-378": {"family": "open_clip", "embed_dim": 1024, "vision_cfg": {"layers": 1, "width": 1280, "head_width": 80, "mlp_ratio": 4.0, "patch_size": 14, "image_size": 378},
                                      "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 1024, "heads": 16, "layers": 1}},  # fmt: skip
    "google/siglip-base-patch16-224": siglip(B, B, 224, 16),
    "google/siglip-base-patch16-256": siglip(B, B, 256, 16),
    "google/siglip-base-patch16-384": siglip(B, B, 384, 16),
    "google/siglip-base-patch16-512": siglip(B, B, 512, 16),
    "google/siglip-large-patch16-256": siglip(L, L, 256, 16),
    "google/siglip-large-patch16-384": siglip(L, L, 384, 16),
    "google/siglip-so400m-patch14-224": siglip(SO, SO, 224, 14, context=16),
    "google/siglip-so400m-patch14-384": siglip(SO, SO, 384, 14),
    "google/siglip2-base-patch16-224": siglip(B, B, 224, 16, gemma=True),
    "google/siglip2-base-patch16-256": siglip(B, B, 256, 16, gemma=True),
    "google/siglip2-base-patch16-384": siglip(B, B, 384, 16, gemma=True),
    "google/siglip2-base-patch16-512": siglip(B, B, 512, 16, gemma=True),
    "google/siglip2-so400m-patch14-384": siglip(SO, SO, 384, 14, gemma=True),
    "google/siglip2-so400m-patch16-512": siglip(SO, SO, 512, 16, gemma=True),
    "google/siglip2-giant-opt-patch16-256": siglip(SO, (1536, 16, 6144), 256, 16, gemma=True, projection=1536),
    "google/siglip2-giant-opt-patch16-384": siglip(SO, (1536, 16, 6144), 384, 16, gemma=True, projection=1536),
}


def unit(x: Any) -> np.ndarray:
    a = np.asarray(x, np.float64)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def pictures(count: int, size: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    base = np.repeat(np.repeat(rng.integers(0, 256, (count, 8, 8, 3)), -(-size // 8), axis=1), -(-size // 8), axis=2)[:, :size, :size]
    return np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)


def reference(row: dict[str, Any], directory: Path, model: Any, px: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import torch

    family = row["family"]
    mean, std = (hf_models.CLIP_MEAN, hf_models.CLIP_STD) if family in ("clip", "open_clip") else ([0.5] * 3, [0.5] * 3)
    x = torch.from_numpy(((px.astype(np.float32) / 255 - np.float32(mean)) / np.float32(std))).permute(0, 3, 1, 2).contiguous()
    with torch.no_grad():
        if family == "open_clip":
            import open_clip

            return model.encode_text(open_clip.get_tokenizer("ViT-B-32")(TEXTS)).numpy(), model.encode_image(x).numpy()
        from transformers import AutoModel, AutoTokenizer

        hf = AutoModel.from_pretrained(directory).eval()
        tok = AutoTokenizer.from_pretrained(directory)
        tok.padding_side = "right"
        context = hf.config.text_config.max_position_embeddings
        if family == "clip":
            enc = dict(tok(TEXTS, padding=True, truncation=True, max_length=context, return_tensors="pt"))
        else:
            if row.get("gemma"):
                from transformers import Siglip2Tokenizer

                tok = Siglip2Tokenizer.from_pretrained(directory)
                tok.padding_side = "right"
            enc = {"input_ids": tok(TEXTS, padding="max_length", truncation=True, max_length=context, return_tensors="pt")["input_ids"]}
        return hf.get_text_features(**enc).pooler_output.numpy(), hf.get_image_features(pixel_values=x).pooler_output.numpy()


def check(name: str, row: dict[str, Any], tmp: Path) -> str:
    import uform
    from uform.convert import convert

    start = time.perf_counter()
    d, model = tmp / name.split("/")[1], None
    if row["family"] == "open_clip":
        geometry = {k: row[k] for k in ("embed_dim", "vision_cfg", "text_cfg")}
        d, model = hf_models.make_open_clip(d, geometry, quick_gelu=True)
        size = row["vision_cfg"]["image_size"]
    elif row["family"] == "clip":
        hf_models.make_clip(d, row, act=row["act"])
        size = row["vision"]["image_size"]
    else:
        hf_models.make_siglip(d, row, gemma=row["gemma"])
        size = row["vision"]["image_size"]
    out = tmp / "out.safetensors"
    try:
        convert(d, out, dtype="f32")
    except Exception as e:  # noqa: BLE001 - the row says what uform says
        return f"| {name} | refused: {e} |"
    px = pictures(2, size)
    text, image = reference(row, d, model, px)
    with uform.Model.load_ram(out, quantization=uform.Scalar.F32) as m:
        t = np.asarray(m.text_encode(TEXTS, uform.Arena()).embeddings)
        i = np.asarray(m.image_encode_pixels(list(px), uform.Arena()).embeddings)
    tc, ic = (unit(t) * unit(text)).sum(1).min(), (unit(i) * unit(image)).sum(1).min()
    return f"| {name} | converts | {tc:.6f} | {ic:.6f} | {time.perf_counter() - start:.0f} s |"


def heads(rounds: int) -> None:
    """What leaving so400m's attention unfused costs: its image tower (one layer, 729 tokens of
    1152) with 16 heads of 72 (left to ONNX Runtime's ops: not a multiple of 16) against 18 heads
    of 64 (the fused op), the same products and FLOPs; BF16 and E4M3 loads (the e4m3 backend),
    4 pictures a call, the two loads called in turns, best and median of ``rounds``."""
    import statistics

    import uform
    from uform.convert import convert

    px = list(np.random.default_rng(0).integers(0, 256, (4, 384, 384, 3), dtype=np.uint8))
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for h in (16, 18):
            g = siglip((64, 4, 128), (1152, h, 4304), 384, 14, context=16, projection=1152)
            files[h] = Path(tmp) / f"h{h}.safetensors"
            convert(hf_models.make_siglip(Path(tmp) / f"d{h}", g), files[h], dtype="bf16")
        for q in (uform.Scalar.BF16, uform.Scalar.E4M3):
            models = {h: uform.Model.load_ram(f, quantization=q) for h, f in files.items()}
            times: dict[int, list[float]] = {h: [] for h in models}
            for _ in range(rounds + 1):
                for h, m in models.items():
                    start = time.perf_counter()
                    m.image_encode_pixels(px, uform.Arena())
                    times[h].append(time.perf_counter() - start)
            for h, m in models.items():
                best, median = min(times[h][1:]), statistics.median(times[h][1:])
                print(f"{q.name} load, {m.backend} backend, {h} heads of {1152 // h}: best {best * 1000:.0f} ms, median {median * 1000:.0f} ms")
                m.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="only the rows whose Hub id holds this text")
    parser.add_argument("--heads", action="store_true", help="time so400m's attention unfused (16 x 72) against fused (18 x 64)")
    parser.add_argument("--rounds", type=int, default=10, help="--heads: calls of each load")
    args = parser.parse_args()
    if args.heads:
        heads(args.rounds)
        return
    print("| Hub id | uform | text min cos | image min cos | time |")
    print("|---|---|---|---|---|")
    for name, row in ROWS.items():
        if args.only in name:
            with tempfile.TemporaryDirectory() as tmp:
                print(check(name, row, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
