"""Converted CLIP and SigLIP models at their real geometries (random weights: no download):
the parity table and the speed goals of issue 59, against transformers in the same run.

    python benchmarks/models.py [--models clip-b32,clip-b16,siglip-b16] [--images 32] [--seconds 3]

Per model: transformers' ``CLIPModel`` / ``SiglipModel`` (``save_pretrained`` with its
tokenizer and image processor, tests/hf_models.py), converted with ``uform.convert`` to an F32
file and to the default BF16 one; the parity table (least cosine of uform's text and image
embeddings with transformers' ``get_text_features`` / ``get_image_features`` in float32 over
tests/hf_models.py's corpus and 8 pictures, per file and load; the share of corpus texts whose
token ids equal the family tokenizer's; the largest pixel difference of uform's preprocessing
from ``AutoImageProcessor.from_pretrained(dir)`` on JPEG photos of 8 aspect ratios), then for
CLIP ViT-B/16: ``image_encode`` of 640x480 JPEGs (the default BF16 load) against transformers'
``CLIPModel`` fed by its image processor in float32 and under BF16 autocast, ``text_encode`` of
12-byte queries one at a time against transformers float32, and the conversion's time against
reading the source file's bytes and against safetensors' ``load_file`` of it (each with the
file's pages dropped from the page cache first). Writes
benchmarks/results/models.json. ``--tiny``: small geometries, for tests/test_benchmarks.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import rate, save, table  # noqa: E402

import hf_models  # noqa: E402

GEOMETRIES = {"clip-b32": ("clip", hf_models.CLIP_B32), "clip-b16": ("clip", hf_models.CLIP_B16), "siglip-b16": ("siglip", hf_models.SIGLIP_B16)}
TINY = {"clip-b32": ("clip", hf_models.CLIP_SMALL), "clip-b16": ("clip", hf_models.CLIP_SMALL), "siglip-b16": ("siglip", hf_models.SIGLIP_SMALL)}
ASPECTS = [(640, 480), (480, 640), (1024, 768), (1920, 1080), (1080, 1920), (500, 500), (1200, 300), (300, 1200)]
QUERY = "a red circle"  # 12 bytes


def photos(directory: Path, count: int, size: tuple[int, int]) -> list[Path]:
    """JPEG files with photo-like content (as benchmarks/media.py writes them): smooth gradients plus noise."""
    from media import pattern  # tests/media.py
    from PIL import Image

    rng = np.random.default_rng(size[0] * 7 + size[1])
    out = []
    for i in range(count):
        picture = pattern(size[1], size[0], seed=i).astype(np.int16) + rng.integers(-12, 12, (size[1], size[0], 3))
        path = directory / f"photo{size[0]}x{size[1]}-{i}.jpg"
        Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=90)
        out.append(path)
    return out


def unit(x: Any) -> np.ndarray:
    a = np.asarray(x, np.float64)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def drop_cache(path: Path) -> None:
    """The file's clean pages dropped from the page cache (no root needed), so a read reads the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_seconds(path: Path) -> float:
    drop_cache(path)
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 << 20)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def load_seconds(path: Path) -> float:
    """The source read as a program reads it: safetensors' numpy loader, every tensor an array (cold)."""
    from safetensors.numpy import load_file

    drop_cache(path)
    t = time.perf_counter()
    load_file(path)
    return time.perf_counter() - t


