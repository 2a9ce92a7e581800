"""A PNG's chunks walked from its start, for :mod:`uform.plugins.media.png`.

:func:`layout` checks each chunk's CRC and finds the header, palette, transparency and the
image data's chunks, or says the file is Pillow's to decode whole; :func:`count_chunks` only
counts the chunks of one Pillow reads. The limits they are held to are ``png``'s
(``MAX_CHUNKS``, ``MAX_ROW_BYTES``), passed in by its wrappers so that they stay settable there.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO

SIGNATURE = b"\x89PNG\r\n\x1a\n"
PIECE = 1 << 16  # compressed bytes read at a time
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


def count_chunks(stream: BinaryIO, max_chunks: int) -> None:
    """PngError past ``max_chunks`` (``png.MAX_CHUNKS``) chunks besides the image data, their
    headers read and their bodies seeked over (no CRC), for a PNG Pillow reads whole: its
    reader walks each chunk in Python too (300,000 tEXt chunks: 1.4-1.6 s; unknown ones 2.5 s and +41 MB). Stops at IEND,
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
            if chunks > max_chunks:
                raise PngError(f"over {max_chunks} chunks besides the image data (uform.plugins.media.png.MAX_CHUNKS)")
        stream.seek(length + 4, 1)


def layout(stream: BinaryIO, max_chunks: int, max_row_bytes: int) -> Layout | None:
    """The file's layout, from its start; None where it must be decoded whole (see :mod:`png`:
    a row over ``max_row_bytes``, ``png.MAX_ROW_BYTES``); PngError past ``max_chunks`` chunks
    besides the image data (``png.MAX_CHUNKS``) or for a damaged chunk up to the end of the
    image data. Damage after it (which
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
            if chunks > max_chunks:
                raise PngError(f"over {max_chunks} chunks besides the image data (uform.plugins.media.png.MAX_CHUNKS)")
            data = _read_checked(stream, kind, length, where, kind in (b"IHDR", b"PLTE", b"tRNS", b"eXIf"))
        except PngError as exc:
            if idat_ended and not exc.args[0].startswith(f"over {max_chunks} chunks"):
                return None
            raise
        if kind == b"IHDR":
            if found is not None:
                raise PngError(f"a second IHDR ({where})")
            found = _header(data, where, max_row_bytes)
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


def _header(data: bytes, where: str, max_row_bytes: int) -> Layout | None:
    if len(data) != 13:
        raise PngError(f"{where}: {len(data)} bytes, not 13")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", data)
    if colour not in COLOUR_TYPES or depth not in COLOUR_TYPES[colour][1] or compression or filtering or width == 0 or height == 0:
        return None  # Pillow's own error (or its own reading) for these
    if interlace:
        return None  # Adam7: its passes cannot be read a row of the picture at a time
    found = Layout(width, height, depth, colour)
    return None if found.stride > max_row_bytes else found  # rows so long that one costs more than Pillow's whole decode


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
