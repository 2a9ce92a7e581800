"""The frame size a WebM (Matroska) declares, read from its ``Tracks`` before FFmpeg opens it.

FFmpeg's probe (``avformat_find_stream_info``) decodes a video stream's first frames as it
opens a file, so a clip of huge frames cost the probe before uform saw the frame size:
``python -m tests.test_media_bombs --unchecked`` (docs/media.md, "Video"). :func:`declared_frame`
walks the EBML elements of the ``Segment`` up to its first ``Cluster``, seeking over every
other element, and reads each video track's ``PixelWidth`` and ``PixelHeight``.
"""

from __future__ import annotations

from typing import BinaryIO

MAX_TRACKS_BYTES = 1 << 20  # a Tracks element read whole; a larger one is not read
_MAX_ELEMENTS = 10_000  # top-level elements walked before the first cluster
_SEGMENT, _TRACKS, _CLUSTER = 0x18538067, 0x1654AE6B, 0x1F43B675
_TRACK_ENTRY, _VIDEO, _WIDTH, _HEIGHT = 0xAE, 0xE0, 0xB0, 0xBA


def _vint(data: bytes, at: int, keep_marker: bool) -> tuple[int | None, int]:
    """An EBML variable-length integer at ``at``: its value (None for an unknown size) and length."""
    if at >= len(data) or data[at] == 0:
        raise ValueError("not an EBML number")
    length = 9 - data[at].bit_length()
    if at + length > len(data):
        raise ValueError("cut")
    value = int.from_bytes(data[at : at + length], "big")
    if keep_marker:
        return value, length
    value &= (1 << (7 * length)) - 1
    return (None if value == (1 << (7 * length)) - 1 else value), length


def _element(data: bytes, at: int) -> tuple[int, int | None, int]:
    """An element header at ``at``: its ID, its size (None: unknown) and where its body starts."""
    ident, n = _vint(data, at, keep_marker=True)
    size, m = _vint(data, at + n, keep_marker=False)
    return ident or 0, size, at + n + m


def _children(data: bytes) -> list[tuple[int, bytes]]:
    out, at = [], 0
    while at < len(data):
        ident, size, body = _element(data, at)
        end = len(data) if size is None else body + size
        out.append((ident, data[body:end]))
        at = end
    return out


def _tracks(data: bytes) -> tuple[int, int] | None:
    best = None
    for ident, entry in _children(data):
        if ident != _TRACK_ENTRY:
            continue
        for sub, video in _children(entry):
            if sub == _VIDEO:
                fields = dict(_children(video))
                w, h = (int.from_bytes(fields.get(k, b""), "big") for k in (_WIDTH, _HEIGHT))
                if best is None or w * h > best[0] * best[1]:
                    best = (w, h)
    return best


def declared_frame(f: BinaryIO) -> tuple[int, int] | None:
    """The largest (width, height) a video track of the WebM ``f`` (seekable) declares; None when
    the file does not say so before its first cluster, or cannot be read this far."""
    try:
        end = f.seek(0, 2)
        f.seek(0)
        at = 0
        for _ in range(_MAX_ELEMENTS):
            f.seek(at)
            head = f.read(16)
            if len(head) < 2:
                return None
            ident, size, body = _element(head, 0)
            if ident == _SEGMENT:
                at += body  # into the segment: its children follow
                continue
            if ident == _CLUSTER or size is None:
                return None
            if ident == _TRACKS:
                if size > MAX_TRACKS_BYTES:
                    return None
                f.seek(at + body)
                return _tracks(f.read(size))
            at += body + size
            if at >= end:
                return None
    except ValueError:
        return None
    return None
