"""A FLAC's or WAV's metadata left out of what FFmpeg reads: the headers it needs, then the sound.

FFmpeg reads a container's tags and pictures whole as it opens a file, and holds them two or
three times over (its dictionary, PyAV's): measured (``python -m tests.test_media_bombs
--unchecked``) a WAV with a 50 MB ``LIST`` chunk took +146 MB of peak RSS, a FLAC with a
16 MB ``VORBIS_COMMENT`` +50 MB, one with six 16 MB ``PICTURE`` blocks +97 MB. No tag is
needed for a window, so :func:`stripped` finds where a FLAC's metadata blocks or a WAV's
chunks lie (seeking over them, never reading them) and the audio reader hands FFmpeg a
:class:`Spliced` file: the header blocks it needs (FLAC: ``STREAMINFO``, ``SEEKTABLE``; WAV:
``fmt ``, ``fact`` and the ``data`` header), then the sound, and nothing after a WAV's data.
An Ogg Opus or Vorbis file's tags are left out by ogg.py; any other Ogg file's header pages
are only counted (:func:`ogg_header_bytes`; a 20 MB ``OpusTags`` packet took +80 MB): past
``MAX_OGG_HEADER_BYTES`` the file is refused.
"""

from __future__ import annotations

import io
from typing import BinaryIO

_FLAC_KEPT = (0, 3)  # STREAMINFO, SEEKTABLE
_WAV_KEPT = (b"fmt ", b"fact")
MAX_BLOCKS = 1 << 16  # metadata blocks or chunks before the sound; a file with more is refused
MAX_OGG_HEADER_BYTES = 16 << 20  # an Ogg file's header packets (tags, a cover picture), which FFmpeg reads whole
MAX_OGG_HEADER_PAGES = 1 << 16  # an Ogg file's pages before its sound (16 MiB of headers span 258); a file with more is refused
# Metadata bytes a file must hold for it to be left out: below this FFmpeg is given the file as
# it is (it holds the tags ~3 times over: a few MB at most). A Spliced file is read through
# Python calls; ordinary files (FFmpeg's own WAV, 34 bytes of LIST chunk; its FLAC, an encoder
# tag and 8 KB of padding) cost 1-3 % more CPU to decode through one
# (python benchmarks/media_preread.py; docs/media-audio.md, "From file to window").
SPLICE_FROM = 1 << 20


class Spliced(io.RawIOBase):
    """``prefix`` followed by bytes ``start`` to ``end`` of the seekable ``inner``, as one file."""

    def __init__(self, inner: BinaryIO, prefix: bytes, start: int, end: int) -> None:
        super().__init__()
        self.inner, self.prefix, self.start, self.end = inner, prefix, start, end
        self.size, self.at = len(prefix) + end - start, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.at, io.SEEK_END: self.size}[whence]
        self.at = max(0, base + offset)
        return self.at

    def tell(self) -> int:
        return self.at

    def read(self, size: int | None = -1) -> bytes:
        n = self.size - self.at if size is None or size < 0 else max(0, min(size, self.size - self.at))
        out = b""
        if self.at < len(self.prefix):
            out = self.prefix[self.at : self.at + n]
        if len(out) < n:
            self.inner.seek(self.start + self.at + len(out) - len(self.prefix))
            out += self.inner.read(n - len(out))
        self.at += len(out)
        return out


def _too_many() -> str:
    return f"it has over {MAX_BLOCKS} metadata blocks or chunks before its sound, the limit of uform.plugins.media.metadata.MAX_BLOCKS"


def _flac(f: BinaryIO, at: int) -> tuple[bytes, int, int] | None:
    end = f.seek(0, 2)
    pos, dropped = at + 4, False
    kept: list[bytes] = []
    for _ in range(MAX_BLOCKS):
        f.seek(pos)
        header = f.read(4)
        if len(header) < 4:
            return None
        kind, size = header[0] & 0x7F, int.from_bytes(header[1:4], "big")
        if kind in _FLAC_KEPT:
            kept.append(bytes([kind]) + header[1:4] + f.read(size))
        else:
            dropped = True
        pos += 4 + size
        if header[0] & 0x80:
            break
    else:
        raise ValueError(_too_many())
    if not dropped or not kept or pos > end:
        return None
    kept[-1] = bytes([kept[-1][0] | 0x80]) + kept[-1][1:]
    return b"fLaC" + b"".join(kept), pos, end


def _wav(f: BinaryIO, at: int) -> tuple[bytes, int, int] | None:
    end = f.seek(0, 2)
    pos, dropped = at + 12, False
    kept: list[bytes] = []
    for _ in range(MAX_BLOCKS):
        f.seek(pos)
        header = f.read(8)
        if len(header) < 8:
            return None
        kind, size = header[:4], int.from_bytes(header[4:8], "little")
        if kind == b"data":
            if not dropped and pos + 8 + size >= end:
                return None  # nothing to leave out
            stop = min(end, pos + 8 + size + (size & 1)) if size not in (0, 0xFFFFFFFF) else end
            body = b"WAVE" + b"".join(kept) + header
            return b"RIFF" + (len(body) + stop - pos - 8).to_bytes(4, "little") + body, pos + 8, stop
        if kind in _WAV_KEPT:
            if size > 1 << 16:
                return None
            kept.append(header + f.read(size + (size & 1)))
        else:
            dropped = True
        pos += 8 + size + (size & 1)
    raise ValueError(_too_many())


def ogg_header_bytes(f: BinaryIO, at: int) -> int:
    """Bytes of an Ogg file's (starting at ``at``) pages before its first page of sound (the
    first with a granule position past 0): its header packets, tags included, which FFmpeg
    reads whole; 0 for a file that is not Ogg. Stops once past ``MAX_OGG_HEADER_BYTES``.
    ValueError (its reason) past ``MAX_OGG_HEADER_PAGES`` pages: empty pages add no bytes,
    and a million of them (27 MB) took this walk 1 s and FFmpeg 2 s more, a 1 GB file 37 times that."""
    pos, total = at, 0
    try:
        for _ in range(MAX_OGG_HEADER_PAGES + 1):
            if total > MAX_OGG_HEADER_BYTES:
                return total
            f.seek(pos)
            header = f.read(27)
            if len(header) < 27 or header[:4] != b"OggS":
                return total
            lacing = f.read(header[26])
            body = sum(lacing)
            if int.from_bytes(header[6:14], "little", signed=True) > 0:
                return total
            total += body
            pos += 27 + len(lacing) + body
        raise ValueError(f"its Ogg headers span over {MAX_OGG_HEADER_PAGES} pages before its sound, "
                         "the limit of uform.plugins.media.metadata.MAX_OGG_HEADER_PAGES")  # fmt: skip
    finally:
        f.seek(0)


def stripped(f: BinaryIO, at: int) -> tuple[bytes, int, int] | None:
    """For a FLAC or a plain RIFF WAV starting at ``at`` in the seekable ``f``, with metadata to
    leave out: the header bytes FFmpeg needs, and the start and end of the sound in ``f``
    (a :class:`Spliced` file's arguments); None for any other file, or one with under
    ``SPLICE_FROM`` bytes of it.
    ValueError (its reason) for one with over ``MAX_BLOCKS`` blocks or chunks before the sound."""
    f.seek(at)
    head = f.read(12)
    found = None
    if head[:4] == b"fLaC":
        found = _flac(f, at)
    elif head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        found = _wav(f, at)
    end = f.seek(0, 2)
    f.seek(0)
    if found is not None and end - at - len(found[0]) - (found[2] - found[1]) < SPLICE_FROM:
        return None
    return found
