"""Pictures to pixels on the host: JPEG, PNG and WebP files decoded, oriented, made 8-bit RGB
and fitted to the tower's square; ``[h, w, 3]`` uint8 buffers checked.

The rules are docs/media-images.md's; the resize and crop is :func:`uform.plugins.media.frames.fit`.
Files are recognised by their content, never by their name. The image plugin
(:mod:`uform.plugins.image`) maps :func:`decode` over the executor's threads.

Memory: a non-interlaced PNG is never held whole: it is read, converted and fitted a strip of
rows at a time (:mod:`uform.plugins.media.png`, :class:`~uform.plugins.media.rowfit.RowFit`).
Other pictures are decoded whole by Pillow (a JPEG at a reduced scale where it is large);
beside the decoded picture :func:`decode` holds no full-size copy: a picture that must be
turned or converted (alpha, 16 bits, palette, grayscale, CMYK) is turned and converted a strip
of rows at a time (``STRIP_PIXELS``), each strip going straight into the fit
(:func:`fit_strips`), which is ``frames.fit`` bit for bit. A tower's ``alpha: drop`` (open_clip's
order) fits an alpha picture premultiplied, a strip at a time, and a palette or 1-bit one whole.
A NaFlex tower's picture goes the same ways to its grid (``RowFit`` makes the grid's whole
resize, no crop, as it makes the square's).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from uform.core.errors import InputError, check_not_released

from . import frames, jpeg, png
from .files import Source
from .rowfit import RowFit
from .rowfit import vertical_first as vertical_first  # Pillow's pass order, named here by docs/media-images.md and the tests
from .upright import AS_STORED, WEIGHTED, fit_as_stored, premultiplied, unpremultiplied_rgb
from .upright import PNG_DEPTH as _PNG_DEPTH
from .upright import orient as orient  # the picture made upright and RGB, imported from here too
from .upright import orientation as orientation
from .upright import to_rgb as to_rgb
from .upright import upright_box as upright_box
from .upright import upright_size as upright_size

if TYPE_CHECKING:
    from PIL import Image

MAX_PIXELS = 100_000_000  # width × height above which a file is refused as a decompression bomb
PIXEL_INPUTS = "pixels (uint8, 0 to 255)"  # what an image or video tower's feed is, for the error blaming a checkpoint
JPEG_DRAFT_MARGIN = 2  # decode JPEGs at 1/s (s = 8, 4, 2: the largest with shorter ≥ margin × s × S); 0: never
TRIM_PIXELS = 1 << 24  # a decoded picture this large is handed back to the system once fitted (_give_back)
STRIP_PIXELS = 1 << 16  # pixels a strip of rows holds while it is turned, converted and resized across
FORMATS = ("JPEG", "PNG", "WEBP")
# Pillow decodes a WebP through libwebp's animation decoder (its canvas and the previous one)
# and copies the frame twice: 16 bytes a pixel, 4 times the 4 of other formats decoded whole;
# a WebP is held to MAX_PIXELS // WEBP_SHARE pixels, so it holds what they hold at MAX_PIXELS
WEBP_SHARE = 4


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




def png_bit_depth(head: bytes) -> int:
    """The sample bit depth (1, 2, 4, 8 or 16) an IHDR chunk at the start of a PNG states; 8 if absent."""
    return head[24] if len(head) > 25 and head[12:16] == b"IHDR" else 8


def webp_size(head: bytes) -> tuple[int, int] | None:
    """``(width, height)`` a WebP's first chunk states (``VP8X`` canvas, ``VP8L`` or ``VP8 ``
    header: all within the first 30 bytes), or None if it states none uform can read."""
    kind = head[12:16]
    if kind == b"VP8X" and len(head) >= 30:
        return 1 + int.from_bytes(head[24:27], "little"), 1 + int.from_bytes(head[27:30], "little")
    if kind == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if kind == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        return int.from_bytes(head[26:28], "little") & 0x3FFF, int.from_bytes(head[28:30], "little") & 0x3FFF
    return None


def fit_strips(width: int, height: int, part: Callable[[tuple[int, int, int, int]], Image.Image | np.ndarray], size: int, channels: int = 3) -> np.ndarray:
    """:func:`uform.plugins.media.frames.fit` of a ``width × height`` RGB picture given in parts.

    ``part(box)`` gives the ``(x0, y0, x1, y1)`` box of the picture as 8-bit RGB; it is asked
    for strips of whole rows, ``STRIP_PIXELS`` or so, from the top down, and only for the rows
    the fit reads. :class:`~uform.plugins.media.rowfit.RowFit` makes both passes of the resize
    as the rows arrive, so this is ``fit`` bit for bit (the region rule of
    ``frames.fit_region`` and a :class:`~uform.plugins.media.frames.Fit`'s square resize,
    bilinear filter and rounding included) while no full-size picture but the decoded one,
    and neither pass's whole result, is ever held. ``channels=4``: parts are premultiplied RGBa.
    """
    fit = RowFit(width, height, size, channels)
    first, last = fit.rows
    step = max(1, STRIP_PIXELS // width)
    for y in range(first, last, step):
        n = min(step, last - y)
        fit.feed(y, np.asarray(part((0, y, width, y + n))))
    return fit.result()


def draft_scale(width: int, height: int, size: int) -> int:
    """The JPEG scale-down: the largest ``s`` of 8, 4, 2 with ``shorter ≥ margin × s × size``, else 1.

    The one rule docs/media-images.md states (integers only); libjpeg then decodes
    ``ceil(w / s) × ceil(h / s)`` pixels, so the shorter side stays at least ``margin × size``.
    """
    if JPEG_DRAFT_MARGIN <= 0:
        return 1
    shorter = min(width, height)
    return next((s for s in (8, 4, 2) if shorter >= JPEG_DRAFT_MARGIN * s * size), 1)


def _drafted_side(width: int, height: int, size: int) -> int:
    """The side the JPEG scale-down keeps ``margin ×`` above: ``S``; for a NaFlex tower the
    shorter side of the picture's grid in pixels (media/naflex.py)."""
    if not (isinstance(size, frames.Fit) and size.resize == "naflex"):
        return size
    from .naflex import grid_for

    return min(grid_for(height, width, size.patch, size.max_patches)) * size.patch


