"""A converted CLIP's ``image_encode`` of files of every kind against transformers' own image
processor (``AutoImageProcessor``) and ``get_image_features`` on the same decoded pixels (Pillow's
decode, made upright by its EXIF orientation): transparency (RGBA, LA, a palette with and without
tRNS), grayscale, 1×1 and 3×2 pictures, a 50:1 strip, a 3000×2000 picture and an EXIF-rotated JPEG.
A 16-bit grayscale PNG is the one kind that differs: Pillow's ``convert("RGB")``, which the processor
runs, clips its 16-bit values at 255, where uform keeps each sample's high byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf_models
import uform
from uform import Arena, Scalar
from uform.convert import convert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")


def _photo(rng: np.random.Generator, height: int, width: int, channels: int = 3) -> Any:
    base = rng.integers(0, 256, (max(2, height // 8), max(2, width // 8), channels), dtype=np.uint8)
    return Image.fromarray(base if channels > 1 else base[..., 0]).resize((width, height), Image.Resampling.BICUBIC)


def _pictures(folder: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    rgba = np.array(_photo(rng, 60, 80, 4))
    rgba[..., 3] = np.linspace(0, 255, 80, dtype=np.uint8)[None, :]
    palette = _photo(rng, 60, 80).quantize(64)
    keyed = _photo(rng, 60, 80).quantize(64)
    keyed.info["transparency"] = 0
    kinds = {
        "rgb": _photo(rng, 60, 80), "rgba": Image.fromarray(rgba, "RGBA"), "la": Image.fromarray(rgba[..., [0, 3]], "LA"),
        "gray": _photo(rng, 60, 80).convert("L"), "palette": palette, "palette-trns": keyed,
        "1x1": Image.fromarray(np.array([[[200, 30, 90]]], np.uint8)), "3x2": _photo(rng, 2, 3), "strip": _photo(rng, 40, 2000),
        "large": _photo(rng, 2000, 3000),
    }  # fmt: skip
    out = {}
    for name, image in kinds.items():
        out[name] = folder / f"{name}.png"
        image.save(out[name])
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees clockwise
    out["exif-jpeg"] = folder / "exif.jpg"
    _photo(rng, 60, 80).save(out["exif-jpeg"], exif=exif, quality=95)
    return out


def _theirs(directory: Path, paths: list[Path]) -> np.ndarray:
    model = transformers.CLIPModel.from_pretrained(directory).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(directory)
    rows = []
    for path in paths:
        with Image.open(path) as image:
            upright = ImageOps.exif_transpose(image)
            with torch.no_grad():
                out = model.get_image_features(**processor(images=upright, return_tensors="pt"))
        row = np.asarray(getattr(out, "pooler_output", out))[0]
        rows.append(row / np.linalg.norm(row))
    return np.stack(rows)


def test_files_of_every_kind_equal_transformers_on_the_same_pixels(tmp_path: Path) -> None:
    directory = hf_models.make_clip(tmp_path / "clip")
    convert(directory, tmp_path / "clip.safetensors", dtype="f32")
    pictures = _pictures(tmp_path)
    want = _theirs(directory, list(pictures.values()))
    with uform.Model.load_ram(tmp_path / "clip.safetensors", quantization=Scalar.F32) as m:
        got = np.asarray(m.image_encode([str(p) for p in pictures.values()], Arena()).embeddings)
    cos = (got * want).sum(1)
    assert [name for name, c in zip(pictures, cos) if c < 0.99999] == []
