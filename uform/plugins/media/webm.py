"""The frame size a WebM (Matroska) declares, read from its ``Tracks`` before FFmpeg opens it.

FFmpeg's probe (``avformat_find_stream_info``) decodes a video stream's first frames as it
opens a file, so a clip of huge frames cost the probe before uform saw the frame size:
``python -m tests.test_media_bombs --unchecked`` (docs/media-video.md, "Limits"). :func:`declared`
walks the EBML elements of the ``Segment``, seeking over each, reads each video track's
``PixelWidth`` and ``PixelHeight`` (a ``Tracks`` over ``MAX_TRACKS_BYTES`` walked too, only
its ``Video`` elements read), and sums the ``Attachments``, which FFmpeg reads whole (a 100 MB
attachment took +384 MB of peak RSS and 2.5 s to be passed over), those the walk meets and
those a ``SeekHead`` points to, as FFmpeg finds them wherever they lie. FFmpeg reads every
element before the first ``Cluster`` as it opens the file: more than ``MAX_HEAD_ELEMENTS`` of
them is :class:`Unwalked` (140,000 two-byte Void elements, then a 100 MB
attachment nothing points to, cost +386 MB of peak RSS unseen); attachments after the first
cluster that no ``SeekHead`` points to FFmpeg never reads (+6 MB for 100 MB of them). An
element of unknown size other than a ``Cluster`` is walked into, as FFmpeg reads it (an ``Info``
so made hid what came after it: a 100 MB attachment behind it cost +383 MB of peak RSS).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

MAX_TRACKS_BYTES = 1 << 20  # a Tracks (or SeekHead) element read whole; a larger Tracks is walked
MAX_ELEMENTS = 1 << 17  # a segment's elements walked (clusters, mostly: 36 hours of 1 s clusters)
MAX_HEAD_ELEMENTS = 1 << 17  # elements before the first Cluster, which FFmpeg reads as it opens the file; more is refused
MAX_SEEK_HEADS = 16  # SeekHead elements read (FFmpeg follows one that points to another)
_SEGMENT, _TRACKS, _ATTACHMENTS, _CLUSTER = 0x18538067, 0x1654AE6B, 0x1941A469, 0x1F43B675
_SEEK_HEAD, _SEEK, _SEEK_ID, _SEEK_POSITION = 0x114D9B74, 0x4DBB, 0x53AB, 0x53AC
_TRACK_ENTRY, _VIDEO, _WIDTH, _HEIGHT = 0xAE, 0xE0, 0xB0, 0xBA
# the Segment's children (SeekHead, Info, Tracks, Cues, Chapters, Tags, Attachments, Cluster): one ends any of them of unknown size
_LEVEL1 = frozenset({_SEEK_HEAD, 0x1549A966, _TRACKS, 0x1C53BB6B, 0x1043A770, 0x1254C367, _ATTACHMENTS, _CLUSTER})


class Unwalked(Exception):
    """A Segment has more than ``MAX_HEAD_ELEMENTS`` elements before its first Cluster: what
    FFmpeg reads as it opens the file was not all seen."""


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


def _larger(best: tuple[int, int] | None, other: tuple[int, int] | None) -> tuple[int, int] | None:
    return other if best is None or (other is not None and other[0] * other[1] > best[0] * best[1]) else best


def _video(data: bytes) -> tuple[int, int]:
    """A ``Video`` element's body: its ``PixelWidth`` and ``PixelHeight`` (0 where missing)."""
    fields = dict(_children(data))
    w, h = (int.from_bytes(fields.get(k, b""), "big") for k in (_WIDTH, _HEIGHT))
    return w, h


def _tracks(data: bytes) -> tuple[int, int] | None:
    best = None
    for ident, entry in _children(data):
        if ident != _TRACK_ENTRY:
            continue
        for sub, video in _children(entry):
            if sub == _VIDEO:
                best = _larger(best, _video(video))
    return best


