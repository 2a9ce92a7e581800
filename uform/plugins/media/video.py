"""Clips to frames on the host: MP4 (H.264, HEVC) and WebM (VP8, VP9, AV1) files sampled,
each sampled frame decoded, turned upright and fitted to the tower's square.

The rules are docs/media-video.md's. A demux-only pass (:func:`plan`) reads every packet's
presentation time and keyframe flag (no decoding); the ``F`` frames the format names are then
decoded (:func:`pick`), seeking only when the next one lies in a later keyframe group than the
decoder's position, which never decodes more than reading the clip through. The video plugin
(:mod:`uform.plugins.video`) maps :func:`sample` over the executor's threads.
"""

from __future__ import annotations

import io
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from uform.core.errors import InputError

from . import frames, mp4, naflex, upright, webm
from .files import CUT_WHILE_OPENED, Source, falls_short

MAX_FRAME_PIXELS = 40_000_000  # width × height of a frame (8K UHD is 33.2 M)
MAX_SECONDS = 6 * 3600  # span of a clip's presentation times
MAX_PACKETS = 2_000_000  # video packets the demux-only pass reads
MAX_FAILED_PACKETS = 64  # packets in a row that fail to decode (each skipped, as FFmpeg's own tools do) before a clip is refused
MAX_ATTACHED_BYTES = 16 << 20  # a WebM's (Matroska's) attachments, read whole by FFmpeg as it opens the file
CONTAINERS = {"mp4": "mp4", "webm": "matroska"}
_MP4_BOXES = mp4.MP4_FIRST


@dataclass
class Plan:
    """What the demux-only pass found: frame times and keyframe times (stream time base)."""

    times: np.ndarray  # presentation times of every frame, sorted
    keys: np.ndarray  # presentation times of keyframes, sorted
    start: int  # t₀
    span: int  # d
    seconds: float

    def targets(self, count: int) -> np.ndarray:
        """Index into ``times`` of the frame each of ``count`` samples takes: the last frame at or
        before ``t₀ + (i + ½) d / F`` (exact, in integers), the first frame if none is."""
        scaled = 2 * count * (self.times - self.start)
        picks = np.searchsorted(scaled, (2 * np.arange(count) + 1) * self.span, side="right") - 1
        return np.maximum(picks, 0)

    def group(self, pts: int) -> int:
        return int(np.searchsorted(self.keys, pts, side="right")) - 1


@dataclass
class Counters:
    decoded: int = 0
    seeks: int = 0
    skipped: int = 0  # packets that failed to decode: their frames are not shown
    seconds: float = 0.0
    bytes_read: int = 0


class _SeekMissed(Exception):
    """A seek landed after the frame it aimed at: decode from the start instead."""


class _NoFrames(Exception):
    """The decoder produced no frame at all (``args[0]``: packets that failed to decode)."""


def sniff(head: bytes) -> str | None:
    if head.startswith(b"\x1aE\xdf\xa3"):
        return "webm"
    if head[4:8] in _MP4_BOXES:
        return "mp4"
    return None


def video_stream(container: Any, source: Source) -> Any:
    """The clip's video stream: FFmpeg's best (``av_find_best_stream``: one marked default, an MP4's
    enabled track or a Matroska track flagged default, before others), as players, ffmpeg and
    torchcodec take it; a cover picture never (then the first default one, or the first)."""
    streams = [s for s in container.streams.video if not s.disposition & 0x400]  # AV_DISPOSITION_ATTACHED_PIC
    if not container.streams:
        raise source.fail("cannot decode the video: no stream could be read (a truncated or damaged file?)")
    if not streams:
        others = ", ".join(sorted({"cover picture" if s.type == "video" else s.type for s in container.streams}))  # an M4A's album art
        raise source.fail(f"the file has no video stream (streams: {others})")
    best = container.streams.best("video")
    stream = next((s for s in streams if best is not None and s.index == best.index), None)
    stream = stream or next((s for s in streams if s.disposition & 1), streams[0])  # AV_DISPOSITION_DEFAULT
    if stream.codec_context is None:  # FFmpeg demuxes it but has no decoder for its codec
        raise source.fail("the video stream is in a codec this FFmpeg cannot decode")
    frame_size(source, stream.codec_context.width, stream.codec_context.height)
    return stream


