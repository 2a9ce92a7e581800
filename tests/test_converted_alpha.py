"""A converted open_clip's alpha rule (``towers.image.alpha: drop``): open_clip's transform runs
Pillow's ``image.convert("RGB")``, which drops an alpha channel and a palette's or a colour's
transparency and keeps the colour stored under it, where uform's default (``white``, as
transformers' processors) composites it over white. Before the rule a converted open_clip gave
cosine 0.9486 to ``encode_image`` on an RGBA PNG, 0.9646 on LA, 0.99965 on a palette with tRNS.

Each decode path is checked: the streaming PNG reader (the op library's) and Pillow's whole
decode (without the op library, an interlaced PNG, a PNG turned by its EXIF), WebP, palette tRNS,
LA, 16-bit RGBA and gray-alpha, and a grayscale or truecolour tRNS value."""

from __future__ import annotations

import io
import json
import struct
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf_models
import pngfiles
import uform
from uform import Arena, Scalar
from uform.convert import convert
from uform.core import safetensors
from uform.core.errors import CheckpointError
from uform.plugins.media import frames, png
from uform.plugins.media.files import Source
from uform.plugins.media.image import decode

Image = pytest.importorskip("PIL.Image")


def _rgba(height: int, width: int, seed: int) -> np.ndarray:
    """A smooth picture whose alpha runs from 0 to 255 across it, noisy colour under it."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (max(2, height // 6), max(2, width // 6), 4), dtype=np.uint8)
    out = np.array(Image.fromarray(base, "RGBA").resize((width, height), Image.Resampling.BICUBIC))
    out[..., 3] = np.linspace(0, 255, width).astype(np.uint8)[None, :]
    return out


def _files(folder: Path) -> dict[str, Path]:
    """The kinds the rule changes, by name: PNGs and a WebP with transparency, and an opaque palette
    PNG (open_clip's resize takes a palette's nearest pixel)."""
    rgba = _rgba(40, 56, 0)
    wide = rgba.astype(np.int64) * 257 + np.random.default_rng(1).integers(0, 256, rgba.shape)  # 16-bit samples, low bytes noise
    exif = Image.Exif()
    exif[0x0112] = 6
    keyed = Image.fromarray(rgba[..., :3]).quantize(64)
    keyed.info["transparency"] = bytes(range(0, 256, 4))
    turned = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(turned, "PNG", exif=exif)
    webp = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(webp, "WEBP", lossless=True)
    palette_png = io.BytesIO()
    keyed.save(palette_png, "PNG")
    gray = rgba[..., :1].astype(np.int64)
    gray[10:30, 8:40] = 77  # a transparent value over a good part of the picture
    rgb = rgba[..., :3].copy()
    rgb[10:30, 8:40] = (10, 200, 30)
    written = {
        "rgba.png": pngfiles.png(rgba, 6, 8), "la.png": pngfiles.png(rgba[..., [0, 3]], 4, 8),
        "rgba16.png": pngfiles.png(wide, 6, 16), "la16.png": pngfiles.png(wide[..., [0, 3]], 4, 16),
        "palette-trns.png": palette_png.getvalue(), "palette.png": pngfiles.png(np.asarray(keyed)[..., None], 3, 8, palette=bytes(keyed.getpalette()[:192])),
        "rgba-webp.webp": webp.getvalue(),
        "rgba-interlaced.png": pngfiles.interlaced(rgba, 6, 8), "rgba-exif6.png": turned.getvalue(),
        "rgba-strips.png": pngfiles.png(_rgba(400, 300, 2), 6, 8),  # fitted in 2 strips of rows (image.STRIP_PIXELS)
        "gray-trns.png": pngfiles.png(gray, 0, 8, trns=struct.pack(">H", 77)),
        "rgb-trns.png": pngfiles.png(rgb, 2, 8, trns=struct.pack(">3H", 10, 200, 30)),
    }  # fmt: skip
    out = {}
    for name, data in written.items():
        out[name] = folder / name
        out[name].write_bytes(data)
    return out


def _open_clips_pixels(path: Path, size: frames.Fit) -> np.ndarray:
    """What open_clip's eval transform makes of the EXIF-upright picture before ToTensor: its
    Resize and CenterCrop on the picture as decoded, then ``convert("RGB")``."""
    from open_clip.transform import image_transform
    from PIL import ImageOps

    steps = image_transform(int(size), is_train=False).transforms[:-2]
    with Image.open(path) as image, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's warning of a palette's transparency bytes, open_clip's too
        picture = ImageOps.exif_transpose(image)
        for step in steps:
            picture = step(picture)
        return np.asarray(picture)


@pytest.mark.parametrize("streamed", [True, False], ids=["streaming PNG reader", "Pillow's decode"])
def test_drop_gives_open_clips_pixels_on_every_decode_path(tmp_path: Path, streamed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``alpha: drop`` decodes each transparent kind to the pixels open_clip's transform makes
    (every one differs under ``white``), with the op library's PNG reader and without it."""
    pytest.importorskip("open_clip")
    if not streamed:
        monkeypatch.setattr(png, "native", lambda: None)
    elif png.native() is None:
        pytest.skip("no op library: PNGs are decoded whole")
    drop, white = frames.Fit(24, rounding="floor", alpha="drop"), frames.Fit(24, rounding="floor")
    wrong, same = [], []
    for name, path in _files(tmp_path).items():
        want = _open_clips_pixels(path, drop)
        if not np.array_equal(decode(Source(0, str(path)), drop)[0], want):
            wrong.append(name)
        if np.array_equal(decode(Source(0, str(path)), white)[0], want):
            same.append(name)
    assert wrong == []
    assert same == []  # each kind is one the rule changes


