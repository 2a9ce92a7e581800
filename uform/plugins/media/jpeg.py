"""What a JPEG's segments before its first scan would cost Pillow, read before Pillow opens it.

Pillow's JPEG reader keeps every APPn and COM segment it meets before the scan (its
``applist``), and steps through bytes that are not a segment (fill ``0xFF``, junk) one
read of one byte at a time. Measured on this machine, decoding to ``S = 224``
(``python -m tests.test_media_bombs --unchecked``): a 328 MB JPEG of 5,000 APP3 segments held
+316 MB; 1,000,000 empty APP3 segments (4 MB) +132 MB and 13.6 s; 10 MB of fill bytes took
23.5 s. :func:`scan` walks the same markers as Pillow, seeking over segments and finding
the next ``0xFF`` a block at a time, and :func:`check` refuses a file past a limit below
by name, before Pillow reads a byte of it (docs/media-images.md, "From file to pixels"). In a progressive JPEG the
fill bytes between its scans count too (:func:`fill_after`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from .files import Source

MAX_METADATA_BYTES = 16 << 20  # APPn and COM bytes before the scan (EXIF, ICC, XMP, ...)
MAX_SEGMENTS = 10_000  # segments before the scan, of any kind
MAX_STRAY_BYTES = 1 << 16  # fill (0xFF) and junk bytes between segments, stepped through a byte at a time
# Pillow reads no length after these markers (its table has no handler for them)
_BARE = {0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)}
_BLOCK = 1 << 16
_COUNTED = 1 << 20
_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}  # SOF markers of a picture in several scans
_FILL = re.compile(rb"\xff\xff+")


@dataclass
class Scan:
    """What lies before a JPEG's first scan, as Pillow's reader meets it."""

    metadata: int = 0  # bytes of APPn and COM segments
    segments: int = 0
    stray: int = 0  # fill and junk bytes
    progressive: bool = False


def scan(f: BinaryIO) -> Scan:
    """Walk a JPEG (``f`` seekable, from its start) up to its first scan as Pillow does; stops
    early where Pillow would fail, at the end of the file, or once a limit is passed."""
    found = Scan()
    f.seek(3)  # SOI and the next marker's 0xFF, as Pillow reads them
    ff = True
    while found.segments <= MAX_SEGMENTS and found.metadata <= MAX_METADATA_BYTES and found.stray <= MAX_STRAY_BYTES:
        if not ff:  # junk until the next 0xFF
            block = f.read(_BLOCK)
            if not block:
                return found
            at = block.find(b"\xff")
            found.stray += len(block) if at < 0 else at + 1
            if at >= 0:
                f.seek(at + 1 - len(block), 1)
                ff = True
            continue
        code = f.read(1)
        if not code:
            return found
        c = code[0]
        if c == 0xFF:  # a fill byte: the next one is read as the marker's
            found.stray += 1
            continue
        if c == 0x00:  # an escaped 0xFF: junk
            found.stray += 1
            ff = False
            continue
        if c < 0xC0:
            return found  # Pillow: "no marker found"
        if c not in _BARE:
            size = f.read(2)
            if len(size) < 2 or int.from_bytes(size, "big") < 2:
                return found
            n = int.from_bytes(size, "big") - 2
            found.segments += 1
            found.progressive |= c in _PROGRESSIVE
            if 0xE0 <= c <= 0xEF or c == 0xFE:
                found.metadata += n
            if c == 0xDA:
                return found
            f.seek(n, 1)
        nxt = f.read(1)
        if not nxt:
            return found
        ff = nxt == b"\xff"
        if not ff:
            found.stray += 1
    return found


def fill_after(f: BinaryIO, limit: int) -> int:
    """Fill bytes (``0xFF`` before a marker's) from ``f``'s position up to the end of the
    picture (EOI), or ``0xFF`` bytes all told where those are at most ``limit``: a progressive
    JPEG's fill between its scans, which libjpeg passes as Pillow feeds it, in time that grows
    with their square (10 MB took 4.7 s and +21 MB, 20 MB 15 s). Entropy data holds no
    ``FF FF``. Stops once past ``limit``."""
    start, ff = f.tell(), 0
    while ff <= limit:  # an ordinary file's 0xFF bytes counted, a fast bound
        block = f.read(_COUNTED)
        if not block:
            return ff
        ff += int(np.count_nonzero(np.frombuffer(block, np.uint8) == 0xFF))
    f.seek(start)
    total, carry = 0, b""
    while total <= limit:
        block = f.read(_BLOCK)
        if not block:
            break
        block = carry + block
        end = block.find(b"\xff\xd9")
        if end >= 0:
            block = block[: end + 1]
        total += sum(len(run) - 1 for run in _FILL.findall(block))
        if end >= 0:
            break
        carry = block[-1:] if block.endswith(b"\xff") else b""  # a run across blocks: its last byte begins the next
    return total


def check(source: Source, f: BinaryIO) -> None:
    """Refuse ``source`` (a JPEG read through ``f``) whose segments before its first scan pass a
    limit: Pillow would hold them, or step through them a byte at a time."""
    try:
        found = scan(f)
        if found.progressive:  # every scan is read: count the fill bytes between them too
            found.stray += fill_after(f, MAX_STRAY_BYTES - found.stray)
        f.seek(0)
    except Exception as exc:  # noqa: BLE001 - a read that fails, of a path or of the caller's object
        raise source.fail(f"cannot read the file ({type(exc).__name__}: {exc})") from None
    if found.metadata > MAX_METADATA_BYTES:
        raise source.fail(
            f"its JPEG metadata (APPn and COM segments before the picture) holds over {MAX_METADATA_BYTES} bytes, "
            "the limit of uform.plugins.media.jpeg.MAX_METADATA_BYTES"
        )
    if found.segments > MAX_SEGMENTS:
        raise source.fail(f"it has over {MAX_SEGMENTS} JPEG segments before the picture, the limit of uform.plugins.media.jpeg.MAX_SEGMENTS")
    if found.stray > MAX_STRAY_BYTES:
        raise source.fail(
            f"it has over {MAX_STRAY_BYTES} stray bytes (fill or junk) between its JPEG segments, "
            "the limit of uform.plugins.media.jpeg.MAX_STRAY_BYTES"
        )
