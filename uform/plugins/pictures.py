"""Pictures to pixels on the host: JPEG, PNG and WebP files decoded, oriented, made 8-bit RGB
and fitted to the tower's square; ``[h, w, 3]`` uint8 buffers checked.

The rules are docs/media.md's ("Images"); the resize and crop is :func:`uform.plugins.frames.fit`.
Files are recognised by their content, never by their name. The image plugin
(:mod:`uform.plugins.image`) maps :func:`decode` over the executor's threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from uform.core.errors import InputError

from . import frames
from .sources import Source

if TYPE_CHECKING:
    from PIL import Image

MAX_PIXELS = 100_000_000  # width × height above which a file is refused as a decompression bomb
JPEG_DRAFT_MARGIN = 2  # decode JPEGs at 1/s (s = 8, 4, 2: the largest with shorter ≥ margin × s × S); 0: never
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
        alpha = rgba[..., 3:].astype(np.uint32)
        rgb = (rgba[..., :3] * alpha + 255 * (255 - alpha) + 127) // 255
        return frames.from_array(rgb.astype(np.uint8))
    return image.convert("RGB")


def orient(image: Image.Image) -> Image.Image:
    """The picture turned upright as its EXIF orientation (1-8) says; an unreadable tag is ignored."""
    from PIL import Image

    try:
        orientation = image.getexif().get(_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - broken EXIF: show the pixels as stored
        return image
    method = {
        2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_90,
    }.get(orientation)  # fmt: skip
    return image if method is None else image.transpose(method)


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
                "(uform.plugins.pictures.MAX_PIXELS) against decompression bombs"
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
    try:
        rgb = to_rgb(orient(image))
    except Exception as exc:  # noqa: BLE001
        raise source.fail(f"cannot convert the image to RGB: {type(exc).__name__}: {exc}") from None
    return frames.fit(rgb, size), read, image.width * image.height, reduced


def as_pixels(index: int, buffer: Any) -> np.ndarray:
    """One ``[h, w, 3]`` uint8 buffer as an array; InputError says what is wrong with it."""
    try:
        array = np.asarray(buffer)
    except Exception as exc:  # noqa: BLE001
        raise InputError(index, f"not a buffer of pixels ({exc})") from None
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3 or 0 in array.shape:
        raise InputError(index, f"expected uint8 [height, width, 3] pixels, got {array.dtype} {list(array.shape)}")
    return array
