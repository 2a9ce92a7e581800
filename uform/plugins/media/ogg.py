"""An Ogg Opus or Vorbis file's tags left out of what FFmpeg reads: its headers rewritten, then the sound.

FFmpeg reads an Ogg file's header packets whole as it opens it and holds its tags about four
times over (its packet buffer, the comment parsed into its dictionary, PyAV's): a 15 MB
``OpusTags`` tag took +61 MB of peak RSS (``python -m tests.test_media_bombs --unchecked``,
docs/media-audio.md, "From file to window"). No tag is needed for a window, so :func:`stripped` walks the header
pages (reading their lacing values, seeking over their bodies) and, for a single Opus or
Vorbis stream whose headers hold ``metadata.SPLICE_FROM`` bytes or more, gives the pages the
audio reader hands FFmpeg in their place (a ``metadata.Spliced`` file): the identification
header's page as it is, then an empty comment header (and Vorbis's setup header) on pages of
their own, each with its CRC; the sound's pages follow unchanged. Any other Ogg file (FLAC or
Speex in Ogg, several streams, headers that share a page with sound) is given to FFmpeg as it
is, its headers held to ``metadata.MAX_OGG_HEADER_BYTES``.
"""

from __future__ import annotations

import struct
import zlib
from typing import BinaryIO

MAX_KEPT_BYTES = 1 << 16  # identification and setup headers read and rewritten; larger ones are left to FFmpeg
_REVERSED = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))
# the comment header each codec is given instead of its own: no vendor, no comment
_EMPTY = {b"OpusHead": b"OpusTags" + bytes(8), b"\x01vorbis": b"\x03vorbis" + bytes(8) + b"\x01"}
_HEADERS = {b"OpusHead": 2, b"\x01vorbis": 3}  # header packets of each codec, the comment the second
MOST_PAGES = 1 << 16  # header pages walked (a 16 MiB tag spans 258)


def crc(data: bytes) -> int:
    """Ogg's page checksum (CRC-32, polynomial 0x04C11DB7 unreflected, from 0, nothing xored at the
    end), computed by zlib's reflected CRC-32 over the bytes bit-reversed."""
    reflected = zlib.crc32(data.translate(_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


def page(flags: int, granule: int, serial: int, sequence: int, lacing: bytes, body: bytes) -> bytes:
    """One Ogg page, its checksum written."""
    head = b"OggS\x00" + bytes([flags]) + struct.pack("<qII", granule, serial, sequence)
    data = head + bytes(4) + bytes([len(lacing)]) + lacing + body
    return head + struct.pack("<I", crc(data)) + data[len(head) + 4 :]


def pages(packets: list[bytes], serial: int, sequence: int, flags: int = 0) -> bytes:
    """Header ``packets`` laid out on pages from number ``sequence`` on (granule 0, or -1 on a page
    where no packet ends), the last packet ending its page; ``flags`` on the first page."""
    lacing = b"".join(b"\xff" * (len(p) // 255) + bytes([len(p) % 255]) for p in packets)
    body = b"".join(packets)
    out, at, used, continued = [], 0, 0, False
    while at < len(lacing):
        part = lacing[at : at + 255]
        size = sum(part)
        ends = any(v < 255 for v in part)
        out.append(page(1 if continued else flags, 0 if ends else -1, serial, sequence, part, body[used : used + size]))
        continued = part[-1] == 255
        at, used, sequence = at + len(part), used + size, sequence + 1
    return b"".join(out)


def stripped(f: BinaryIO, at: int, least: int) -> tuple[bytes, int, int] | None:
    """For an Ogg Opus or Vorbis file starting at ``at`` in the seekable ``f`` whose header pages
    hold ``least`` bytes or more: the header pages FFmpeg is given instead (tags left out), and
    the start and end of its sound pages in ``f`` (a ``metadata.Spliced`` file's arguments).
    None for any other file, or when its headers cannot be laid out anew. Leaves ``f`` at 0."""
    try:
        return _stripped(f, at, least)
    finally:
        f.seek(0)


def _stripped(f: BinaryIO, at: int, least: int) -> tuple[bytes, int, int] | None:
    end = f.seek(0, 2)
    pos, total, serial, ended = at, 0, None, True
    packets: list[list[tuple[int, int]]] = [[]]  # each packet's pieces: (offset in f, bytes)
    for _ in range(MOST_PAGES):
        f.seek(pos)
        header = f.read(27)
        if len(header) < 27 or header[:4] != b"OggS":
            return None
        granule, page_serial = struct.unpack("<qI", header[6:18])
        if granule > 0:
            break
        if serial is None:
            serial = page_serial
        elif page_serial != serial:
            return None  # several streams
        lacing = f.read(header[26])
        body = pos + 27 + len(lacing)
        for value in lacing:
            if len(packets) != 2:  # the comment header's pieces are not kept: a 100 MB tag has 400,000
                packets[-1].append((body, value))
            body += value
            if value < 255:
                packets.append([])
        if len(packets) > 4:
            return None  # more packets than Opus's two or Vorbis's three headers: not its headers
        ended = lacing[-1] < 255 if lacing else ended
        total += body - pos - 27 - len(lacing)
        pos = body
    else:
        return None
    kept = [packets[0], *packets[2:-1]]
    if serial is None or total < least or not ended or sum(n for p in kept for _, n in p) > MAX_KEPT_BYTES:
        return None  # few tags, a packet that goes on past the headers, or large headers to keep

    def read(pieces: list[tuple[int, int]]) -> bytes:
        runs: list[list[int]] = []  # a packet's pieces, those that follow one another in f joined
        for offset, n in pieces:
            if runs and runs[-1][0] + runs[-1][1] == offset:
                runs[-1][1] += n
            else:
                runs.append([offset, n])
        out = []
        for offset, n in runs:
            f.seek(offset)
            out.append(f.read(n))
        return b"".join(out)

    identification, *setup = (read(p) for p in kept)
    codec = next((c for c in _HEADERS if identification.startswith(c)), None)
    if codec is None or len(packets) - 1 != _HEADERS[codec]:
        return None  # another codec (FLAC, Speex), or packets that are not its headers
    head = pages([identification], serial, 0, flags=2)  # the stream's first page
    return head + pages([_EMPTY[codec], *setup], serial, 1), pos, end