@pytest.mark.parametrize("colour, depth", pngfiles.KINDS)
def test_every_colour_type_and_depth_decodes_as_open_clip_sees_it(tmp_path: Path, colour: int, depth: int) -> None:
    """Every file of ``pngfiles.picture`` (tRNS included) under ``alpha: drop``: the streaming
    reader's rows (grayscale, truecolour, alpha ones premultiplied) or Pillow's whole decode (palette, 1-bit)
    give open_clip's pixels, but for 16-bit grayscale, where uform keeps the high byte."""
    pytest.importorskip("open_clip")
    drop = frames.Fit(8, rounding="floor", alpha="drop")
    for name, data in pngfiles.picture(colour, depth, 18, 28, seed=colour * 17 + depth).items():
        layout = png.layout(io.BytesIO(data))
        assert layout is not None and png.streams(layout, "drop") == (colour != 3 and (colour, depth) != (0, 1))
        path = tmp_path / "kind.png"
        path.write_bytes(data)
        got = decode(Source(0, str(path)), drop)[0]
        if colour == 0 and depth == 16:
            with Image.open(path) as image:
                stored = np.asarray(image).astype(np.int64) >> 8
            assert np.array_equal(got, frames.fit(frames.from_array(np.repeat(stored[..., None], 3, axis=2).astype(np.uint8)), drop)), name
        else:
            assert np.array_equal(got, _open_clips_pixels(path, drop)), name


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    pytest.importorskip("open_clip")
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("oc")
    directory, model = hf_models.make_open_clip(tmp / "oc")
    out = tmp / "oc.safetensors"
    convert(directory, out, dtype="f32")
    return model, out


def _open_clips(model: Any, paths: list[Path]) -> np.ndarray:
    """open_clip's ``encode_image`` through its own eval transform, rows made unit."""
    import torch
    from open_clip.transform import image_transform
    from PIL import ImageOps

    transform = image_transform(model.visual.image_size, is_train=False)
    rows = []
    for path in paths:
        with Image.open(path) as image, torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's warning of a palette's transparency bytes
            rows.append(model.encode_image(transform(ImageOps.exif_transpose(image))[None])[0].numpy())
    out = np.stack(rows)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def _cosines(converted: tuple[Any, Path], folder: Path, path: Path | None = None) -> tuple[dict[str, float], float]:
    model, checkpoint = converted
    files = _files(folder)
    want = _open_clips(model, list(files.values()))
    with uform.Model.load_ram(path or checkpoint, quantization=Scalar.F32) as m:
        got = np.asarray(m.image_encode([str(p) for p in files.values()], Arena()).embeddings)
    return dict(zip(files, map(float, (got * want).sum(1)))), float(np.abs(got - want).max())


