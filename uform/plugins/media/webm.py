"""The frame size a WebM (Matroska) declares, read from its ``Tracks`` before FFmpeg opens it.

FFmpeg's probe (``avformat_find_stream_info``) decodes a video stream's first frames as it
opens a file, so a clip of huge frames cost the probe before uform saw the frame size:
``python -m tests.test_media_bombs --unchecked`` (docs/media.md, "Video"). :func:`declared`
walks the EBML elements of the ``Segment``, seeking over each, reads each video track's
``PixelWidth`` and ``PixelHeight``, and sums the ``Attachments``, which FFmpeg reads whole
(a 100 MB attachment took +384 MB of peak RSS and 2.5 s to be passed over).
"""

from __future__ import annotations

from typing import BinaryIO

MAX_TRACKS_BYTES = 1 << 20  # a Tracks element read whole; a larger one is not read
MAX_ELEMENTS = 1 << 17  # a segment's elements walked (clusters, mostly: 36 hours of 1 s clusters)
_SEGMENT, _TRACKS, _ATTACHMENTS = 0x18538067, 0x1654AE6B, 0x1941A469
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
    its Tracks cannot be read (:func:`declared`)."""
    return declared(f)[0]


def declared(f: BinaryIO) -> tuple[tuple[int, int] | None, int]:
    """The WebM ``f``'s (seekable) largest declared frame, as :func:`declared_frame`, and the bytes
    of its ``Attachments``, which FFmpeg reads whole: the elements of its ``Segment`` are walked,
    clusters seeked over, up to ``MAX_ELEMENTS`` or one of unknown size."""
    frame, attached = None, 0
    try:
        end = f.seek(0, 2)
        at = 0
        for _ in range(MAX_ELEMENTS):
            f.seek(at)
            head = f.read(16)
            if len(head) < 2:
                break
            ident, size, body = _element(head, 0)
            if ident == _SEGMENT:
                at += body  # into the segment: its children follow
                continue
            if size is None:
                break
            if ident == _ATTACHMENTS:
                attached += size
            if ident == _TRACKS and frame is None and size <= MAX_TRACKS_BYTES:
                f.seek(at + body)
                frame = _tracks(f.read(size))
            at += body + size
            if at >= end:
                break
    except ValueError:
        pass
    f.seek(0)
    return frame, attached
