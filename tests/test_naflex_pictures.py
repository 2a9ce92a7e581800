"""SigLIP 2 NaFlex pictures from files (docs/models-naflex.md, "Memory" and "Pictures"): a large
PNG is read a strip of rows at a time and fitted to its grid as it comes, bit for bit the whole
fit; odd pictures (1x1, 1x5000 strips, an EXIF turn, 16 bits, CMYK, a palette with a
transparent entry) each give a grid and the pixels of the whole decode converted."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from pngfiles import interlaced, png

import uform
from uform.plugins.media import frames, naflex
from uform.plugins.media import image as pictures
from uform.plugins.media import png as pngs
from uform.plugins.media.files import Source

FIT = frames.Fit(256, "naflex", "bilinear", patch=16, max_patches=256)  # the base model's geometry

native = pytest.mark.skipif(pngs.native() is None, reason="the op library is not built here: PNGs are decoded whole")

_MEASURE = """
import sys
from uform.plugins.media import frames
from uform.plugins.media import image as pictures
from uform.plugins.media.files import Source
def status(key):  # this process's own (getrusage's ru_maxrss would hold the forking parent's RSS)
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
fit = frames.Fit(256, "naflex", "bilinear", patch=16, max_patches=256)
pictures.decode(Source(0, None, data=open(sys.argv[2], "rb").read()), fit)  # warm: lazy imports
data = open(sys.argv[1], "rb").read()
try:
    open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts again from here
except OSError:
    pass
base = status("VmRSS")
fitted = pictures.decode(Source(0, None, data=data), fit)[0]
print(fitted.shape[0], fitted.shape[1], status("VmHWM") - base)
"""


def _png(pixels: np.ndarray, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=1, **options)
    return out.getvalue()


def _whole(data: bytes) -> np.ndarray:
    """Pillow's whole decode, turned, converted and fitted in one piece."""
    decoded = pictures.open_image(Source(0, None, data=data), FIT)[0]
    return frames.fit(pictures.to_rgb(pictures.orient(decoded)), FIT)


def _decode(data: bytes) -> np.ndarray:
    return pictures.decode(Source(0, None, data=data), FIT)[0]


@native
def test_a_large_png_is_fitted_to_its_grid_a_strip_at_a_time(tmp_path: Path) -> None:
    """A 3000x2000 RGB PNG: Pillow's whole decode holds 24 MB (4 bytes a pixel); read a strip
    at a time the decode's peak RSS grows by a few MB, and the grid's pixels are the whole fit's."""
    width, height = 3000, 2000
    rows, columns, grew = growth(tmp_path, width, height)
    data = (tmp_path / "big.png").read_bytes()
    assert np.array_equal(_decode(data), _whole(data))
    assert (rows, columns) == tuple(16 * g for g in naflex.grid_for(height, width, 16, 256)) == (208, 304)
    assert grew < width * height, f"peak RSS grew {grew / 1e6:.1f} MB decoding a {width}x{height} PNG (decoded whole: 24 MB)"


def _odd(name: str) -> tuple[bytes, Image.Image]:
    """An odd picture's file, and the picture transformers is given for it (the file's pixels
    made upright; for 16-bit grey, each sample's high byte, the rule uform keeps)."""
    from PIL import ImageOps

    from naflex_models import picture

    def saved(image: Image.Image, kind: str, **options: object) -> bytes:
        out = io.BytesIO()
        image.save(out, kind, **options)
        return out.getvalue()

    p = Image.fromarray(picture(300, 200, 4))
    turn = Image.Exif()
    turn[0x0112] = 6  # turned 90 degrees clockwise to show
    files = {
        "1x1": lambda: saved(Image.fromarray(picture(1, 1, 1)), "PNG"),
        "1x5000": lambda: saved(Image.fromarray(picture(1, 5000, 2)), "PNG"),
        "5000x1": lambda: saved(Image.fromarray(picture(5000, 1, 3)), "PNG"),
        "2x1-jpeg": lambda: saved(Image.fromarray(picture(2, 1, 3)), "JPEG"),
        "exif-turned-jpeg": lambda: saved(p, "JPEG", exif=turn.tobytes(), quality=95),
        "exif-turned-png": lambda: saved(p, "PNG", exif=turn.tobytes()),
        "16-bit-grey-png": lambda: saved(Image.fromarray(np.asarray(p.convert("L")).astype(np.uint16) * 257), "PNG"),
        "16-bit-rgb-png": lambda: png(np.asarray(p).astype(np.uint16) * 257, 2, 16),
        "cmyk-jpeg": lambda: saved(p.convert("CMYK"), "JPEG", quality=95),
        "palette-transparent-png": lambda: saved(p.convert("P", palette=Image.Palette.ADAPTIVE), "PNG", transparency=0),
        "interlaced-png": lambda: interlaced(np.asarray(p), 2, 8),  # Adam7, decoded whole
    }
    data = files[name]()
    with Image.open(io.BytesIO(data)) as opened:
        shown = ImageOps.exif_transpose(opened)
        if shown.mode == "I;16":
            shown = Image.fromarray((np.asarray(shown) >> 8).astype(np.uint8))
        shown.load()
    return data, shown


