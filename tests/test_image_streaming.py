"""Pictures fitted from their rows in order (docs/media-images.md, "Memory"): a PNG read a strip at a
time (uform/plugins/media/png.py) gives the pixels of Pillow's whole decode, converted by
``image.to_rgb``, for every colour type, bit depth, palette and tRNS; the fit made from rows
(uform/plugins/media/rowfit.py) is ``frames.fit`` bit for bit; damaged files fail naming the
item and what is wrong; pictures that cannot stream are decoded whole, as before."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pngfiles import KINDS, chunk, interlaced, picture, png

from uform.core.errors import InputError
from uform.plugins.media import files as sources
from uform.plugins.media import frames
from uform.plugins.media import image as pictures
from uform.plugins.media import png as pngs
from uform.plugins.media.rowfit import Down, RowFit

native = pytest.mark.skipif(pngs.native() is None, reason="the op library is not built here: PNGs are decoded whole")
FITS = {
    "v1": {}, "square": {"resize": "square"}, "square-bilinear": {"resize": "square", "interpolation": "bilinear"},
    "crop-bilinear-floor": {"interpolation": "bilinear", "rounding": "floor"},
    # NaFlex: the whole picture to its grid of at most 12 patches of 4 (or 8 of 8), no crop
    "naflex": {"resize": "naflex", "interpolation": "bilinear", "patch": 4, "max_patches": 12},
    "naflex-bicubic": {"resize": "naflex", "patch": 8, "max_patches": 8},
}  # fmt: skip


def _whole(data: bytes, size: int) -> np.ndarray:
    """Pillow's whole decode, converted and fitted in one piece."""
    decoded = pictures.open_image(sources.Source(0, None, data=data), size)[0]
    return frames.fit(pictures.to_rgb(pictures.orient(decoded)), size)


def _decode(data: bytes, size: int, path: str | None = None) -> np.ndarray:
    return pictures.decode(sources.Source(0, path, data=data), size)[0]


def _rows(data: bytes, strip: int = 3) -> np.ndarray:
    stream = io.BytesIO(data)
    found = pngs.layout(stream)
    assert found is not None
    return np.concatenate([pngs.to_rgb(found, raw) for _, raw in pngs.strips(stream, found, strip)])


def test_pillows_pass_down_is_made_bit_for_bit() -> None:
    """Down's weights and sums against Pillow's own resize down, boxes and both filters."""
    rng = np.random.default_rng(58)
    for case in range(400):
        h, w, out = int(rng.integers(1, 200)), int(rng.integers(1, 4)), int(rng.integers(1, 200))
        kind = ("bicubic", "bilinear")[case % 2]
        y0, y1 = (0.0, float(h)) if case % 3 else (float(rng.uniform(0, h / 2)), float(rng.uniform(h / 2 + 0.01, h)))
        rows = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        resample = Image.Resampling.BICUBIC if kind == "bicubic" else Image.Resampling.BILINEAR
        whole = np.asarray(Image.fromarray(rows).resize((w, out), resample, box=(0, y0, w, y1)))
        first, last = sorted(int(v) for v in rng.integers(0, out + 1, 2))
        last = max(last, first + 1) if first < out else out
        first = min(first, last - 1)
        down = Down(h, y0, y1, out, kind, first, last)
        made = [down.feed(y, rows[y : y + 5]) for y in range(down.rows[0], down.rows[1], 5)]
        np.testing.assert_array_equal(np.concatenate(made), whole[first:last], err_msg=f"{h} rows -> {out}, box {y0}:{y1}, {kind}")


# (height, width, S): across first; down first (Pillow's order for tall pictures); both past
# FULL_RESIZE_AREA (frames.fit_region); nothing to resize; one axis only
SHAPES = [(211, 173, 32), (400, 150, 32), (1500, 45, 16), (60, 2100, 16), (32, 32, 32), (32, 90, 32), (1, 1, 8), (3, 500, 8)]


@pytest.mark.parametrize("fit", FITS)
@pytest.mark.parametrize(("h", "w", "size"), SHAPES)
def test_the_fit_made_from_rows_is_frames_fit(h: int, w: int, size: int, fit: str) -> None:
    rng = np.random.default_rng(h * w)
    how = frames.Fit(size, **FITS[fit])
    for picture_ in (rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (np.add.outer(np.arange(h), 3 * np.arange(w)) % 256).astype(np.uint8)[..., None].repeat(3, 2)):
        rows = RowFit(w, h, how)
        first, last = rows.rows
        assert 0 <= first < last <= h
        for y in range(first, last, 7):
            rows.feed(y, picture_[y : min(last, y + 7)])
        np.testing.assert_array_equal(rows.result(), frames.fit(Image.fromarray(picture_), how))