def parity(family: str, directory: Path, files: dict[str, Path], pictures: np.ndarray, s: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    import uform
    from uform import Arena, Scalar

    model = AutoModel.from_pretrained(directory).eval()
    tok = AutoTokenizer.from_pretrained(directory)
    context = model.config.text_config.max_position_embeddings
    enc = tok(hf_models.CORPUS, padding="max_length" if family == "siglip" else True, truncation=True, max_length=context, return_tensors="pt")
    mean, std = (hf_models.CLIP_MEAN, hf_models.CLIP_STD) if family == "clip" else ([0.5] * 3, [0.5] * 3)
    x = (pictures.astype(np.float32) / 255 - np.float32(mean)) / np.float32(std)
    with torch.no_grad():
        text = model.get_text_features(**({"input_ids": enc["input_ids"]} if family == "siglip" else dict(enc))).pooler_output.numpy()
        image = model.get_image_features(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).pooler_output.numpy()
    rows = []
    for label, path, q in (("f32 file", files["f32"], Scalar.F32), ("bf16 file", files["bf16"], Scalar.F32),
                           ("bf16 file", files["bf16"], Scalar.BF16), ("bf16 file", files["bf16"], Scalar.E4M3)):  # fmt: skip
        with uform.Model.load_ram(path, quantization=q) as m:
            t = unit(m.text_encode(hf_models.CORPUS, Arena()).embeddings)
            i = unit(m.image_encode_pixels(list(pictures), Arena()).embeddings)
            ref_t, ref_i = unit(text), unit(image)
            nearest = all(np.allclose(r[np.argmax(g @ r.T, axis=1)], r, atol=1e-6) for g, r in ((t, ref_t), (i, ref_i)))
            rows.append({"file": label, "load": q.value, "backend": m.backend, "text min cos": f"{(t * ref_t).sum(1).min():.6f}",
                         "image min cos": f"{(i * ref_i).sum(1).min():.6f}", "nearest own": "yes" if nearest else "NO"})  # fmt: skip
    # token ids and pixels
    from uform.core.safetensors import parse
    from uform.plugins.media.frames import Pixels
    from uform.plugins.media.image import decode
    from uform.plugins.media.files import sources
    from uform.plugins.media.text import read

    c = parse(memoryview(files["bf16"].read_bytes()))
    import json

    cfg = json.loads(c.metadata["uform"])
    held = read(c.metadata, context, cfg["towers"]["text"]["vocab_size"], "towers.text").encode(hf_models.CORPUS)
    want = tok(hf_models.CORPUS, truncation=True, max_length=context)["input_ids"]
    same = sum(list(map(int, a)) == b for a, b in zip(held.ids, want))
    processor = AutoImageProcessor.from_pretrained(directory)
    fit = Pixels.read(cfg["towers"]["image"], "image").fit
    worst = 0.0
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        for w, h in ASPECTS:
            path = photos(Path(tmp), 1, (w, h))[0]
            ours = decode(sources([path.read_bytes()], "bytes")[0], fit)[0].astype(np.float64)
            pv = processor(images=[Image.open(path).convert("RGB")], return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
            theirs = (pv * np.array(processor.image_std) + np.array(processor.image_mean)) * 255
            worst = max(worst, float(np.abs(ours - theirs).max()))
    return rows, {"token ids equal": f"{same}/{len(want)}", "pixel max diff (levels)": round(worst, 2), "processor": type(processor).__name__}


def speed(directory: Path, bf16: Path, n: int, seconds: float, s: int) -> dict[str, Any]:
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    import uform
    from uform import Arena

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = photos(Path(tmp), n, (640, 480))
        model = CLIPModel.from_pretrained(directory).eval()
        processor = AutoImageProcessor.from_pretrained(directory)
        tok = AutoTokenizer.from_pretrained(directory)

        def hf_images(autocast: bool) -> None:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                for i in range(0, n, 32):
                    images = [Image.open(f).convert("RGB") for f in files[i : i + 32]]
                    model.get_image_features(**processor(images=images, return_tensors="pt"))

        def hf_query() -> None:
            with torch.no_grad():
                model.get_text_features(**tok([QUERY], return_tensors="pt"))

        # transformers first, with no uform model open (its ONNX Runtime threads would spin beside torch's)
        f32 = rate(lambda: hf_images(False), n, seconds, runs=1)
        auto = rate(lambda: hf_images(True), n, seconds, runs=1)
        q_hf = median_ms(hf_query, seconds)
        del model
        with uform.Model.load_ram(bf16) as m:
            arena = Arena()
            out["uform"] = f"{m.describe().quantization.value} load, {m.backend} backend: {m.compute}"
            ours = rate(lambda: m.image_encode(files, arena), n, seconds, runs=1)
            q_ours = median_ms(lambda: m.text_encode([QUERY], arena), seconds)
        out["image_encode 640x480 JPEG"] = {"uform items/s": round(ours, 2), "transformers f32 items/s": round(f32, 2),
                                            "transformers bf16 autocast items/s": round(auto, 2),
                                            "vs f32": round(ours / f32, 2), "vs bf16 autocast": round(ours / auto, 2)}  # fmt: skip
        out["text_encode 12-byte query"] = {"uform ms": round(q_ours, 3), "transformers f32 ms": round(q_hf, 3), "speed-up": round(q_hf / q_ours, 2)}
        out["processor"] = type(processor).__name__
    return out


def median_ms(fn: Any, seconds: float) -> float:
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="clip-b32,clip-b16,siglip-b16")
    parser.add_argument("--images", type=int, default=32, help="640x480 JPEGs for the speed run (default 32)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--tiny", action="store_true", help="small geometries (a smoke run)")
    args = parser.parse_args()

    import torch

    from uform.convert import convert
    from uform.core.executor import available_cores

    torch.set_num_threads(available_cores())
    geometries = TINY if args.tiny else GEOMETRIES
    results: dict[str, Any] = {"note": "shared machine (other engineers' jobs ran beside this one): timings are noisy",
                               "threads": available_cores(), "parity": {}, "speed": {}, "conversion": {}}  # fmt: skip
    all_rows: list[dict[str, Any]] = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        family, geometry = geometries[name]
        s = geometry["vision"]["image_size"]
        with tempfile.TemporaryDirectory() as tmp:
            directory = (hf_models.make_clip if family == "clip" else hf_models.make_siglip)(Path(tmp) / name, geometry)
            files = {"f32": Path(tmp) / "f32.safetensors", "bf16": Path(tmp) / "bf16.safetensors"}
            convert(directory, files["f32"], dtype="f32")
            source = directory / "model.safetensors"
            read = min(read_seconds(source) for _ in range(2))
            took = []
            for _ in range(2):
                drop_cache(source)
                t = time.perf_counter()
                convert(directory, files["bf16"])
                took.append(time.perf_counter() - t)
            loaded = min(load_seconds(source) for _ in range(2))
            results["conversion"][name] = {"source MiB": round(source.stat().st_size / 2**20, 1), "read s": round(read, 3),
                                           "safetensors load_file s": round(loaded, 3), "convert (bf16) s": round(min(took), 3),
                                           "ratio": round(min(took) / read, 2), "ratio to load_file": round(min(took) / loaded, 2)}  # fmt: skip
            print(f"{name}: convert {min(took):.2f} s, read {read:.2f} s ({min(took) / read:.2f}x)", flush=True)
            rng = np.random.default_rng(0)
            base = rng.integers(0, 256, (8, 8, 8, 3)).astype(np.float32)
            pictures = np.clip(np.repeat(np.repeat(base, s // 8, 1), s // 8, 2) + rng.normal(0, 30, (8, s, s, 3)), 0, 255).astype(np.uint8)
            rows, extra = parity(family, directory, files, pictures, s)
            for r in rows:
                all_rows.append({"model": name, **r, **extra})
            results["parity"][name] = {"rows": rows, **extra}
            if name == "clip-b16":
                results["speed"][name] = speed(directory, files["bf16"], args.images, args.seconds, s)
                print(results["speed"][name], flush=True)
    print(table(all_rows, ["model", "file", "load", "backend", "text min cos", "image min cos", "nearest own", "token ids equal", "pixel max diff (levels)", "processor"]))
    for name, c in results["conversion"].items():
        print(f"conversion {name}: {c}")
    path = save("models", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
