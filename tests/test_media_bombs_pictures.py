"""Hostile pictures: JPEG segments and fill bytes, a progressive JPEG's fill between scans,
WebP's cost, PNG chunks besides the image data, each refused or read in bounded memory, by
name (docs/media-images.md). Recordings: tests/test_media_bombs.py; clips: tests/test_media_bombs_video.py."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.bomb_files import segment
from uform.core.errors import InputError
from uform.plugins.media import files as sources


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(out, "JPEG")
    return out.getvalue()


def picture(item: Any) -> np.ndarray:
    from uform.plugins.media import image as pictures

    return pictures.decode(sources.sources([item], "images")[0], 32)[0]


@pytest.mark.parametrize(
    "insert, reason",
    [
        # 257 APP3 segments of 65533 bytes: 16.8 MB that Pillow's applist held (5,000 of them: +316 MB)
        (lambda: segment(0xE3, 65533) * 257, r"its JPEG metadata \(APPn and COM segments before the picture\) holds over 16777216 bytes, the limit of uform.plugins.media.jpeg.MAX_METADATA_BYTES"),
        (lambda: segment(0xFE, 65533) * 257, r"holds over 16777216 bytes"),  # COM too
        # 10,001 empty APP3 segments, 40 KB (1,000,000 of them: +132 MB, 7 s)
        (lambda: segment(0xE3, 0) * 10_001, r"it has over 10000 JPEG segments before the picture, the limit of uform.plugins.media.jpeg.MAX_SEGMENTS"),
        # 70,000 fill bytes, stepped through a byte a read (10 MB of them: 22.6 s)
        (lambda: b"\xff" * 70_000, r"it has over 65536 stray bytes \(fill or junk\) between its JPEG segments, the limit of uform.plugins.media.jpeg.MAX_STRAY_BYTES"),
        (lambda: segment(0xFE, 2) + b"\x01" * 70_000, r"over 65536 stray bytes"),  # junk after a segment
    ],
)
def test_a_jpeg_s_segments_before_the_picture_are_bounded(jpeg: bytes, insert: Any, reason: str, tmp_path: Path) -> None:
    data = jpeg[:2] + insert() + jpeg[2:]
    path = tmp_path / "bomb.jpg"
    path.write_bytes(data)
    for item in (data, str(path), io.BytesIO(data)):
        with pytest.raises(InputError, match=r"^item 0( \(.*\))?: .*" + reason):
            picture(item)


def test_a_jpeg_within_the_limits_reads_as_pillow_reads_it(jpeg: bytes) -> None:
    plain = picture(jpeg)
    within = segment(0xE3, 65533) * 250 + segment(0xE3, 0) * 9_000 + b"\xff" * 60_000 + segment(0xFE, 3) + b"\x01" * 5_000
    np.testing.assert_array_equal(picture(jpeg[:2] + within + jpeg[2:]), plain)


def test_a_progressive_jpeg_s_fill_between_its_scans_is_bounded() -> None:
    # measured: libjpeg passes fill bytes between a progressive JPEG's scans as Pillow feeds it,
    # in time that grows with their square: 10 MB took 4.7 s and +21 MB, 20 MB 15 s and +40 MB
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(out, "JPEG", progressive=True)
    plain = out.getvalue()
    second = plain.index(b"\xff\xda", plain.index(b"\xff\xda") + 2)  # the second scan's SOS
    fill = lambda n: plain[:second] + b"\xff" * n + plain[second:]  # noqa: E731
    with pytest.raises(InputError, match=r"^item 0: it has over 65536 stray bytes \(fill or junk\) between its JPEG segments, the limit of uform.plugins.media.jpeg.MAX_STRAY_BYTES$"):
        picture(fill(70_000))
    np.testing.assert_array_equal(picture(fill(60_000)), picture(plain))
    np.testing.assert_array_equal(picture(plain + b"\xff" * 200_000), picture(plain))  # padding after EOI: not read


def test_a_webp_is_held_to_a_quarter_of_the_pixels_it_costs_four_times_as_much(monkeypatch: pytest.MonkeyPatch) -> None:
    # measured: Pillow decodes a WebP at 15.3 bytes a pixel (a 9000x9000 lossless WebP of 3 KB:
    # +1238 MB of peak RSS, where MAX_PIXELS was to hold a picture to 400 MB)
    from PIL import Image

    from uform.plugins.media import image as pictures

    def webp(width: int, height: int, **kw: Any) -> bytes:
        out = io.BytesIO()
        Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(out, "WEBP", **kw)
        return out.getvalue()

    monkeypatch.setattr(pictures, "MAX_PIXELS", 4 * 64 * 64)
    assert picture(webp(64, 64, lossless=True)).shape == (32, 32, 3)
    for data in (webp(65, 64, lossless=True), webp(64, 65, quality=50)):
        with pytest.raises(InputError, match=r"^item 0: the WebP is 6\dx6\d = 4160 pixels, over the limit of 4096 for WebP \(uform.plugins.media.image.MAX_PIXELS // 4: Pillow's WebP decoder holds 16 bytes a pixel\)$"):
            picture(data)
    with pytest.raises(InputError, match=r"^item 0: the image is 200x100 = 20000 pixels, over the limit of 16384"):
        picture(webp(200, 100))


@pytest.mark.parametrize("reader", ["op library", "pillow"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_png_s_chunks_besides_its_image_data_are_bounded(where: str, reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # measured: 300,000 tEXt chunks (4.5 MB) took 2.7 s of uform's chunk walk before the image data,
    # 2.4 s after it; without the op library Pillow walked them, 300,000 tEXt chunks in 1.4-1.6 s,
    # 300,000 unknown ones in 2.5 s and +41 MB of peak RSS
    import struct
    import zlib

    from PIL import Image

    from uform.plugins.media import png

    if reader == "pillow":
        monkeypatch.setattr(png, "native", lambda: None)
    elif png.native() is None:
        pytest.skip("without the op library every PNG is Pillow's to read")
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (8, 8, 3), np.uint8)).save(out, "PNG")
    plain = out.getvalue()
    text = struct.pack(">I", 3) + b"tEXt" + b"k\x00v" + struct.pack(">I", zlib.crc32(b"tEXtk\x00v"))
    at = plain.index(b"IDAT") - 4 if where == "before" else plain.index(b"IEND") - 4
    np.testing.assert_array_equal(picture(plain[:at] + text * 9_990 + plain[at:]), picture(plain))
    with pytest.raises(InputError, match=r"^item 0: cannot decode the image: over 10000 chunks besides the image data \(uform.plugins.media.png.MAX_CHUNKS\)$"):
        picture(plain[:at] + text * 10_001 + plain[at:])
