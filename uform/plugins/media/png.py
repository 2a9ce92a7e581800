"""PNG files read a strip of rows at a time: the picture is never held whole.

:func:`layout` walks the chunks (checking each one's CRC; :mod:`.pngchunks`) and says whether
the file can be read so: a non-interlaced, not animated PNG whose EXIF (an ``eXIf`` chunk) does not turn it,
with no other place Pillow reads an orientation from (a ``Raw profile type exif`` or XMP text
chunk), whose rows are at most ``MAX_ROW_BYTES``. Other PNGs (Adam7 interlaced, animated or
turned ones, rows of millions of pixels, headers Pillow refuses) are decoded whole by
Pillow (:mod:`uform.plugins.media.image`). :func:`strips` inflates the image data a strip at a
time (``zlib.decompressobj`` with a bounded output), and unfilters its rows in the op library
(``uform_png_unfilter``: the Average and Paeth filters are sequential); :func:`to_rgb` makes
them the 8-bit RGB that :func:`uform.plugins.media.image.to_rgb` makes of Pillow's decode,
byte for byte (16-bit samples cut to their high byte, palette, grayscale at every depth, tRNS,
alpha over white). Without the op library :func:`native` is None and every PNG is decoded
whole. Damage is a :class:`PngError` naming the chunk or row.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from . import pngchunks
from .pngchunks import COLOUR_TYPES as COLOUR_TYPES
from .pngchunks import PIECE as PIECE
from .pngchunks import SIGNATURE as SIGNATURE
from .pngchunks import Layout as Layout
from .pngchunks import PngError as PngError

MAX_ROW_BYTES = 1 << 22  # a PNG whose unfiltered row is longer is decoded whole (a row is the least a strip holds)
# chunks besides the image data, each read and CRC-checked in Python (9 us each: 300,000 tEXt
# chunks of 15 bytes, a 4.5 MB file, took 2.7 s); a file with more is refused
MAX_CHUNKS = 10_000


def count_chunks(stream: BinaryIO) -> None:
    """PngError past ``MAX_CHUNKS`` chunks besides the image data, for a PNG Pillow reads whole
    (:func:`uform.plugins.media.pngchunks.count_chunks`)."""
    pngchunks.count_chunks(stream, MAX_CHUNKS)


def layout(stream: BinaryIO) -> Layout | None:
    """The file's layout, or None where it must be decoded whole (see the module); PngError for
    a damaged chunk up to the end of the image data (:func:`uform.plugins.media.pngchunks.layout`)."""
    return pngchunks.layout(stream, MAX_CHUNKS, MAX_ROW_BYTES)


@dataclass(frozen=True)
class Native:
    """The op library's entries this reader runs (native/uform_ops/png.cpp)."""

    unfilter: Callable[..., int]  # uform_png_unfilter: scanlines unfiltered
    over_white: Callable[..., None]  # uform_png_over_white: gray-alpha or RGBA composited over white


@functools.cache
def native() -> Native | None:
    """The op library's PNG entries, or None without the library (or with an older build of
    it). The file is opened directly (``library_path``), not through ``library()``, whose
    load asks Linux for the AMX tile state: decoding a picture changes nothing else."""
    from uform.plugins.oplib.library import OpLibraryError, library_path

    try:
        handle = ctypes.CDLL(str(library_path()))
        unfilter, over_white = handle.uform_png_unfilter, handle.uform_png_over_white
    except (OpLibraryError, OSError, AttributeError):
        return None
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    unfilter.restype, unfilter.argtypes = i64, [pointer, i64, i64, i64, pointer, pointer]
    over_white.restype, over_white.argtypes = None, [pointer, i64, i64, i64, pointer]
    return Native(unfilter, over_white)


