"""A picture's memory: beside the decoded picture, decoding holds strips, never a full-size copy,
and the strips give the whole picture's pixels bit for bit (docs/media-images.md, "Memory")."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from media import encode_image, pattern
from PIL import Image

from uform.plugins.media import frames
from uform.plugins.media import image as pictures
from uform.plugins.media import files as sources


def png16_rgba(width: int, height: int, every: int = 97) -> bytes:
    """A 16-bit RGBA PNG of varied colour and alpha that compresses to almost nothing (a row
    repeats ``every`` rows)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    x = np.arange(width)
    row = np.stack([x * 16 % 65536, x * 7 % 65536, 65535 - x * 16 % 65536, x * 131 % 65536], -1).astype(">u2").tobytes()
    same = b"\x02" + bytes(len(row))  # filter "Up", no change: the row above again
    packer = zlib.compressobj(1)
    body = b"".join(packer.compress(b"\x00" + row if r % every == 0 else same) for r in range(height)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 16, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


_MEASURE = """
import sys
import time
from uform.plugins.media import image as pictures
from uform.plugins.media import files as sources
def status(key):  # this process's own (getrusage's ru_maxrss would hold the forking parent's RSS)
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
pictures.decode(sources.Source(0, None, data=open(sys.argv[2], "rb").read()), 32)  # warm: lazy imports
data = open(sys.argv[1], "rb").read()
try:
    open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts again from here
except OSError:
    pass
base = status("VmRSS")
began = time.thread_time()
fitted, _, pixels, _ = pictures.decode(sources.Source(0, None, data=data), int(sys.argv[3]))
took = time.thread_time() - began
assert fitted.shape[:2] == (int(sys.argv[3]),) * 2, fitted.shape
print(took, status("VmHWM") - base)
"""


def measure(folder: Path, width: int, height: int, size: int = 224) -> tuple[float, int]:
    """Thread CPU seconds and peak RSS growth, in bytes, of one ``decode`` of a ``width × height``
    16-bit RGBA PNG, in a fresh process."""
    big, small = folder / f"rgba16-{width}x{height}.png", folder / "small.png"
    big.write_bytes(png16_rgba(width, height))
    small.write_bytes(png16_rgba(40, 30))
    run = subprocess.run([sys.executable, "-c", _MEASURE, str(big), str(small), str(size)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    seconds, growth = run.stdout.split()[-2:]
    return float(seconds), int(growth)


def peak_growth(folder: Path, width: int, height: int, size: int = 224) -> int:
    """Peak RSS growth, in bytes, of one ``decode`` of a ``width × height`` 16-bit RGBA PNG, in a fresh process."""
    return measure(folder, width, height, size)[1]


def test_a_large_transparent_16_bit_png_costs_little_beside_its_decoded_pixels(tmp_path: Path) -> None:
    # Pillow holds the decoded 2400×2400 picture as 8-bit RGBA: 23 MB. Compositing the alpha over
    # the whole picture in uint32 cost ten times that (230 MB); strips cost a few MB.
    growth, decoded = peak_growth(tmp_path, 2400, 2400), 4 * 2400 * 2400
    assert growth <= decoded + 12_000_000, f"peak RSS grew {growth / 1e6:.1f} MB decoding a {decoded / 1e6:.0f} MB picture"


def _noise(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 4), dtype=np.uint8)


def _files(h: int, w: int, seed: int) -> dict[str, bytes]:
    """One picture in every mode that is converted (alpha, palette, grayscale, 16 bits, CMYK, tRNS)."""
    nz = _noise(h, w, seed)
    rgb = np.where(np.arange(w)[None, :, None] % 5 < 2, nz[..., :3], pattern(h, w, seed))  # smooth and busy columns
    rgba = Image.fromarray(np.dstack([rgb, nz[..., 3]]), "RGBA")
    wide = (nz[..., 0].astype(np.uint16) * 257 + nz[..., 1]).astype(np.uint16)
    return {
        "RGBA": encode_image(rgba, "PNG"),
        "LA": encode_image(rgba.convert("LA"), "PNG"),
        "P+tRNS": encode_image(Image.fromarray(rgb).quantize(32), "PNG", transparency=3),
        "L": encode_image(Image.fromarray(rgb[..., 1]), "PNG"),
        "L+tRNS": encode_image(Image.fromarray(rgb[..., 1]), "PNG", transparency=int(rgb[0, 0, 1])),
        "RGB+tRNS": encode_image(rgb, "PNG", transparency=tuple(int(v) for v in rgb[0, 0])),
        "I;16+tRNS": encode_image(Image.fromarray(wide), "PNG", transparency=int(wide[0, 0])),
        "16-bit RGBA": png16_rgba(w, h),
        "WebP RGBA": encode_image(rgba, "WEBP", lossless=True),
        "CMYK JPEG": encode_image(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=90),
    }


def _whole(data: bytes, size: int) -> np.ndarray:
    """The rule on the whole decoded picture at once: turned, converted, fitted (the code before strips)."""
    decoded = pictures.open_image(sources.Source(0, None, data=data), size)[0]  # a JPEG at its reduced scale
    return frames.fit(pictures.to_rgb(pictures.orient(decoded)), size)


def _oriented(data: bytes, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    image = Image.open(io.BytesIO(data))
    return encode_image(image, "PNG", exif=exif)


# (height, width, S): several strips; a tall and a wide picture past FULL_RESIZE_AREA (fit_region)
SHAPES = [(37, 53, 16), (211, 173, 32), (400, 150, 32), (60, 2100, 16), (1500, 45, 16), (96, 96, 96)]  # (400, 150): down first
FITS = {  # version 1's rule, and version 2's square resize, bilinear filter and rounding down (frames.Fit)
    "v1": {}, "square-bilinear": {"resize": "square", "interpolation": "bilinear"},
    "crop-bilinear-floor": {"interpolation": "bilinear", "rounding": "floor"},
}  # fmt: skip


@pytest.mark.parametrize("fit", FITS)
@pytest.mark.parametrize(("h", "w", "size"), SHAPES)
def test_strips_give_the_whole_pictures_pixels(monkeypatch: pytest.MonkeyPatch, h: int, w: int, size: int, fit: str) -> None:
    monkeypatch.setattr(pictures, "STRIP_PIXELS", 2999)  # strips of a few rows, one row where rows are long
    how = frames.Fit(size, **FITS[fit])
    for mode, data in _files(h, w, h + w).items():
        got = pictures.decode(sources.Source(0, None, data=data), how)[0]
        np.testing.assert_array_equal(got, _whole(data, how), err_msg=mode)


@pytest.mark.parametrize("fit", ["v1", "square-bilinear"])
@pytest.mark.parametrize("orientation", range(2, 9))
def test_turned_strips_give_the_turned_pictures_pixels(monkeypatch: pytest.MonkeyPatch, orientation: int, fit: str) -> None:
    monkeypatch.setattr(pictures, "STRIP_PIXELS", 1009)
    # 30 wide, 90 tall: upright as stored, a square fit resizes down first; turned a quarter, across first
    stored = Image.fromarray(np.dstack([pattern(90, 30, orientation), _noise(90, 30, orientation)[..., 3]]), "RGBA")
    how = frames.Fit(16, **FITS[fit])
    for data in (_oriented(encode_image(stored, "PNG"), orientation), _oriented(encode_image(stored.convert("RGB"), "PNG"), orientation)):
        got = pictures.decode(sources.Source(0, None, data=data), how)[0]
        np.testing.assert_array_equal(got, _whole(data, how))


def test_pillows_pass_order_is_the_one_the_strips_follow() -> None:
    """Pillow resizes across then down, or down first (:func:`pictures.vertical_first`); the
    strips make the first pass themselves, so they must know which. Checked on random shapes,
    so that a Pillow that chooses otherwise fails here by name."""
    rng = np.random.default_rng(58)
    for filter_ in (Image.Resampling.BICUBIC, Image.Resampling.BILINEAR):
        for _ in range(40):
            w, h = (int(v) for v in rng.integers(8, 400, 2))
            tw, th = (int(v) for v in rng.integers(4, 300, 2))
            if tw == w or th == h:
                continue
            image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            whole = np.asarray(image.resize((tw, th), filter_))
            if pictures.vertical_first(w, h, (tw, th)):
                passes = image.resize((w, th), filter_).resize((tw, th), filter_)
            else:
                passes = image.resize((tw, h), filter_).resize((tw, th), filter_)
            assert np.array_equal(np.asarray(passes), whole), f"{w}x{h} -> {tw}x{th} ({filter_.name}): Pillow chose the other pass order"



def test_a_large_picture_is_let_go_but_a_callers_file_object_stays_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pictures, "TRIM_PIXELS", 1)  # every picture handed back once fitted
    path = tmp_path / "rgba.png"
    path.write_bytes(png16_rgba(300, 200))
    with open(path, "rb") as f:
        fitted = pictures.decode(sources.Source(0, str(path), stream=f), 16)[0]
        assert not f.closed and f.seek(0) == 0
    np.testing.assert_array_equal(fitted, _whole(path.read_bytes(), 16))


if __name__ == "__main__":  # python tests/test_image_memory.py 10000 10000 [S]: the figures of docs/media-images.md
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        w, h, *rest = (int(a) for a in sys.argv[1:])
        seconds, growth = measure(Path(folder), w, h, *rest)
        print(f"{w}x{h} 16-bit RGBA PNG at S = {rest[0] if rest else 224}: peak RSS +{growth / 1e6:.1f} MB, {seconds:.2f} s of thread CPU")