def test_random_shapes_fit_from_rows_as_whole() -> None:
    rng = np.random.default_rng(7)
    for case in range(60):
        w, h = (int(v) for v in rng.integers(1, 300, 2))
        if case % 3 == 0:  # tall and thin: down first, or past FULL_RESIZE_AREA
            w, h = int(rng.integers(1, 40)), int(rng.integers(200, 1500))
        how = frames.Fit(int(rng.choice([8, 16, 33])), **list(FITS.values())[case % len(FITS)])
        picture_ = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        rows = RowFit(w, h, how)
        step = int(rng.integers(1, 30))
        for y in range(rows.rows[0], rows.rows[1], step):
            rows.feed(y, picture_[y : min(rows.rows[1], y + step)])
        np.testing.assert_array_equal(rows.result(), frames.fit(Image.fromarray(picture_), how), err_msg=f"{w}x{h} {how!r}")


@native
@pytest.mark.parametrize(("colour", "depth"), KINDS)
def test_streamed_rows_are_pillows_decode_converted(colour: int, depth: int) -> None:
    """Every colour type and bit depth, palettes (short ones too) and tRNS, odd sizes, every
    filter: the rows are to_rgb of Pillow's decode, and the fitted pixels the whole path's."""
    for h, w in [(1, 1), (7, 5), (13, 37), (29, 3)]:
        for name, data in picture(colour, depth, h, w, h + w + colour).items():
            whole = np.asarray(pictures.to_rgb(pictures.open_image(sources.Source(0, None, data=data), 8)[0]))
            np.testing.assert_array_equal(_rows(data), whole, err_msg=f"{colour}/{depth} {name} {w}x{h}")
            for fit in ("v1", "square-bilinear"):
                how = frames.Fit(4, **FITS[fit])
                np.testing.assert_array_equal(_decode(data, how), _whole(data, how), err_msg=f"{colour}/{depth} {name} {w}x{h} {fit}")


@native
@pytest.mark.parametrize(("h", "w", "size"), SHAPES)
def test_streamed_pngs_fit_as_whole_ones(h: int, w: int, size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pictures, "STRIP_PIXELS", 777)
    for colour, depth in [(6, 16), (3, 4), (0, 16), (2, 8)]:
        for name, data in picture(colour, depth, h, w, 5).items():
            for fit in FITS:
                how = frames.Fit(size, **FITS[fit])
                np.testing.assert_array_equal(_decode(data, how), _whole(data, how), err_msg=f"{colour}/{depth} {name} {fit}")


def _exif(orientation: int) -> bytes:
    tags = Image.Exif()
    tags[0x0112] = orientation
    return tags.tobytes()[6:] if tags.tobytes().startswith(b"Exif") else tags.tobytes()


def _animated(rgba: np.ndarray) -> bytes:
    out = io.BytesIO()
    first, second = Image.fromarray(rgba, "RGBA"), Image.fromarray(255 - rgba, "RGBA")
    first.save(out, "PNG", save_all=True, append_images=[second])
    return out.getvalue()


@native
def test_pngs_that_cannot_stream_are_decoded_whole() -> None:
    """Adam7, animated, an EXIF turn (eXIf chunk), an XMP text or rows too long: Pillow's whole decode, the same pixels."""
    rng = np.random.default_rng(3)
    samples = rng.integers(0, 256, (40, 23, 4))
    cases = {
        "interlaced": interlaced(samples, 6, 8),
        "eXIf 6": png(samples, 6, 8, extra=[chunk(b"eXIf", _exif(6))]),
        "XMP": png(samples, 6, 8, extra=[chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0<x tiff:Orientation=\"3\"/>")]),
        "animated": _animated(samples.astype(np.uint8)),
    }
    for name, data in cases.items():
        assert pngs.layout(io.BytesIO(data)) is None, name
        np.testing.assert_array_equal(_decode(data, 16), _whole(data, 16), err_msg=name)
    assert not np.array_equal(_decode(cases["eXIf 6"], 16), _decode(png(samples, 6, 8), 16))  # turned
    plain = png(samples, 6, 8)
    assert pngs.layout(io.BytesIO(plain)) is not None
    with pytest.MonkeyPatch.context() as patch:  # rows longer than MAX_ROW_BYTES (23 pixels of 4 bytes: 92)
        patch.setattr(pngs, "MAX_ROW_BYTES", 91)
        assert pngs.layout(io.BytesIO(plain)) is None
        np.testing.assert_array_equal(_decode(plain, 16), _whole(plain, 16))
    upright = png(samples, 6, 8, extra=[chunk(b"eXIf", _exif(1))])
    assert pngs.layout(io.BytesIO(upright)) is not None
    np.testing.assert_array_equal(_decode(upright, 16), _whole(upright, 16))