def streams(png: Layout, alpha: str) -> bool:
    """Whether the rows are read here under the tower's alpha rule: ``drop`` (open_clip's order,
    the picture resized in its own mode, then made RGB) leaves palette and 1-bit grayscale
    pictures to Pillow's whole decode, whose resize takes their nearest pixel; alpha pictures
    are read here, as premultiplied RGBa (:func:`to_rgba`)."""
    return alpha == "white" or not (png.colour == 3 or (png.colour == 0 and png.depth == 1))


def to_rgba(png: Layout, raw: np.ndarray) -> np.ndarray:
    """Gray-alpha or RGBA rows as ``uint8 [n, width, 4]`` RGBA, Pillow's decode of them (16-bit
    samples cut to their high byte, gray repeated), for ``alpha: drop``'s premultiplied fit."""
    eight = _high_bytes(png, raw) if png.depth == 16 else raw.reshape(len(raw), png.width, COLOUR_TYPES[png.colour][0])
    return eight if png.colour == 6 else np.ascontiguousarray(eight[..., [0, 0, 0, 1]])


def strips(stream: BinaryIO, png: Layout, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(y, uint8 [n, stride])``: the unfiltered rows, ``rows`` at a time, from the top, each
    strip in the same buffer (read it before asking for the next); PngError where the data is
    cut short, corrupt, fails its CRC or names an unknown filter."""
    entries = native()
    assert entries is not None, "no op library: decode the PNG whole"
    stride, bpp = png.stride, max(1, png.bits // 8)
    inflater, pending = zlib.decompressobj(), b""
    pieces = _pieces(stream, png)
    prior = np.zeros(stride, np.uint8)
    filtered = np.empty(min(rows, png.height) * (stride + 1), np.uint8)
    unfiltered = np.empty((min(rows, png.height), stride), np.uint8)
    for y in range(0, png.height, rows):
        n = min(rows, png.height - y)
        need, got = n * (stride + 1), 0
        while got < need:
            if not pending:
                pending = b"" if inflater.eof else next(pieces, b"")
                if not pending:
                    done = y + got // (stride + 1)
                    raise PngError(f"the image data ends after row {done} of {png.height} (the file is cut short or its IDAT is short)")
            try:  # a piece at a time, into the strip's buffer
                piece = inflater.decompress(pending, min(PIECE, need - got))
            except zlib.error as exc:
                raise PngError(f"the image data is corrupt near row {y + got // (stride + 1)}: {exc}") from None
            filtered[got : got + len(piece)] = np.frombuffer(piece, np.uint8)
            got += len(piece)
            pending = b"" if inflater.eof else inflater.unconsumed_tail
        bad = entries.unfilter(filtered.ctypes.data, n, stride, bpp, prior.ctypes.data, unfiltered.ctypes.data)
        if bad >= 0:
            raise PngError(f"row {y + bad} has filter type {filtered[bad * (stride + 1)]} (PNG defines 0-4)")
        yield y, unfiltered[:n]
    for _ in pieces:  # the rest of the image data, read for its CRCs
        pass


def _pieces(stream: BinaryIO, png: Layout) -> Iterator[bytes]:
    """The IDAT chunks' data, a piece at a time; each chunk's CRC is checked before its data
    is given (a second read of the compressed bytes), so damage is named as such."""
    for start, length in png.idat:
        stream.seek(start)
        crc, left = zlib.crc32(b"IDAT"), length
        while left and (piece := stream.read(min(left, PIECE))):
            crc = zlib.crc32(piece, crc)
            left -= len(piece)
        stored = stream.read(4)
        if not left and len(stored) == 4 and struct.unpack(">I", stored)[0] != crc:
            raise PngError(f"chunk IDAT at byte {start - 8}: CRC mismatch (the file is damaged)")
        stream.seek(start)  # a chunk cut short is given as far as it goes: strips() names the row
        left = length
        while left and (piece := stream.read(min(left, PIECE))):
            left -= len(piece)
            yield piece


def _samples(png: Layout, raw: np.ndarray) -> np.ndarray:
    """``[n, width, channels]`` samples of unfiltered rows: 16-bit ones as big-endian uint16."""
    n, channels = len(raw), COLOUR_TYPES[png.colour][0]
    if png.depth == 16:
        return raw.view(">u2").reshape(n, png.width, channels)
    if png.depth == 8:
        return raw.reshape(n, png.width, channels)
    # 1, 2 or 4 bits a sample (gray or palette: one channel), packed from each byte's high bits
    shifts = np.arange(8 - png.depth, -1, -png.depth, dtype=np.uint8)
    values = (raw[:, :, None] >> shifts) & np.uint8((1 << png.depth) - 1)
    return values.reshape(n, -1)[:, : png.width, None]


def to_rgb(png: Layout, raw: np.ndarray, alpha: str = "white") -> np.ndarray:
    """Unfiltered rows as ``uint8 [n, width, 3]``: what image.to_rgb makes of Pillow's decode
    (``alpha="drop"``: a grayscale or truecolour tRNS value ignored; palette and 1-bit pictures
    are not read here then, alpha ones through :func:`to_rgba`: see :func:`streams`)."""
    trns = png.transparency if alpha == "white" else None
    if png.colour in (4, 6):
        return _composited(png, raw)
    samples = _samples(png, raw)
    if png.colour == 3:
        return np.asarray(_palette(png)[samples[..., 0]])
    if png.colour == 0:
        gray = samples[..., 0]
        if png.depth == 16:
            eight = (gray >> 8).astype(np.uint8)
        elif png.depth < 8:
            eight = gray * np.uint8(255 // ((1 << png.depth) - 1))  # Pillow's L;1 (its "1"), L;2 and L;4
        else:
            eight = gray
        rgb = np.repeat(eight[..., None], 3, axis=2)
        if trns is not None:
            key = struct.unpack(">H", trns[:2])[0]
            if png.depth == 1:  # Pillow's "1": transparency 255 for any non-zero key
                rgb[eight == (255 if key else 0)] = 255
            else:
                rgb[gray == key] = 255  # the stored sample (image.to_rgb: 16-bit and 1-4-bit alike)
        return rgb
    eight = _high_bytes(png, raw) if png.depth == 16 else samples
    rgb = np.array(eight)  # a copy: the rows' buffer is the next strip's
    if trns is not None:
        colour = np.asarray(struct.unpack(">3H", trns[:6]), np.int64) >> (8 if png.depth == 16 else 0)
        rgb[(rgb == colour).all(axis=2)] = 255
    return rgb


def _composited(png: Layout, raw: np.ndarray) -> np.ndarray:
    """Gray-alpha or RGBA rows over white, in the op library."""
    entries = native()
    assert entries is not None
    out = np.empty((len(raw), png.width, 3), np.uint8)
    raw = np.ascontiguousarray(raw)
    entries.over_white(raw.ctypes.data, len(raw) * png.width, COLOUR_TYPES[png.colour][0], png.depth // 8, out.ctypes.data)
    return out


def _high_bytes(png: Layout, raw: np.ndarray) -> np.ndarray:
    """``[n, width, channels]`` high bytes of 16-bit samples (big-endian: each sample's first byte)."""
    return raw.reshape(len(raw), png.width, COLOUR_TYPES[png.colour][0], 2)[..., 0]


def _palette(png: Layout) -> np.ndarray:
    """The 256 palette entries as RGB, alpha composited (entries past PLTE black, as Pillow's)."""
    entries = np.zeros((256, 3), np.uint8)
    given = np.frombuffer(png.palette, np.uint8).reshape(-1, 3)
    entries[: len(given)] = given
    if png.transparency is None:
        return entries
    alpha = np.full(256, 255, np.uint8)
    trns = np.frombuffer(png.transparency[:256], np.uint8)
    alpha[: len(trns)] = trns
    a = alpha[:, None].astype(np.int64)  # image.to_rgb's compositing, as uform_png_over_white makes it
    return ((entries * a + 255 * (255 - a) + 127) // 255).astype(np.uint8)