def open_image(source: Source, size: int) -> tuple[Image.Image, int, bool]:
    """The picture decoded whole by Pillow (not yet converted), the bytes read, and whether it was scaled down."""
    stream = _open(source)
    try:
        return _pillow(source, stream, size)
    finally:
        if source.stream is None:
            stream.close()


def _open(source: Source) -> BinaryIO:
    try:
        return source.open()
    except OSError as exc:
        raise source.fail(f"cannot read the file ({exc.strerror or exc})") from None


def _sniffed(source: Source, stream: BinaryIO) -> str:
    try:
        head = stream.read(32)
    except OSError as exc:
        raise source.fail(f"cannot read the file ({exc.strerror or exc})") from None
    kind = sniff(head)
    if kind is None:
        raise source.fail(f"not a JPEG, PNG or WebP image: {describe(head)}" if head else "the file is empty")
    return kind


def _check_size(source: Source, width: int, height: int, kind: str = "") -> None:
    if width * height > MAX_PIXELS:
        raise source.fail(
            f"the image is {width}x{height} = {width * height} pixels, over the limit of {MAX_PIXELS} "
            "(uform.plugins.media.image.MAX_PIXELS) against decompression bombs"
        )
    if kind == "WEBP" and width * height > MAX_PIXELS // WEBP_SHARE:
        raise source.fail(
            f"the WebP is {width}x{height} = {width * height} pixels, over the limit of {MAX_PIXELS // WEBP_SHARE} "
            f"for WebP (uform.plugins.media.image.MAX_PIXELS // {WEBP_SHARE}: Pillow's WebP decoder holds 16 bytes a pixel)"
        )