@pytest.mark.parametrize("streamed", [True, False], ids=["streaming PNG reader", "Pillow's decode"])
def test_a_converted_open_clip_encodes_transparent_pictures_as_open_clip(
    converted: tuple[Any, Path], tmp_path: Path, streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not streamed:
        monkeypatch.setattr(png, "native", lambda: None)
    cosines, _ = _cosines(converted, tmp_path)
    assert {name: c for name, c in cosines.items() if c < 0.99999} == {}


def _rewrite(path: Path, out: Path, alpha: Any) -> Path:
    c = safetensors.parse(memoryview(path.read_bytes()))
    config = json.loads(c.metadata["uform"])
    if alpha is None:
        del config["towers"]["image"]["alpha"]
    else:
        config["towers"]["image"]["alpha"] = alpha
    safetensors.write(out, {n: np.array(c.array(n)) for n in c.entries}, dict(c.metadata) | {"uform": json.dumps(config)})
    return out


def test_the_converter_writes_drop_and_an_unknown_rule_is_refused_by_name(converted: tuple[Any, Path], tmp_path: Path) -> None:
    c = safetensors.parse(memoryview(converted[1].read_bytes()))
    assert json.loads(c.metadata["uform"])["towers"]["image"]["alpha"] == "drop"
    bad = _rewrite(converted[1], tmp_path / "bad.safetensors", "black")
    with pytest.raises(CheckpointError, match=r"config field towers.image.alpha: expected one of 'white', 'drop', got 'black'"):
        uform.Model.load_ram(bad)


def test_the_exported_image_tower_says_its_alpha_rule(converted: tuple[Any, Path], tmp_path: Path) -> None:
    from uform.exporters.towers import export_towers

    export_towers(converted[1], tmp_path / "towers", quantization="f32")
    said = json.loads((tmp_path / "towers" / "image.json").read_text())["preprocessing"]
    assert said == (
        "decode, EXIF orientation, resize shorter side to image_size (bicubic, longer side floor), centre crop (offset int(round((T - S) / 2)), "
        "half to even) in the picture's own mode (Pillow), then 8-bit RGB (alpha dropped, the colour under it kept); uint8 [S, S, 3]"
    )


_MEASURE = """
import sys
from uform.plugins.media import files, frames, image
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
drop = frames.Fit(224, rounding="floor", alpha="drop")
image.decode(files.Source(0, sys.argv[1]), drop)  # warm: lazy imports
open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts again from here
base = status("VmRSS")
image.decode(files.Source(0, sys.argv[1]), drop)
print(status("VmHWM") - base)
"""


def test_an_alpha_png_is_fitted_a_strip_at_a_time_under_drop(tmp_path: Path) -> None:
    """A 2400×2400 RGBA PNG (23 MB as 8-bit RGBA) under ``alpha: drop`` is premultiplied and fitted
    a strip of rows at a time, as under ``white``: resized whole it cost 2 to 3 times the picture."""
    import subprocess

    if png.native() is None or not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs the op library's PNG reader and Linux's clear_refs")
    path = tmp_path / "big.png"
    Image.fromarray(_rgba(2400, 2400, 3), "RGBA").save(path, compress_level=1)
    run = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    growth = int(run.stdout.split()[-1])
    assert growth <= 12_000_000, f"peak RSS grew {growth / 1e6:.1f} MB decoding a 23 MB picture"


def main() -> None:
    """The figures docs/models.md gives (``python tests/test_converted_alpha.py``): each
    transparent kind's cosine to open_clip's ``encode_image`` with the converter's ``alpha: drop``
    and with ``white`` (the rule of files converted before it), on both decode paths."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        directory, model = hf_models.make_open_clip(Path(tmp) / "oc")
        out = Path(tmp) / "oc.safetensors"
        convert(directory, out, dtype="f32")
        white = _rewrite(out, Path(tmp) / "white.safetensors", None)
        for streamed in (True, False):
            if not streamed:
                png.native = lambda: None  # type: ignore[assignment]  # Pillow's decode from here on
            for rule, path in (("drop", out), ("white", white)):
                cosines, most = _cosines((model, out), Path(tmp), path)
                kinds = ", ".join(f"{name} {c:.7f}" for name, c in cosines.items())
                print(f"{'streaming' if streamed else 'Pillow'} alpha {rule}: max abs {most:.3g}; {kinds}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