def test_without_the_op_library_pngs_are_decoded_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pngs, "native", lambda: None)
    data = picture(6, 16, 50, 31, 1)["plain"]
    np.testing.assert_array_equal(_decode(data, 16), _whole(data, 16))


def _damaged() -> dict[str, tuple[bytes, str]]:
    samples = np.random.default_rng(9).integers(0, 256, (30, 20, 3))
    good = png(samples, 2, 8, pieces=2)
    rows = b"".join(b"\x00" + bytes(r) for r in samples.astype(np.uint8).reshape(30, -1).tolist())
    start = good.index(b"IDAT") - 4
    bad_crc = bytearray(good)
    bad_crc[start + 12] ^= 0xFF  # the first IDAT's first data byte
    ihdr = bytearray(good)
    ihdr[20] ^= 1  # the IHDR's height changes, its CRC does not
    return {
        "cut inside IDAT": (good[: start + 40], "the image data ends after row"),
        "IDAT CRC": (bytes(bad_crc), "chunk IDAT at byte 33: CRC mismatch"),
        "IHDR CRC": (bytes(ihdr), "chunk IHDR at byte 8: CRC mismatch"),
        "short IDAT": (png(samples, 2, 8, data=zlib.compress(rows[: len(rows) // 2])), "the image data ends after row 15 of 30"),
        "garbled data": (png(samples, 2, 8, data=b"\x78\x9c" + bytes(range(7, 250))), "the image data is corrupt near row 0"),
        "filter type 7": (png(samples, 2, 8, data=zlib.compress(rows[:61] + b"\x07" + rows[62:])), "row 1 has filter type 7"),
        "no image data": (good[:start], "before any image data (IDAT)"),
        "garbled chunk": (good[:start] + b"\x00\x00\x00\x05ID\x01T" + good[start + 8 :], "garbled chunk at byte 33"),
    }


@native
@pytest.mark.parametrize("case", list(_damaged()))
def test_a_damaged_png_fails_naming_the_item_and_the_damage(case: str, tmp_path: Path) -> None:
    data, expected = _damaged()[case]
    path = tmp_path / "broken.png"
    path.write_bytes(data)
    with pytest.raises(InputError) as caught:
        pictures.decode(sources.Source(3, str(path)), 16)
    message = str(caught.value)
    assert message.startswith(f"item 3 ({path}): cannot decode the image: ") and expected in message, message
    assert "Traceback" not in message


@native
def test_the_op_librarys_unfilter_inverts_every_filter() -> None:
    """Rows filtered by a plain-Python encoder with each filter, at each bytes-a-pixel, unfiltered natively."""
    from pngfiles import filter_rows

    rng = np.random.default_rng(11)
    for bpp in (1, 2, 3, 4, 6, 8):
        rows = rng.integers(0, 256, (9, bpp * 7 + 1), dtype=np.uint8)
        kinds = [0, 1, 2, 3, 4, 4, 3, 2, 1]
        filtered = np.frombuffer(filter_rows(rows, bpp, kinds), np.uint8)
        prior, out = np.zeros(rows.shape[1], np.uint8), np.empty_like(rows)
        assert pngs.native().unfilter(filtered.ctypes.data, 9, rows.shape[1], bpp, prior.ctypes.data, out.ctypes.data) == -1  # type: ignore[union-attr]
        np.testing.assert_array_equal(out, rows, err_msg=f"bpp {bpp}")
        np.testing.assert_array_equal(prior, rows[-1])


@native
def test_a_large_png_is_never_held_whole(tmp_path: Path) -> None:
    """RSS in a fresh process: a 2400×2400 16-bit RGBA PNG (Pillow would hold 23 MB) costs a
    few MB; a tall one fitted down first (Pillow's order) too."""
    from test_image_memory import peak_growth

    for width, height in ((2400, 2400), (400, 9000)):
        growth = peak_growth(tmp_path, width, height)
        assert growth < 8_000_000, f"{width}x{height}: peak RSS grew {growth / 1e6:.1f} MB (the picture is {4 * width * height / 1e6:.0f} MB)"


def test_sizes_past_the_limit_are_refused_before_decoding() -> None:
    header = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0))
    data = header + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    with pytest.raises(InputError, match="over the limit of 100000000"):
        _decode(data, 16)


@native
def test_decoding_a_png_does_not_load_the_op_library_for_its_kernels() -> None:
    """The PNG entries are opened directly: ``library()`` (which asks Linux for the AMX tile
    state) is not called by decoding a picture."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from pngfiles import picture\n"
        "from uform.plugins.media import files, image, png\n"
        "from uform.plugins.oplib.library import library\n"
        "image.decode(files.Source(0, None, data=picture(6, 8, 20, 30, 1)['plain']), 8)\n"
        "assert png.native() is not None and library.cache_info().currsize == 0, library.cache_info()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=120)
    assert run.returncode == 0, run.stderr