def _headers(f: BinaryIO, start: int, stop: int, budget: list[int], enter: bool = False) -> Iterator[tuple[int, int | None, int]]:
    """The headers of the elements from ``start`` to ``stop`` in ``f``, read and seeked over
    (ID, size or None, where the body starts), each one taken from ``budget[0]``. One of unknown
    size ends the walk, or, with ``enter``, is walked into: its children are the next headers."""
    at = start
    while at < stop and budget[0] > 0:
        budget[0] -= 1
        f.seek(at)
        head = f.read(16)
        if len(head) < 2:
            return
        ident, size, body = _element(head, 0)
        yield ident, size, at + body
        if size is None and not enter:
            return
        at += body + (size or 0)


def _read(f: BinaryIO, at: int, size: int) -> bytes:
    f.seek(at)
    return f.read(size)


def _tracks_walked(f: BinaryIO, start: int, size: int, budget: list[int]) -> tuple[int, int] | None:
    """:func:`_tracks` of a Tracks element too large to read whole (a huge ``CodecPrivate``):
    its entries walked, only their ``Video`` elements read."""
    best = None
    for ident, entry, at in _headers(f, start, start + size, budget):
        if ident == _TRACK_ENTRY and entry is not None:
            best = _larger(best, _entry(f, at, entry, budget))
    return best


def _entry(f: BinaryIO, start: int, size: int, budget: list[int]) -> tuple[int, int] | None:
    """A ``TrackEntry``'s (its body at ``start``) largest frame: its children walked, its ``Video`` elements read."""
    best = None
    for ident, video, inside in _headers(f, start, start + size, budget):
        if ident == _VIDEO and video is not None and video <= MAX_TRACKS_BYTES:
            best = _larger(best, _video(_read(f, inside, video)))
    return best


def _opened_tracks(f: BinaryIO, ident: int, size: int | None, body: int, sizes: list[list[int]], budget: list[int]) -> tuple[int, int] | None:
    """The frame an element met inside a ``Tracks`` of unknown size declares: a ``TrackEntry`` or a
    ``Video`` read, or, for a ``Video`` of unknown size (``sizes`` gets a ``[width, height]`` for
    each), the ``PixelWidth`` or ``PixelHeight`` that follow it."""
    if ident == _TRACK_ENTRY and size is not None:
        return _entry(f, body, size, budget)
    if ident == _VIDEO and size is None:
        sizes.append([0, 0])
    elif ident == _VIDEO and size is not None and size <= MAX_TRACKS_BYTES:
        return _video(_read(f, body, size))
    elif ident in (_WIDTH, _HEIGHT) and sizes and size is not None and size <= 8:
        sizes[-1][ident == _HEIGHT] = int.from_bytes(_read(f, body, size), "big")
        return sizes[-1][0], sizes[-1][1]
    return None


def _pointed(seek_head: bytes, one: bool = False) -> list[tuple[int, int]]:
    """A SeekHead's entries (``one``: one Seek's body): (element ID, position in the segment's body)."""
    out = []
    for ident, seek in [(_SEEK, seek_head)] if one else _children(seek_head):
        if ident == _SEEK:
            fields = dict(_children(seek))
            out.append((int.from_bytes(fields.get(_SEEK_ID, b""), "big"), int.from_bytes(fields.get(_SEEK_POSITION, b""), "big")))
    return out


def declared_frame(f: BinaryIO) -> tuple[int, int] | None:
    """The largest (width, height) a video track of the WebM ``f`` (seekable) declares; None when
    its Tracks cannot be read (:func:`declared`)."""
    return declared(f)[0]