def frame_size(source: Source, width: int, height: int) -> None:
    """Refuse frames over ``MAX_FRAME_PIXELS``, as the container or the codec declares them."""
    if width * height > MAX_FRAME_PIXELS:
        raise source.fail(f"frames are {width}x{height}, over the limit of {MAX_FRAME_PIXELS} pixels (uform.plugins.media.video.MAX_FRAME_PIXELS)")


def webm_declared(source: Source, f: BinaryIO) -> tuple[int, int] | None:
    """The largest frame a WebM's (Matroska's) video track declares in its Tracks (None when it
    declares none before its first cluster), once its attachments, which FFmpeg reads whole as
    it opens the file, are found within ``MAX_ATTACHED_BYTES``: InputError naming the item beyond,
    or when more than ``webm.MAX_HEAD_ELEMENTS`` elements come before the first cluster."""
    try:
        found, attached = webm.declared(f)
    except webm.Unwalked:
        raise source.fail(
            f"its Segment has over {webm.MAX_HEAD_ELEMENTS} elements before its first cluster, the limit of "
            "uform.plugins.media.webm.MAX_HEAD_ELEMENTS (FFmpeg would read them all as it opens the file, attachments among them)"
        ) from None
    if attached > MAX_ATTACHED_BYTES:
        raise source.fail(
            f"its attachments hold {attached} bytes, over the limit of {MAX_ATTACHED_BYTES} "
            "(uform.plugins.media.video.MAX_ATTACHED_BYTES) that FFmpeg would read whole"
        )
    return found


def plan(container: Any, stream: Any, source: Source) -> Plan:
    """Demux (never decode) the file: every video frame's presentation time and keyframes,
    and where each stream's packets end, to tell a truncated file (:func:`check_complete`)."""
    times, keys = array("q"), array("q")  # 8 bytes a packet (Python ints in a list, and a dict of durations, took 125)
    top, top_duration = None, 0  # the latest presentation time, and the duration of its (last) packet
    ends: dict[Any, int] = {}  # stream → where its packets end (its time base)
    for packet in container.demux():
        if packet.pts is None or packet.size == 0:
            continue
        if packet.stream is stream and packet.is_keyframe:  # one an edit list cuts still starts its group
            keys.append(packet.pts)
        if packet.is_discard:  # cut by an MP4 edit list: not a frame of the clip
            continue
        if packet.stream is not stream:
            ends[packet.stream] = max(ends.get(packet.stream, packet.pts), packet.pts + (packet.duration or 0))
            continue
        times.append(packet.pts)
        if top is None or packet.pts >= top:
            top, top_duration = packet.pts, packet.duration or 0
        if len(times) > MAX_PACKETS:
            raise source.fail(f"the video stream has over {MAX_PACKETS} frames (uform.plugins.media.video.MAX_PACKETS)")
    if not times:
        raise source.fail("the video stream has no frames")
    order = np.sort(np.asarray(times, np.int64))
    gaps = np.diff(order)
    last = top_duration or (int(np.median(gaps)) if len(gaps) else 1)
    span = int(order[-1] - order[0]) + max(int(last), 1)
    seconds = float(span * stream.time_base)
    if seconds > MAX_SECONDS:
        raise source.fail(f"the clip spans {seconds:.0f} s, over the limit of {MAX_SECONDS} s (uform.plugins.media.video.MAX_SECONDS)")
    ends[stream] = int(order[0]) + span
    check_complete(container, stream, ends, source)
    return Plan(order, np.sort(np.asarray(keys or order[:1], np.int64)), int(order[0]), span, seconds)


def check_complete(container: Any, stream: Any, ends: Mapping[Any, int], source: Source) -> None:
    """Refuse a file whose packets end well before the duration its container declares.

    The video stream's own declared duration (MP4) is compared with where its packets end;
    where it declares none (WebM), the container's duration is compared with where the
    packets of any stream end (a cut file loses the end of every stream). Containers count
    a duration from time 0 or from the first timestamp, so a file is refused only when it
    falls short either way. A file that declares nothing (a live WebM recording) is not judged.
    """
    if stream.duration and stream.time_base:
        declared, start = float(stream.duration * stream.time_base), float((stream.start_time or 0) * stream.time_base)
        end = float(ends[stream] * stream.time_base)
    elif container.duration:
        declared, start = container.duration / 1_000_000, (container.start_time or 0) / 1_000_000
        end = max(float(last * s.time_base) for s, last in ends.items() if s.time_base)
    else:
        return
    ended = max(end, end - start)
    if falls_short(ended, declared):
        raise source.fail(f"is truncated or corrupt: its container declares {declared:.2f} s, its packets end at {max(ended, 0):.2f} s")