ODD = ["1x1", "1x5000", "5000x1", "2x1-jpeg", "exif-turned-jpeg", "exif-turned-png", "16-bit-grey-png", "16-bit-rgb-png", "cmyk-jpeg", "palette-transparent-png", "interlaced-png"]


@pytest.fixture(scope="module")
def siglip2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    pytest.importorskip("torch")
    from transformers import Siglip2Model

    from naflex_models import make_siglip2
    from uform.convert import convert

    source = make_siglip2(tmp_path_factory.mktemp("siglip2") / "tiny-siglip2")
    out = tmp_path_factory.mktemp("out") / "naflex.safetensors"
    convert(source, out, dtype="f32")
    return Siglip2Model.from_pretrained(source).eval(), out


@pytest.mark.parametrize("name", ODD)
def test_an_odd_picture_takes_transformers_grid_and_embedding(name: str, siglip2: tuple[Any, Path]) -> None:
    """Each odd picture: its grid is transformers' spatial_shapes for the upright picture, its
    fitted pixels the whole decode's, converted (bit for bit), and its embedding transformers'
    get_image_features of the upright picture (do_convert_rgb) to 0.99999."""
    import torch
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    model, converted = siglip2
    data, shown = _odd(name)
    fitted = _decode(data)
    assert np.array_equal(fitted, _whole(data))
    processor = Siglip2ImageProcessorPil(max_num_patches=256, patch_size=16, do_convert_rgb=True)
    inputs = processor(images=[shown], return_tensors="pt")
    assert naflex.grid_of(fitted, 16) == tuple(int(v) for v in inputs["spatial_shapes"][0])
    with torch.no_grad():
        out = model.get_image_features(**inputs)
    want = getattr(out, "pooler_output", out)[0].numpy().astype(np.float64)
    with uform.Model.load_ram(converted, quantization=uform.Scalar.F32) as m:
        got = np.asarray(m.image_encode([data], uform.Arena()).embeddings, np.float64)[0]
    assert float(got @ want / np.linalg.norm(want)) > 0.99999


_PIXELS = """
import sys
import numpy as np
import uform
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
model = uform.Model.load_ram(sys.argv[1], quantization=uform.Scalar.F32)
big = np.random.default_rng(5).integers(0, 256, (int(sys.argv[3]), int(sys.argv[2]), 3), dtype=np.uint8)
model.image_encode_pixels([big[:30, :40]], uform.Arena())  # warm
try:
    open("/proc/self/clear_refs", "w").write("5")
except OSError:
    pass
base = status("VmRSS")
model.image_encode_pixels([big], uform.Arena())
print(status("VmHWM") - base)
"""