def declared(f: BinaryIO) -> tuple[tuple[int, int] | None, int]:
    """The WebM ``f``'s (seekable) largest declared frame, as :func:`declared_frame`, and the bytes
    of its ``Attachments``, which FFmpeg reads whole: the elements of its ``Segment`` are walked,
    clusters seeked over, up to ``MAX_ELEMENTS`` or a Cluster of unknown size, and the Attachments
    its ``SeekHead`` elements point to (FFmpeg's way to them wherever they lie) counted too.
    Another element of unknown size (a ``Tracks``, ``Info``, ``SeekHead``…, and inside a
    ``Tracks`` a ``TrackEntry`` or ``Video``) is walked into, as FFmpeg reads it: it ends where an
    element of the Segment's own begins. :class:`Unwalked` past ``MAX_HEAD_ELEMENTS`` elements
    before the first Cluster."""
    found: dict[int, int] = {}  # the Attachments found: where their bodies start, their sizes
    heads: list[tuple[int, int | None]] = []  # SeekHeads to read: where their bodies start, their sizes
    seeks: list[tuple[int, int]] = []  # the Seek entries of SeekHeads of unknown size: (element ID, position)
    frame, segment, end = None, 0, f.seek(0, 2)
    head, after = 0, 0  # elements walked before the first Cluster (-1 once it is reached); where the next one starts
    opened = 0  # the Segment's child of unknown size walked into (0: none), whose children come next
    sizes: list[list[int]] = []  # [width, height] of each Video of unknown size in a Tracks walked into

    def attachments(body: int, size: int | None) -> None:
        found[body] = end - body if size is None else size  # one of unknown size is read to the end

    try:
        for ident, size, body in _headers(f, 0, end, [2]):  # the EBML header, then the Segment
            if ident == _SEGMENT:
                segment = body
        budget = [MAX_ELEMENTS if segment else 0]
        for ident, size, body in _headers(f, segment, end, budget, enter=True):
            head = -1 if head < 0 or ident == _CLUSTER else head + 1
            after = body + (size or 0)
            opened = (ident if size is None else 0) if ident in _LEVEL1 else opened
            if ident == _ATTACHMENTS:
                attachments(body, size)
                if size is None:
                    break  # counted to the end
            elif ident == _CLUSTER and size is None:
                break
            elif ident == _SEEK_HEAD and size is not None:
                heads.append((body, size))
            elif ident == _SEEK and opened == _SEEK_HEAD and size is not None and size <= MAX_TRACKS_BYTES:
                seeks += _pointed(_read(f, body, size), one=True)
            elif ident == _TRACKS and size is not None and frame is None:
                frame = _tracks(_read(f, body, size)) if size <= MAX_TRACKS_BYTES else _tracks_walked(f, body, size, budget)
            elif opened == _TRACKS:  # its TrackEntry, Video, PixelWidth, PixelHeight, which may be of unknown size too
                frame = _larger(frame, _opened_tracks(f, ident, size, body, sizes, budget))
            if head >= MAX_HEAD_ELEMENTS:
                break
        if head >= MAX_HEAD_ELEMENTS and any(ident != _CLUSTER for ident, _, _ in _headers(f, after, end, [1])):
            f.seek(0)
            raise Unwalked  # the next element is no Cluster either: FFmpeg reads on
    except ValueError:
        pass  # a cut or broken element: FFmpeg judges the file
    walked: set[int] = set()
    while seeks or (heads and len(walked) < MAX_SEEK_HEADS):  # FFmpeg's way to level-1 elements wherever they lie
        try:
            if not seeks:
                at, size = heads.pop()
                if at in walked or size is None or size > MAX_TRACKS_BYTES:
                    continue
                walked.add(at)
                seeks = _pointed(_read(f, at, size))
            for pointed, position in seeks:
                for ident, size, body in _headers(f, segment + position, end, [1] if pointed in (_ATTACHMENTS, _SEEK_HEAD) else [0]):
                    if ident == _ATTACHMENTS and body not in found:
                        attachments(body, size)
                    elif ident == _SEEK_HEAD:
                        heads.append((body, size))  # a SeekHead pointing to another
        except ValueError:
            pass
        seeks = []
    f.seek(0)
    return frame, sum(found.values())
