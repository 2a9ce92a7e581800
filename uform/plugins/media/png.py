"""PNG files read a strip of rows at a time: the picture is never held whole.

:func:`layout` walks the chunks (checking each one's CRC) and says whether the file can be
read so: a non-interlaced, not animated PNG whose EXIF (an ``eXIf`` chunk) does not turn it,
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
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
PIECE = 1 << 16  # compressed bytes read at a time
MAX_ROW_BYTES = 1 << 22  # a PNG whose unfiltered row is longer is decoded whole (a row is the least a strip holds)
# chunks besides the image data, each read and CRC-checked in Python (9 us each: 300,000 tEXt
# chunks of 15 bytes, a 4.5 MB file, took 2.7 s); a file with more is refused
MAX_CHUNKS = 10_000
# colour type -> samples a pixel, and the bit depths the PNG specification allows
COLOUR_TYPES = {0: (1, (1, 2, 4, 8, 16)), 2: (3, (8, 16)), 3: (1, (1, 2, 4, 8)), 4: (2, (8, 16)), 6: (4, (8, 16))}
ORIENTATION_TEXTS = (b"Raw profile type exif", b"XML:com.adobe.xmp")  # where else Pillow finds an orientation
_ORIENTATION = 0x0112


class PngError(ValueError):
    """The PNG is damaged; the message names the chunk (and its byte offset) or the row."""


@dataclass
class Layout:
    """What :func:`layout` found: the header's fields, palette, transparency and the image data's chunks."""

    width: int
    height: int
    depth: int
    colour: int
    palette: bytes = b""
    transparency: bytes | None = None
    idat: list[tuple[int, int]] = field(default_factory=list)  # (offset of the data, length) of each IDAT

    @property
    def bits(self) -> int:
        return COLOUR_TYPES[self.colour][0] * self.depth

    @property
    def stride(self) -> int:
        """Bytes of one unfiltered row."""
        return (self.width * self.bits + 7) // 8


def count_chunks(stream: BinaryIO) -> None:
    """PngError past ``MAX_CHUNKS`` chunks besides the image data, their headers read and their
    bodies seeked over (no CRC), for a PNG Pillow reads whole: its reader walks each chunk in
    Python too (300,000 tEXt chunks: 1.4-1.6 s; unknown ones 2.5 s and +41 MB). Stops at IEND,
    at the file's end, or at a garbled chunk (Pillow's to name)."""
    stream.seek(8)
    chunks = 0
    while True:
        head = stream.read(8)
        if len(head) < 8:
            return
        length, kind = struct.unpack(">I4s", head)
        if not kind.isalpha() or kind == b"IEND":
            return
        if kind != b"IDAT":
            chunks += 1
            if chunks > MAX_CHUNKS:
                raise PngError(f"over {MAX_CHUNKS} chunks besides the image data (uform.plugins.media.png.MAX_CHUNKS)")
        stream.seek(length + 4, 1)


def layout(stream: BinaryIO) -> Layout | None:
    """The file's layout, from its start; None where it must be decoded whole (see the module);
    PngError for a damaged chunk up to the end of the image data. Damage after it (which
    Pillow reads past or stops at) leaves the file to Pillow: an eXIf may lie beyond it."""
    stream.seek(0)
    if stream.read(8) != SIGNATURE:
        raise PngError("not a PNG signature")
    found: Layout | None = None
    declined, idat_ended, exif = False, False, None
    offset, size = 8, stream.seek(0, 2)
    stream.seek(8)
    chunks = 0
    while True:
        try:
            head = stream.read(8)
            if len(head) < 8:
                if found is None or not found.idat:
                    raise PngError(f"the file ends at byte {offset + len(head)}, before any image data (IDAT)")
                break  # no IEND after the image data: Pillow reads no further either
            length, kind = struct.unpack(">I4s", head)
            if not kind.isalpha() or length > 0x7FFFFFFF:
                raise PngError(f"garbled chunk at byte {offset} (type {kind!r}, length {length})")
            where = f"chunk {kind.decode('ascii')} at byte {offset}"
            if found is None and kind != b"IHDR":
                raise PngError(f"the first chunk is {kind.decode('ascii')}, not IHDR")
            if kind == b"IDAT":
                if idat_ended:
                    declined = True  # image data in two runs: left to Pillow
                elif found is not None:
                    found.idat.append((offset + 8, length))
                if stream.seek(length, 1) + 4 > size:
                    break  # cut inside the image data: strips() names the row
                stream.seek(4, 1)  # its CRC is checked as strips() reads it
                offset += 12 + length
                continue
            idat_ended = found is not None and bool(found.idat)
            chunks += 1
            if chunks > MAX_CHUNKS:
                raise PngError(f"over {MAX_CHUNKS} chunks besides the image data (uform.plugins.media.png.MAX_CHUNKS)")
            data = _read_checked(stream, kind, length, where, kind in (b"IHDR", b"PLTE", b"tRNS", b"eXIf"))
        except PngError as exc:
            if idat_ended and not exc.args[0].startswith(f"over {MAX_CHUNKS} chunks"):
                return None
            raise
        if kind == b"IHDR":
            if found is not None:
                raise PngError(f"a second IHDR ({where})")
            found = _header(data, where)
            if found is None:
                return None
        elif kind == b"PLTE" and found is not None:
            found.palette = data
        elif kind == b"tRNS" and found is not None:
            found.transparency = data
        elif kind == b"eXIf":
            exif = data
        elif kind in (b"tEXt", b"zTXt", b"iTXt") and data.split(b"\0", 1)[0] in ORIENTATION_TEXTS:
            declined = True
        elif kind == b"acTL":
            declined = True  # an animated PNG: its first frame is Pillow's to pick
        elif kind == b"IEND":
            break
        offset += 12 + length
    assert found is not None
    if declined or (exif is not None and _turned(exif)) or not _pillow_reads(found):
        return None
    return found


def _read_checked(stream: BinaryIO, kind: bytes, length: int, where: str, keep: bool) -> bytes:
    """A chunk's data (only its first 80 bytes unless ``keep``), its CRC checked."""
    crc, kept, left = zlib.crc32(kind), b"", length
    while left:
        piece = stream.read(min(left, PIECE))
        if not piece:
            raise PngError(f"the file ends inside {where} ({length - left} of its {length} bytes)")
        crc = zlib.crc32(piece, crc)
        if keep or len(kept) < 80:
            kept += piece if keep else piece[: 80 - len(kept)]
        left -= len(piece)
    stored = stream.read(4)
    if len(stored) < 4:
        raise PngError(f"the file ends inside {where} (its CRC)")
    if struct.unpack(">I", stored)[0] != crc:
        raise PngError(f"{where}: CRC mismatch (the file is damaged)")
    return kept