def _frames_from(container: Any, stream: Any, seek_to: int | None, c: Counters) -> Iterator[Any]:
    """The stream's frames from the start, or from the keyframe at ``seek_to``.

    A packet that fails to decode (a broken one: a damaged last packet, a bad sector) is skipped
    and counted in ``c.skipped``, as FFmpeg's own tools and players skip it: its frame is not
    shown, the frames after it are. Over ``MAX_FAILED_PACKETS`` in a row, FFmpeg's error is raised.

    A seek may land on an earlier keyframe than the one aimed at: FFmpeg's MP4 seek in a file
    whose edit list starts inside a keyframe group lands a group early, every time. The packets
    before the aimed-at keyframe are then passed over undecoded (the seek flushed the decoder),
    so no frame is decoded again; one that lands later is :func:`pick`'s to find."""
    import av

    if seek_to is not None:
        container.seek(seek_to, stream=stream, backward=True, any_frame=False)
    packets, in_row = container.demux(stream), 0
    for packet in packets if seek_to is None else _from_keyframe(packets, seek_to):
        try:
            frames = packet.decode()
        except av.FFmpegError:
            c.skipped, in_row = c.skipped + 1, in_row + 1
            if in_row > MAX_FAILED_PACKETS:
                raise
            continue
        in_row = 0
        yield from frames


def _from_keyframe(packets: Iterator[Any], pts: int) -> Iterator[Any]:
    """``packets`` from the first keyframe at or after ``pts`` (and the end, which flushes the decoder)."""
    for packet in packets:
        if packet.size == 0 or (packet.is_keyframe and packet.pts is not None and packet.pts >= pts):
            yield packet
            break
    yield from packets


def pick(container: Any, stream: Any, p: Plan, count: int, seeking: bool, keep: Callable[[int, Any], None]) -> Counters:
    """Decode up to the ``count`` sampled frames, calling ``keep(i, frame)`` for each sample in order.

    Frames come out of the decoder in presentation order; sample ``i`` is the last frame at or
    before its target time. With ``seeking``, when the next sample lies in a later keyframe
    group than the frame just decoded, the container seeks to that group's keyframe.
    """
    wanted = p.times[p.targets(count)]
    c = Counters()
    j, prev = 0, None
    first = p.group(int(wanted[0]))
    seek_to: int | None = int(p.keys[first]) if seeking and first > 0 else None
    sought = {first} if seek_to is not None else set()  # each group is sought once: reading on always ends
    while True:
        jump, c.seeks = seek_to is not None, c.seeks + int(seek_to is not None)
        frames, seek_to = _frames_from(container, stream, seek_to, c), None
        for frame in frames:
            c.decoded += 1
            pts = frame.pts if frame.pts is not None else (prev.pts + 1 if prev is not None else p.start)
            if jump and pts > wanted[j]:
                raise _SeekMissed
            jump = False
            while j < count and 2 * count * (pts - p.start) > (2 * j + 1) * p.span:
                keep(j, prev if prev is not None else frame)
                j += 1
            if j == count:
                return c
            prev = frame
            group = p.group(int(wanted[j]))
            if seeking and group > p.group(pts) and group not in sought:
                seek_to = int(p.keys[group])
                sought.add(group)
                break
        if jump:
            raise _SeekMissed  # the seek found no frames
        if seek_to is None:
            break
    if prev is None:
        raise _NoFrames(c.skipped)
    while j < count:
        keep(j, prev)
        j += 1
    return c


def _opener(source: Source) -> tuple[Callable[[], Any], bytes, int]:
    """How to (re)open the clip for PyAV, its first bytes, and its size in bytes."""
    if source.data is None and source.stream is None:
        assert source.path is not None
        path = source.path
        with open(path, "rb") as f:
            head, size = f.read(16), f.seek(0, 2)
        return (lambda: path), head, size
    data = source.data if source.data is not None else source.read_all()
    return (lambda: io.BytesIO(data)), data[:16], len(data)