def _pillow(source: Source, stream: BinaryIO, size: int) -> tuple[Image.Image, int, bool]:
    from PIL import JpegImagePlugin, PngImagePlugin, WebPImagePlugin

    plugins: dict[str, type[Image.Image]] = {
        "JPEG": JpegImagePlugin.JpegImageFile, "PNG": PngImagePlugin.PngImageFile, "WEBP": WebPImagePlugin.WebPImageFile,
    }  # fmt: skip
    try:
        stream.seek(0)
        head = stream.read(32)
        kind = _sniffed(source, io.BytesIO(head))
        stated = webp_size(head) if kind == "WEBP" else None
        if stated is not None:  # before Pillow's WebP reader, which refuses 2 x MAX_IMAGE_PIXELS in its own words
            _check_size(source, *stated, kind)
        if kind == "WEBP" and stream.seek(0, 2) < int.from_bytes(head[4:8], "little") + 8:  # libwebp: "could not create decoder object"
            raise source.fail(f"the WebP is truncated: its RIFF header declares {int.from_bytes(head[4:8], 'little') + 8} bytes, the file holds {stream.tell()}")
        if kind == "JPEG":  # before Pillow's reader, which holds every APPn segment
            jpeg.check(source, stream)
        stream.seek(0)
        # The plugin class itself, not Image.open: no other decoder is tried, and the size
        # check below is ours (Pillow's own warns, or raises a non-OSError, at other sizes).
        image = plugins[kind](stream)  # type: ignore[call-arg]
        if kind == "PNG":
            image.info[_PNG_DEPTH] = png_bit_depth(head)
        width, height = image.size
        _check_size(source, width, height, kind)
        scale = draft_scale(width, height, _drafted_side(width, height, size)) if kind == "JPEG" else 1
        if scale > 1:
            image.draft(None, (width // scale, height // scale))
        image.load()
        read = stream.seek(0, 2)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the decoder says, it is this item's fault
        raise source.fail(f"cannot decode the image: {type(exc).__name__}: {exc}") from None
    return image, read, image.size != (width, height)


def _png_rows(source: Source, stream: BinaryIO, size: int) -> tuple[np.ndarray, int, int, bool] | None:
    """A PNG read and fitted a strip of rows at a time (:mod:`uform.plugins.media.png`), or
    None where it is decoded whole instead (no op library, interlaced, turned by its EXIF)."""
    try:
        if png.native() is None:  # Pillow reads it, walking its chunks as uform's walk would
            png.count_chunks(stream)
            return None
        found = png.layout(stream)
        if found is None or not png.streams(found, frames.alpha_rule(size)):
            return None
        _check_size(source, found.width, found.height)
        alpha = frames.alpha_rule(size)
        weighted = alpha == "drop" and found.colour in (4, 6)  # premultiplied, as Pillow resizes RGBA (upright.WEIGHTED)
        fit = RowFit(found.width, found.height, size, 4 if weighted else 3)
        first, last = fit.rows
        for y, raw in png.strips(stream, found, max(1, STRIP_PIXELS // found.width)):
            lo, hi = max(first, y), min(last, y + len(raw))
            if lo < hi:  # every row is read (a file cut short fails as Pillow's decode does), the fit's converted
                rows = raw[lo - y : hi - y]
                fit.feed(lo, premultiplied(frames.from_rgba(png.to_rgba(found, rows))) if weighted else png.to_rgb(found, rows, alpha))
        read = stream.seek(0, 2)
        return unpremultiplied_rgb(fit.result()) if weighted else fit.result(), read, found.width * found.height, False
    except InputError:
        raise
    except png.PngError as exc:
        raise source.fail(f"cannot decode the image: {exc}") from None
    except Exception as exc:  # noqa: BLE001
        raise source.fail(f"cannot decode the image: {type(exc).__name__}: {exc}") from None


def decode(source: Source, size: int) -> tuple[np.ndarray, int, int, bool]:
    """``uint8 [S, S, 3]`` of one file (a NaFlex tower's ``[gh·P, gw·P, 3]``), with the pixels decoded, bytes read and scale-down flag."""
    stream = _open(source)
    try:
        if _sniffed(source, stream) == "PNG":
            streamed = _png_rows(source, stream, size)
            if streamed is not None:
                return streamed
        image, read, reduced = _pillow(source, stream, size)
    finally:
        if source.stream is None:
            stream.close()
    pixels, alpha = image.width * image.height, frames.alpha_rule(size)
    try:
        method = orientation(image)
        if alpha == "drop" and image.mode in AS_STORED:  # open_clip's order: fitted in its own mode, then RGB
            fitted = fit_as_stored(image, method, size)
        elif alpha == "drop" and image.mode in WEIGHTED:  # premultiplied a strip at a time, as Pillow resizes RGBA
            part = lambda box: premultiplied(upright_box(image, method, box))  # noqa: E731
            fitted = unpremultiplied_rgb(fit_strips(*upright_size(image, method), part, size, 4))
        elif method is None and image.mode == "RGB" and "transparency" not in image.info:
            fitted = frames.fit(image, size)  # nothing to convert: resized as decoded
        else:  # turned and converted a strip at a time, never whole (see fit_strips)
            fitted = fit_strips(*upright_size(image, method), lambda box: to_rgb(upright_box(image, method, box), alpha), size)
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
