"""ID3v2 tags at the start of a recording, passed over before FFmpeg opens it.

FFmpeg reads a leading ID3v2 tag whole as it opens a file, text frames converted to UTF-8
and PyAV's metadata dict beside them: an MP3 with a 100 MB ``TXXX`` frame took 290 MB of
peak RSS to decode (docs/media-audio.md, "From file to window"). No tag is needed for a window, so the audio
reader hands FFmpeg the file from where its leading tags end (:class:`After`), or, for a
file object that cannot seek, reads the tags through and drops them (:class:`Dropped`).
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO

HEADER = 10  # "ID3", version (2), flags, size (4 bytes of 7 bits)
_PIECE = 1 << 20  # bytes of a one-way stream's tag read (and dropped) at a time


def tag_size(header: bytes) -> int:
    """Bytes of the ID3v2 tag whose header ``header`` is (footer included), 0 if it is none."""
    if len(header) < HEADER or header[:3] != b"ID3" or header[3] == 0xFF or header[4] == 0xFF:
        return 0
    if any(b & 0x80 for b in header[6:10]):
        return 0  # not a synchsafe size: FFmpeg does not take it for a tag either
    size = int.from_bytes(bytes(header[6:10]), "big")
    size = (size & 0x7F) | (size >> 8 & 0x7F) << 7 | (size >> 16 & 0x7F) << 14 | (size >> 24 & 0x7F) << 21
    return HEADER + size + (HEADER if header[5] & 0x10 else 0)


def tags_end(f: BinaryIO) -> int:
    """Where the ID3v2 tags a seekable ``f`` starts with end (tags may follow one another)."""
    end, start = f.seek(0, 2), 0
    while True:
        f.seek(start)
        size = tag_size(f.read(HEADER))
        if not size or start + size > end:
            f.seek(0)
            return start
        start += size


class After(io.RawIOBase):
    """A seekable file object seen from ``start`` on: offsets, size and reads begin there."""

    def __init__(self, inner: BinaryIO, start: int) -> None:
        super().__init__()
        self.inner, self.start = inner, start
        inner.seek(start)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            offset += self.start
        return self.inner.seek(offset, whence) - self.start

    def tell(self) -> int:
        return self.inner.tell() - self.start

    def read(self, size: int | None = -1) -> bytes:
        return self.inner.read(-1 if size is None else size)


class Dropped:
    """A file object that cannot seek, read from where its leading ID3v2 tags end; the tags are
    read through a piece at a time and dropped, never held."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.pending, self.started = inner, b"", False

    def _exactly(self, n: int) -> bytes:
        parts, left = [], n
        while left > 0:
            part = self.inner.read(min(left, _PIECE))
            if not part:
                break
            parts.append(bytes(part))
            left -= len(part)
        return b"".join(parts)

    def _start(self) -> None:
        self.started = True
        while True:
            header = self._exactly(HEADER)
            size = tag_size(header)
            if not size:
                self.pending = header
                return
            left = size - HEADER
            while left > 0:
                part = self.inner.read(min(left, _PIECE))
                if not part:
                    return  # the file ends inside its tag: FFmpeg sees an empty file
                left -= len(part)

    def read(self, n: int = -1) -> bytes:
        if not self.started:
            self._start()
        if self.pending:
            out, self.pending = (self.pending, b"") if n < 0 or n >= len(self.pending) else (self.pending[:n], self.pending[n:])
            return out
        return bytes(self.inner.read(n))
