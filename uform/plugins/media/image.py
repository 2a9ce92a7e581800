"""Pictures to pixels on the host: JPEG, PNG and WebP files decoded, oriented, made 8-bit RGB
and fitted to the tower's square; ``[h, w, 3]`` uint8 buffers checked.

The rules are docs/media.md's ("Images"); the resize and crop is :func:`uform.plugins.media.frames.fit`.
Files are recognised by their content, never by their name. The image plugin
(:mod:`uform.plugins.image`) maps :func:`decode` over the executor's threads.

Memory: beside the decoded picture, :func:`decode` holds no full-size copy of it. A picture
that must be turned or converted (alpha, 16 bits, palette, grayscale, CMYK) is turned and
converted a strip of rows at a time (``STRIP_PIXELS``), each strip going straight through
the horizontal pass of the resize (:func:`fit_strips`), which is bit for bit the whole
picture's: Pillow's bicubic resize is a horizontal pass, row by row, then a vertical one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from uform.core.errors import InputError, check_not_released

from . import frames
from .files import Source

if TYPE_CHECKING:
    from PIL import Image

MAX_PIXELS = 100_000_000  # width × height above which a file is refused as a decompression bomb
JPEG_DRAFT_MARGIN = 2  # decode JPEGs at 1/s (s = 8, 4, 2: the largest with shorter ≥ margin × s × S); 0: never
TRIM_PIXELS = 1 << 24  # a decoded picture this large is handed back to the system once fitted (_give_back)
STRIP_PIXELS = 1 << 16  # pixels a strip of rows holds while it is turned, converted and resized across
FORMATS = ("JPEG", "PNG", "WEBP")
_ORIENTATION = 0x0112


def sniff(head: bytes) -> str | None:
    """The format of an image by its first bytes, or None."""
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return None


def describe(head: bytes) -> str:
    """What unsupported content looks like, for the error message."""
    known = {b"GIF8": "a GIF", b"BM": "a BMP", b"II*\x00": "a TIFF", b"MM\x00*": "a TIFF", b"\x1aE\xdf\xa3": "a WebM/Matroska file"}
    for magic, name in known.items():
        if head.startswith(magic):
            return name
    if head[4:8] == b"ftyp":
        return "an MP4/MOV file"
    return f"unrecognised content (first bytes {head[:8].hex(' ')})"


_PNG_DEPTH = "uform.png_bit_depth"  # image.info key: the bit depth the PNG header states


def png_bit_depth(head: bytes) -> int:
    """The sample bit depth (1, 2, 4, 8 or 16) an IHDR chunk at the start of a PNG states; 8 if absent."""
    return head[24] if len(head) > 25 and head[12:16] == b"IHDR" else 8


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB: 16-bit samples cut to their high byte, alpha composited over white, palette,
    grayscale and CMYK converted (CMYK: ``round((255 − c)(255 − k) / 255)``, Pillow's rule).

    A PNG's transparent value (tRNS) is alpha 0 where a pixel equals it, so it becomes white
    (``c' = (c·0 + 255·255 + 127) // 255 = 255``), alpha 255 elsewhere: for grayscale at any
    depth it is matched against the stored sample (Pillow scales 2- and 4-bit samples to 8
    bits but not the value, and drops it for 16-bit grayscale, so uform matches itself), for
    8-bit truecolour against ``(r, g, b)``; for 16-bit truecolour Pillow keeps only the high
    bytes, so the colour's high bytes are matched against them.
    """
    mode, depth = image.mode, image.info.get(_PNG_DEPTH, 8)
    key = image.info.get("transparency")
    if mode.startswith("I"):  # 16-bit (I;16*) or 32-bit integer grayscale
        wide = np.asarray(image).astype(np.int64)
        gray = (np.clip(wide, 0, 65535) >> 8).astype(np.uint8)
        rgb = np.repeat(gray[..., None], 3, axis=2)
        if isinstance(key, int):
            rgb[wide == key] = 255
        return frames.from_array(rgb)
    if mode == "L" and isinstance(key, int) and depth < 8:
        stored = np.asarray(image)
        rgb = np.repeat(stored[..., None], 3, axis=2)
        rgb[stored == key * 255 // ((1 << depth) - 1)] = 255  # the 1-, 2- or 4-bit value as Pillow scales samples
        return frames.from_array(rgb)
    if mode == "RGB" and isinstance(key, tuple) and len(key) == 3:
        rgb = np.array(image)
        colour = np.asarray(key, np.int64) >> (8 if depth == 16 else 0)
        rgb[(rgb == colour).all(axis=2)] = 255
        return frames.from_array(rgb)
    if mode == "RGB":
        return image
    if "A" in mode or "a" in mode or "transparency" in image.info:
        rgba = np.asarray(image.convert("RGBA"))
        alpha = rgba[..., 3:].astype(np.uint16)  # c·a + 255·(255 − a) + 127 ≤ 65152: 16 bits hold it
        rgb = rgba[..., :3].astype(np.uint16)
        rgb *= alpha
        rgb += 255 * (255 - alpha) + 127
        np.floor_divide(rgb, np.uint16(255), out=rgb)
        return frames.from_array(rgb.astype(np.uint8))
    return image.convert("RGB")


def orientation(image: Image.Image) -> Image.Transpose | None:
    """The turn that makes the picture upright as its EXIF orientation (2-8) says; None for 1,
    a missing or an unreadable tag."""
    from PIL import Image

    try:
        value = image.getexif().get(_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - broken EXIF: show the pixels as stored
        return None
    return {
        2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_90,
    }.get(value)  # fmt: skip


def orient(image: Image.Image) -> Image.Image:
    """The picture turned upright as its EXIF orientation (1-8) says; an unreadable tag is ignored."""
    method = orientation(image)
    return image if method is None else image.transpose(method)


def _swaps() -> tuple[Image.Transpose, ...]:
    from PIL import Image

    return (Image.Transpose.TRANSPOSE, Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_270, Image.Transpose.TRANSVERSE)


def upright_size(image: Image.Image, method: Image.Transpose | None) -> tuple[int, int]:
    """``(width, height)`` of the picture once turned by ``method``."""
    return image.size[::-1] if method in _swaps() else image.size


def upright_box(image: Image.Image, method: Image.Transpose | None, box: tuple[int, int, int, int]) -> Image.Image:
    """The ``(x0, y0, x1, y1)`` box of the picture turned by ``method``, cut from the stored
    picture (the box it came from) and turned alone."""
    from PIL import Image

    T = Image.Transpose
    w, h = image.size
    x0, y0, x1, y1 = box
    stored = {
        None: box, T.FLIP_LEFT_RIGHT: (w - x1, y0, w - x0, y1), T.FLIP_TOP_BOTTOM: (x0, h - y1, x1, h - y0),
        T.ROTATE_180: (w - x1, h - y1, w - x0, h - y0), T.TRANSPOSE: (y0, x0, y1, x1),
        T.ROTATE_90: (w - y1, x0, w - y0, x1), T.ROTATE_270: (y0, h - x1, y1, h - x0),
        T.TRANSVERSE: (w - y1, h - x1, w - y0, h - x0),
    }[method]  # fmt: skip
    part = image.crop(stored)
    return part if method is None else part.transpose(method)


def vertical_first(width: int, height: int, target: tuple[int, int]) -> bool:
    """Whether Pillow's resize of ``width × height`` to ``target`` (both axes resized) makes its
    vertical pass first: when it shrinks the height by more than twice what it takes off the
    width, ``h − h' > 2 (w − w')`` (Pillow 13's choice, read from its results: exact on 1,500
    random shapes with both filters; ``tests/test_image_memory.py`` checks it)."""
    tw, th = target
    return th < height and height - th > 2 * (width - tw)


def fit_strips(width: int, height: int, part: Callable[[tuple[int, int, int, int]], Image.Image], size: int) -> np.ndarray:
    """:func:`uform.plugins.media.frames.fit` of a ``width × height`` RGB picture given in parts.

    ``part(box)`` gives the ``(x0, y0, x1, y1)`` box of the picture as 8-bit RGB; it is asked
    for strips of ``STRIP_PIXELS`` or so. Pillow's resize is two passes, each rounded to 8 bits:
    across (each row alone) then down (each column alone), or down first where it chooses so
    (:func:`vertical_first`). The first pass runs here on strips (rows across, or columns
    down), each with the whole resize's box, into a picture of its result's size; the second
    is Pillow's on that picture, then the crop. So this is ``fit`` bit for bit, the region rule
    of ``frames.fit_region`` and a :class:`~uform.plugins.media.frames.Fit`'s square resize,
    bilinear filter and rounding included, while no full-size picture but the decoded one is
    ever held: beside it, the first pass's result (``S × h`` or ``w × S``-ish pixels, or ``S ×``
    the region's rows) and a strip.
    """
    from PIL import Image

    how = size if isinstance(size, frames.Fit) else frames.Fit(size)
    size = int(size)
    bicubic = Image.Resampling.BILINEAR if how.interpolation == "bilinear" else Image.Resampling.BICUBIC
    tw, th = (size, size) if how.resize == "square" else frames.resized_size(width, height, size, how.rounding)
    if tw * th > frames.FULL_RESIZE_AREA * size * size:  # frames.fit_region: two calls, across then down, to the float
        left, top = (tw - size) // 2, (th - size) // 2
        sx, sy = width / tw, height / th
        x0, x1 = (0.0, float(width)) if tw == size else (left * sx, (left + size) * sx)
        y0, y1 = (0.0, float(height)) if th == size else (top * sy, (top + size) * sy)
        reach = 2 * max(sy, 1.0) + 1
        r0, r1 = max(0, math.floor(y0 - reach)), min(height, math.ceil(y1 + reach))
        across = _across(width, r0, r1, part, size, (x0, x1), bicubic)
        return np.asarray(across.resize((size, size), bicubic, box=(0, y0 - r0, size, y1 - r0)))
    if tw != width and th != height and vertical_first(width, height, (tw, th)):
        down = Image.new("RGB", (width, th))
        step = max(1, STRIP_PIXELS // height)
        for x in range(0, width, step):
            n = min(step, width - x)
            down.paste(part((x, 0, x + n, height)).resize((n, th), bicubic), (x, 0))
        resized = down.resize((tw, th), bicubic)
    else:
        resized = _across(width, 0, height, part, tw, (0.0, float(width)), bicubic)
        if th != height:
            resized = resized.resize((tw, th), bicubic)
    array = np.asarray(resized)
    top, left = (th - size) // 2, (tw - size) // 2
    return np.ascontiguousarray(array[top : top + size, left : left + size])


def _across(width: int, r0: int, r1: int, part: Callable[[tuple[int, int, int, int]], Image.Image], out: int,
            box: tuple[float, float], resample: int) -> Image.Image:  # fmt: skip
    """Rows ``r0:r1`` resized across to ``out`` columns (``box``: the source columns), a strip at a time."""
    from PIL import Image

    resized = Image.new("RGB", (out, r1 - r0))
    step = max(1, STRIP_PIXELS // width)
    for y in range(r0, r1, step):
        n = min(step, r1 - y)
        strip = part((0, y, width, y + n))
        if (out, box) != (width, (0.0, float(width))):
            strip = strip.resize((out, n), resample, box=(box[0], 0, box[1], n))
        resized.paste(strip, (0, y - r0))
    return resized


def draft_scale(width: int, height: int, size: int) -> int:
    """The JPEG scale-down: the largest ``s`` of 8, 4, 2 with ``shorter ≥ margin × s × size``, else 1.

    The one rule docs/media.md states (integers only); libjpeg then decodes
    ``ceil(w / s) × ceil(h / s)`` pixels, so the shorter side stays at least ``margin × size``.
    """
    if JPEG_DRAFT_MARGIN <= 0:
        return 1
    shorter = min(width, height)
    return next((s for s in (8, 4, 2) if shorter >= JPEG_DRAFT_MARGIN * s * size), 1)


def open_image(source: Source, size: int) -> tuple[Image.Image, int, bool]:
    """The decoded picture (not yet converted), the bytes read, and whether it was scaled down."""
    from PIL import JpegImagePlugin, PngImagePlugin, WebPImagePlugin

    plugins: dict[str, type[Image.Image]] = {
        "JPEG": JpegImagePlugin.JpegImageFile, "PNG": PngImagePlugin.PngImageFile, "WEBP": WebPImagePlugin.WebPImageFile,
    }  # fmt: skip
    try:
        stream = source.open()
    except OSError as exc:
        raise source.fail(f"cannot read the file ({exc.strerror or exc})") from None
    try:
        head = stream.read(32)
        kind = sniff(head)
        if kind is None:
            raise source.fail(f"not a JPEG, PNG or WebP image: {describe(head)}" if head else "the file is empty")
        stream.seek(0)
        # The plugin class itself, not Image.open: no other decoder is tried, and the size
        # check below is ours (Pillow's own warns, or raises a non-OSError, at other sizes).
        image = plugins[kind](stream)  # type: ignore[call-arg]
        if kind == "PNG":
            image.info[_PNG_DEPTH] = png_bit_depth(head)
        width, height = image.size
        if width * height > MAX_PIXELS:
            raise source.fail(
                f"the image is {width}x{height} = {width * height} pixels, over the limit of {MAX_PIXELS} "
                "(uform.plugins.media.image.MAX_PIXELS) against decompression bombs"
            )
        scale = draft_scale(width, height, size) if kind == "JPEG" else 1
        if scale > 1:
            image.draft(None, (width // scale, height // scale))
        image.load()
        read = stream.seek(0, 2)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the decoder says, it is this item's fault
        raise source.fail(f"cannot decode the image: {type(exc).__name__}: {exc}") from None
    finally:
        if source.stream is None:
            stream.close()
    return image, read, image.size != (width, height)


def decode(source: Source, size: int) -> tuple[np.ndarray, int, int, bool]:
    """``uint8 [S, S, 3]`` of one file, with the pixels decoded, bytes read and scale-down flag."""
    image, read, reduced = open_image(source, size)
    pixels = image.width * image.height
    try:
        method = orientation(image)
        if method is None and image.mode == "RGB" and "transparency" not in image.info:
            fitted = frames.fit(image, size)  # nothing to convert: resized as decoded
        else:  # turned and converted a strip at a time, never whole (see fit_strips)
            fitted = fit_strips(*upright_size(image, method), lambda box: to_rgb(upright_box(image, method, box)), size)
    except Exception as exc:  # noqa: BLE001
        raise source.fail(f"cannot convert the image to RGB: {type(exc).__name__}: {exc}") from None
    finally:
        del image  # its pixels go now (not closed: that would close a caller's file object)
        if pixels >= TRIM_PIXELS:
            _give_back()
    return fitted, read, pixels, reduced


def _give_back() -> None:
    """Hand the memory a large picture held back to the system (glibc's ``malloc_trim``),
    which the allocator would otherwise keep for reuse by the thread that decoded it."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


def as_pixels(index: int, buffer: Any) -> np.ndarray:
    """One ``[h, w, 3]`` uint8 buffer as an array; InputError says what is wrong with it."""
    check_not_released(index, buffer)
    try:
        array = np.asarray(buffer)
    except Exception as exc:  # noqa: BLE001
        raise InputError(index, f"not a buffer of pixels ({exc})") from None
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3 or 0 in array.shape:
        raise InputError(index, f"expected uint8 [height, width, 3] pixels, got {array.dtype} {list(array.shape)}")
    return array
