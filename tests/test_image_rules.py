"""The image rules docs/media-images.md and docs/checkpoint.md state, checked against the code: the JPEG
reduced-scale threshold, and PNG transparent values (tRNS) at every bit depth."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from media import encode_image, pattern
from PIL import Image

import uform
from ckpt import make_checkpoint
from uform.plugins.media import image as pictures
from uform.plugins.media import files as sources

S = 32  # tiny preset


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> uform.Model:
    return uform.Model.load_ram(make_checkpoint(tmp_path_factory.mktemp("rules") / "tiny-image.safetensors", "tiny", 3, ["image"]))


def decoded(data: bytes) -> np.ndarray:
    return pictures.decode(sources.Source(0, None, data=data), S)[0]


# -- JPEG reduced scale: the largest s of 8, 4, 2 with shorter >= margin * s * S -------------


@pytest.mark.parametrize(
    ("shorter", "scale"),
    [(512, 8), (511, 4), (505, 4), (256, 4), (255, 2), (128, 2), (127, 1)],  # margin 2, S = 32
)
def test_draft_scale_is_the_documented_rule(shorter: int, scale: int) -> None:
    assert pictures.draft_scale(shorter + 15, shorter, S) == scale
    assert pictures.draft_scale(shorter, 4 * shorter, S) == scale


def test_a_jpeg_decodes_at_the_documented_scale(model: uform.Model) -> None:
    # ceil(505 / 8) = 64 = margin × S, but 505 < margin × 8 × S = 512: the rule says 1/4
    data = encode_image(pattern(505, 520), "JPEG", quality=92)
    fitted, _, pixels, reduced = pictures.decode(sources.Source(0, None, data=data), S)
    assert reduced and pixels == 130 * 127  # ceil(520 / 4) × ceil(505 / 4)
    reference = Image.open(io.BytesIO(data))
    reference.draft(None, (520 // 4, 505 // 4))  # libjpeg at 1/4, decoded independently of uform
    expected = np.asarray(reference.convert("RGB"))
    assert expected.shape == (127, 130, 3)
    files = np.array(model.image_encode([data], uform.Arena()).embeddings)
    assert np.array_equal(files, np.array(model.image_encode_pixels([expected], uform.Arena()).embeddings))


# -- PNG transparent values ---------------------------------------------------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(samples: np.ndarray, depth: int, colour_type: int, trns: bytes) -> bytes:
    """A PNG written by hand: ``samples`` ``[h, w]`` (grayscale) or ``[h, w, 3]`` at ``depth`` bits, with a tRNS chunk."""
    h, w = samples.shape[:2]
    rows = []
    for r in range(h):
        if depth == 16:
            row = samples[r].astype(">u2").tobytes()
        elif depth == 8:
            row = samples[r].astype(np.uint8).tobytes()
        else:
            bits = "".join(format(int(v), f"0{depth}b") for v in samples[r].ravel())
            bits += "0" * (-len(bits) % 8)
            row = bytes(int(bits[i : i + 8], 2) for i in range(0, len(bits), 8))
        rows.append(b"\x00" + row)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"tRNS", trns) + _chunk(b"IDAT", zlib.compress(b"".join(rows))) + _chunk(b"IEND", b"")


def _gray(values: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat((values * scale).astype(np.uint8)[..., None], 3, axis=2)


@pytest.mark.parametrize("depth", [2, 4])
def test_low_depth_grayscale_transparent_value_is_white(model: uform.Model, depth: int) -> None:
    top = (1 << depth) - 1
    values = np.arange(40 * 40).reshape(40, 40) % (top + 1)
    data = png(values, depth, 0, struct.pack(">H", 1))
    expected = _gray(values, 255 // top)  # samples scaled to 8 bits: × 85 (2-bit), × 17 (4-bit)
    expected[values == 1] = 255
    assert np.array_equal(pictures.decode(sources.Source(0, None, data=data), 40)[0], expected)
    files = np.array(model.image_encode([data], uform.Arena()).embeddings)
    assert np.array_equal(files, np.array(model.image_encode_pixels([expected], uform.Arena()).embeddings))


def test_one_bit_grayscale_transparent_value_is_white() -> None:
    values = np.arange(32 * 32).reshape(32, 32) % 2
    expected = _gray(values, 255)
    expected[values == 0] = 255
    assert np.array_equal(decoded(png(values, 1, 0, struct.pack(">H", 0))), expected)


def test_sixteen_bit_grayscale_transparent_value_is_white(model: uform.Model) -> None:
    wide = (np.arange(32 * 32).reshape(32, 32) * 61).astype(np.uint16)
    key = int(wide[5, 7])
    wide[::3, ::2] = key
    wide[1, 1] = key + 1  # the same high byte, another value: stays opaque
    data = png(wide, 16, 0, struct.pack(">H", key))
    expected = _gray(wide >> 8, 1)
    expected[wide == key] = 255
    assert np.array_equal(decoded(data), expected)
    assert decoded(data)[1, 1, 0] == key >> 8 != 255
    files = np.array(model.image_encode([data], uform.Arena()).embeddings)
    assert np.array_equal(files, np.array(model.image_encode_pixels([expected], uform.Arena()).embeddings))


def test_truecolour_transparent_colour_is_white(model: uform.Model) -> None:
    rgb = pattern(32, 32)
    key = tuple(int(v) for v in rgb[3, 4])
    rgb[10:20, 10:20] = key
    data = png(rgb, 8, 2, struct.pack(">HHH", *key))
    expected = rgb.copy()
    expected[(rgb == key).all(axis=2)] = 255
    assert (expected == 255).all(axis=2).sum() >= 100
    assert np.array_equal(decoded(data), expected)
    files = np.array(model.image_encode([data], uform.Arena()).embeddings)
    assert np.array_equal(files, np.array(model.image_encode_pixels([expected], uform.Arena()).embeddings))


def test_sixteen_bit_truecolour_matches_the_high_bytes() -> None:
    wide = (pattern(32, 32).astype(np.uint16) << 8) | 0x34
    key = tuple(int(v) for v in wide[3, 4])
    wide[10:20, 10:20] = key
    high = (wide >> 8).astype(np.uint8)
    expected = high.copy()
    expected[(high == np.asarray(key) >> 8).all(axis=2)] = 255
    assert np.array_equal(decoded(png(wide, 16, 2, struct.pack(">HHH", *key))), expected)