def test_a_large_pixel_buffer_is_fitted_a_strip_at_a_time(siglip2: tuple[Any, Path]) -> None:
    """image_encode_pixels of a 2600x1800 buffer: copied whole into a Pillow picture it grew the
    peak RSS by 4 bytes a pixel and more (a 6000x4000 one +100.7 MB); fitted a strip at a time
    (image.STREAM_PIXELS and up), under 1 byte a pixel, and the embedding is that of the fitted
    grid given as pixels, bit for bit."""
    width, height = 2600, 1800  # 4.7 M pixels: past image.STREAM_PIXELS (4.2 M)
    converted = siglip2[1]
    big = np.random.default_rng(5).integers(0, 256, (height, width, 3), dtype=np.uint8)
    with uform.Model.load_ram(converted, quantization=uform.Scalar.F32) as m:
        got = np.asarray(m.image_encode_pixels([big], uform.Arena()).embeddings)
        want = np.asarray(m.image_encode_pixels([frames.fit(frames.from_array(big), FIT)], uform.Arena()).embeddings)
    np.testing.assert_array_equal(got, want)
    run = subprocess.run([sys.executable, "-c", _PIXELS, str(converted), str(width), str(height)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    grew = int(run.stdout.split()[-1])
    assert grew < width * height, f"peak RSS grew {grew / 1e6:.1f} MB fitting a {width}x{height} buffer"


def growth(folder: Path, width: int, height: int) -> tuple[int, int, int]:
    """The grid's rows and columns in pixels and the peak RSS growth, in bytes, of one NaFlex
    ``decode`` of a smooth ``width × height`` RGB PNG, in a fresh process."""
    rng = np.random.default_rng(11)
    pixels = np.asarray(Image.fromarray(rng.integers(0, 256, (max(2, height // 16), max(2, width // 16), 3), dtype=np.uint8)).resize((width, height)))
    big, small = folder / "big.png", folder / "small.png"
    big.write_bytes(_png(pixels))
    small.write_bytes(_png(pixels[:30, :40]))
    run = subprocess.run([sys.executable, "-c", _MEASURE, str(big), str(small)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows, columns, grew = (int(v) for v in run.stdout.split()[-3:])
    return rows, columns, grew


def jpeg_parity(folder: Path) -> list[tuple[int, int, float, float]]:
    """``(width, height, file, pixels)``: the cosine to transformers' ``get_image_features`` of a
    noisy photo's whole decode (a JPEG at quality 90) of ``image_encode`` of the file (a large
    JPEG decoded at a reduced scale) and of ``image_encode_pixels`` of the same decoded pixels,
    on a random ``Siglip2Model`` (docs/models-naflex.md, "Memory")."""
    import torch
    from transformers import Siglip2Model
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    from naflex_models import make_siglip2, picture
    from uform.convert import convert

    source = make_siglip2(folder / "tiny-siglip2")
    convert(source, folder / "naflex.safetensors", dtype="f32")
    reference = Siglip2Model.from_pretrained(source).eval()
    processor = Siglip2ImageProcessorPil(max_num_patches=256, patch_size=16)
    rng, out = np.random.default_rng(1), []
    with uform.Model.load_ram(folder / "naflex.safetensors", quantization=uform.Scalar.F32) as m:
        for w, h in [(4000, 3000), (6000, 4000), (1200, 900)]:
            noisy = np.clip(picture(w, h, 7).astype(np.int16) + rng.integers(-20, 21, (h, w, 3)), 0, 255).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(noisy).save(buffer, "JPEG", quality=90)
            with Image.open(io.BytesIO(buffer.getvalue())) as opened:
                whole = opened.convert("RGB")
            with torch.no_grad():
                features = reference.get_image_features(**processor(images=[whole], return_tensors="pt"))
            want = getattr(features, "pooler_output", features)[0].numpy().astype(np.float64)
            want /= np.linalg.norm(want)
            got = np.asarray(m.image_encode([buffer.getvalue()], uform.Arena()).embeddings, np.float64)[0]
            pixels = np.asarray(m.image_encode_pixels([np.asarray(whole)], uform.Arena()).embeddings, np.float64)[0]
            out.append((w, h, float(got @ want), float(pixels @ want)))
    return out


if __name__ == "__main__":
    # python tests/test_naflex_pictures.py 6000 4000: a NaFlex decode of a PNG that large;
    # python tests/test_naflex_pictures.py pixels MODEL 6000 4000: image_encode_pixels of a buffer
    # that large through MODEL (a path, or "default"); ... jpeg: JPEGs' parity: the docs' figures
    import tempfile

    if sys.argv[1] == "jpeg":  # python tests/test_naflex_pictures.py jpeg
        with tempfile.TemporaryDirectory() as folder:
            for w, h, file, pixels in jpeg_parity(Path(folder)):
                print(f"{w}x{h} JPEG: image_encode {file:.7f}, image_encode_pixels of its decode {pixels:.7f}")
    elif sys.argv[1] == "pixels":
        path = str(uform.default_checkpoint()) if sys.argv[2] == "default" else sys.argv[2]
        run = subprocess.run([sys.executable, "-c", _PIXELS, path, sys.argv[3], sys.argv[4]], capture_output=True, text=True, check=True)
        print(f"image_encode_pixels of a {sys.argv[3]}x{sys.argv[4]} buffer: peak RSS +{int(run.stdout.split()[-1]) / 1e6:.1f} MB")
    else:
        with tempfile.TemporaryDirectory() as folder:
            w, h = int(sys.argv[1]), int(sys.argv[2])
            rows, columns, grew = growth(Path(folder), w, h)
            print(f"{w}x{h} RGB PNG to {columns}x{rows}: peak RSS +{grew / 1e6:.1f} MB")