def _header(data: bytes, where: str) -> Layout | None:
    if len(data) != 13:
        raise PngError(f"{where}: {len(data)} bytes, not 13")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", data)
    if colour not in COLOUR_TYPES or depth not in COLOUR_TYPES[colour][1] or compression or filtering or width == 0 or height == 0:
        return None  # Pillow's own error (or its own reading) for these
    if interlace:
        return None  # Adam7: its passes cannot be read a row of the picture at a time
    found = Layout(width, height, depth, colour)
    return None if found.stride > MAX_ROW_BYTES else found  # rows so long that one costs more than Pillow's whole decode


def _pillow_reads(png: Layout) -> bool:
    """Whether Pillow reads this header, palette and tRNS as :func:`to_rgb` assumes (else its own error)."""
    if png.colour == 3:
        return 0 < len(png.palette) <= 768 and len(png.palette) % 3 == 0
    if png.transparency is not None and png.colour in (0, 2):
        return len(png.transparency) >= (6 if png.colour == 2 else 2)
    return True


def _turned(exif: bytes) -> bool:
    """Whether an eXIf chunk turns the picture (orientation 2-8), as ``image.orientation`` reads it."""
    from PIL import Image

    try:
        tags = Image.Exif()
        tags.load(b"Exif\x00\x00" + exif)
        return tags.get(_ORIENTATION, 1) in range(2, 9)
    except Exception:  # noqa: BLE001 - broken EXIF: shown as stored, as image.orientation does
        return False


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


def to_rgb(png: Layout, raw: np.ndarray) -> np.ndarray:
    """Unfiltered rows as ``uint8 [n, width, 3]``: what image.to_rgb makes of Pillow's decode."""
    trns = png.transparency
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