def frame_pixels(frame: Any, size: int, source: Source, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """One decoded frame as ``uint8 [S, S, 3]``: RGB, turned as its display matrix says, fitted.

    A NaFlex tower's frame is fitted to the grid its own size gives (``[gh·P, gw·P, 3]``); given
    ``shape``, the clip's first sampled frame's, a frame of another size (a stream whose frame size
    changes) is resized to that shape instead, so a clip's frames share one grid."""
    if frame.width * frame.height > MAX_FRAME_PIXELS:
        raise source.fail(f"a frame is {frame.width}x{frame.height}, over the limit of {MAX_FRAME_PIXELS} pixels")
    # libswscale with PyAV's defaults (SWS_BILINEAR): the matrix and range the frame is tagged
    # with; untagged is BT.601, limited range (docs/checkpoint.md, "Video tower")
    rgb = frames.frame_rgb(frame)  # a grey frame given neutral chroma first, so its range tag counts
    rgb = upright.displayed(rgb, upright.display_matrix(frame))  # turned and mirrored as FFmpeg's autorotation
    image = frames.from_array(rgb)
    if shape is not None and isinstance(size, frames.Fit) and size.resize == "naflex":
        rows, columns = naflex.grid_for(image.height, image.width, size.patch, size.max_patches)
        if (rows * size.patch, columns * size.patch) != shape[:2]:  # straight to the clip's grid, not first to its own
            return np.ascontiguousarray(naflex.resize_to(image, shape[0], shape[1], size.interpolation == "bicubic"))
    return frames.fit(image, size)


def sample(source: Source, count: int, size: int, seeking: bool = True) -> tuple[np.ndarray, Counters]:
    """``uint8 [count, size, size, 3]`` of one clip (a tower's ``F`` frames of ``S × S``; a NaFlex
    tower's ``[count, gh·P, gw·P, 3]``, the grid of the first sampled frame's size), and what
    decoding it cost."""
    import av

    try:
        opener, head, nbytes = _opener(source)
    except OSError as exc:
        raise source.fail(f"cannot read the file ({exc})") from None
    kind = sniff(head)
    if kind is None:
        raise source.fail(f"not an MP4 or WebM file (first bytes {head[:8].hex(' ')})" if head else "the file is empty")
    target = opener()
    with open(target, "rb") if isinstance(target, str) else target as f:  # before FFmpeg's probe decodes a frame
        if kind == "mp4":
            frame_size(source, *mp4.check(source, f) or (0, 0))
        else:
            frame_size(source, *webm_declared(source, f) or (0, 0))
    held: list[np.ndarray] = []  # the clip's [count, ...] once its first sampled frame is fitted
    last: list[Any] = [None]

    def keep(i: int, frame: Any) -> None:
        if last[0] is not frame:
            fitted = frame_pixels(frame, size, source, held[0].shape[1:] if held else None)
            if not held:
                held.append(np.empty((count, *fitted.shape), np.uint8))
            held[0][i] = fitted
            last[0] = frame
        else:
            held[0][i] = held[0][i - 1]

    try:
        with av.open(opener(), format=CONTAINERS[kind], metadata_errors="replace") as container:
            index = video_stream(container, source).index
            p = plan(container, container.streams[index], source)
        for attempt in ((True, False) if seeking else (False,)):
            with av.open(opener(), format=CONTAINERS[kind], metadata_errors="replace") as container:
                try:
                    c = pick(container, container.streams[index], p, count, attempt, keep)
                    break
                except _SeekMissed:
                    last[0] = None
    except InputError:
        raise
    except _NoFrames as none:
        raise source.fail("the video stream has no decodable frames" + (f" ({none.args[0]} packets failed to decode)" if none.args[0] else "")) from None
    except av.error.EOFError:  # FFmpeg met the end of the file while reading its container
        raise source.fail(CUT_WHILE_OPENED) from None
    except av.FFmpegError as exc:  # its own words, without the errno and PyAV's '<none>' file name
        raise source.fail(f"cannot decode the video: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever FFmpeg says, it is this item's fault
        raise source.fail(f"cannot decode the video: {type(exc).__name__}: {exc}") from None
    c.seconds, c.bytes_read = p.seconds, nbytes
    return held[0], c
