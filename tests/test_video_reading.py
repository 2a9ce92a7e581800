"""What video_encode sees of good clips, against PyAV decoding every frame: edit lists that cut
into a keyframe group, grey (4:0:0) frames and their range, a phone's display matrix."""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import Any

import av
import numpy as np
import pytest
from media import clip, level_index, pattern
from PIL import Image

from uform.plugins.media import files as sources
from uform.plugins.media import frames as frames_module
from uform.plugins.media import video as clips_module

F, S = 4, 32


def sampled(data: bytes, seeking: bool = True, count: int = F) -> tuple[list[int], np.ndarray, clips_module.Counters]:
    frames, counters = clips_module.sample(sources.Source(0, None, data=data), count, S, seeking)
    return [level_index(f) for f in frames], frames, counters


def shown(data: bytes) -> list[int]:
    """The frames a player shows: PyAV decoding every one (edit lists applied by FFmpeg)."""
    with av.open(io.BytesIO(data)) as container:
        return [level_index(frame.to_ndarray(format="rgb24")) for frame in container.decode(video=0)]


def trimmed(data: bytes, cut: int, fps: int = 30) -> bytes:
    """The MP4 with its edit list moved on by ``cut`` frames, as ``ffmpeg -ss … -c copy`` writes
    one: the frames before are still stored, the group's keyframe among them, but not shown."""
    out = bytearray(data)
    mdhd, elst = out.find(b"mdhd"), out.find(b"elst")
    assert out[mdhd + 4] == 0 and out[elst + 4] == 0 and struct.unpack(">I", out[elst + 8 : elst + 12])[0] == 1
    timescale = struct.unpack(">I", out[mdhd + 16 : mdhd + 20])[0]
    duration, media_time = struct.unpack(">Ii", out[elst + 12 : elst + 20])
    frames = round(duration * fps / 1000)  # PyAV's MP4 muxer: a movie time scale of 1000
    out[elst + 12 : elst + 20] = struct.pack(">Ii", duration * (frames - cut) // frames, media_time + cut * timescale // fps)
    return bytes(out)


def test_an_edit_list_that_cuts_into_a_keyframe_group_is_sampled_from_the_frames_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    # 30 frames, one keyframe (frame 0); the edit list starts at frame 6: a player shows frames
    # 6…29, so d = 24 frames and the samples are shown frames 3, 9, 15, 21, stored 9, 15, 21, 27.
    # The old plan left the cut keyframe out of the groups, so the shown frames before the next
    # keyframe were in no group: each sought the group's keyframe, landed on them, and sought again.
    data = trimmed(clip(frames=30, gop=30), 6)
    assert shown(data) == list(range(6, 30))
    reads = []
    frames_from = clips_module._frames_from

    def counted(container: Any, stream: Any, seek_to: int | None) -> Iterator[Any]:
        reads.append(seek_to)
        if len(reads) > 20:
            raise AssertionError(f"sought without end: {reads[:8]} …")
        return frames_from(container, stream, seek_to)

    monkeypatch.setattr(clips_module, "_frames_from", counted)
    picks, frames, counters = sampled(data)
    assert picks == [9, 15, 21, 27] and counters.seeks == 0 and reads == [None]
    assert sampled(data, seeking=False)[0] == picks
    # with a keyframe every 5 frames, each group sought once at most, the same frames
    grouped = trimmed(clip(frames=30, gop=5), 7)
    assert shown(grouped) == list(range(7, 30))
    reads.clear()
    picks, _, counters = sampled(grouped)
    assert counters.seeks <= 3 and len(reads) == counters.seeks + 1 and len(set(reads)) == len(reads)
    assert picks == sampled(grouped, seeking=False)[0] == [9, 15, 21, 27]  # shown 2, 8, 14, 20 of 23 (targets 2.875, 8.625, …)


def grey_clip(codec: str, fmt: str, level: int, colour_range: int | None = None, size: tuple[int, int] = (32, 32), bits: int = 8) -> bytes:
    """Three flat grey (4:0:0) frames at ``level`` (8-bit scale) stored in ``bits``; ``colour_range``
    1 (limited) or 2 (full) tagged, None untagged."""
    width, height = size
    pix_fmt = "gray" if bits == 8 else f"gray{bits}le"
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if codec == "libx265":
            stream.codec_context.options = {"x265-params": "log-level=none"}
        if colour_range is not None:
            stream.codec_context.color_range = colour_range
        for i in range(3):
            frame = av.VideoFrame(width, height, pix_fmt)
            dtype = np.uint8 if bits == 8 else np.dtype("<u2")
            frame.planes[0].update(np.full(frame.planes[0].buffer_size // np.dtype(dtype).itemsize, level << (bits - 8), dtype).tobytes())
            if colour_range is not None:
                frame.color_range = colour_range
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def grey_levels(data: bytes) -> list[int]:
    _, frames, _ = sampled(data, count=1)
    assert (frames == frames[0, 0, 0, 0]).all()  # flat, and R = G = B
    return [int(frames[0, 0, 0, 0])]


EXACT = [0.0, (100 - 16) * 255 / 219, 255.0]  # limited-range Y = 16, 100, 235 as RGB: 0, 97.8, 255


def near_exact(levels: list[int]) -> bool:
    """Within libswscale's rounding (its SIMD paths differ from its C path by a level)."""
    return all(abs(level - exact) <= 1.5 for level, exact in zip(levels, EXACT, strict=True))


@pytest.mark.parametrize(("codec", "fmt"), [("libx265", "mp4"), ("ffv1", "matroska")])
def test_grey_frames_are_converted_by_their_range_as_colour_frames_are(codec: str, fmt: str) -> None:
    # HEVC 4:0:0 and FFV1 grey decode to FFmpeg's gray format, which libswscale took as full range
    # whatever its tag: black (Y = 16) came out 16 and white (235) 235 in a limited-range clip.
    # H.264's decoder gives 4:0:0 as 4:2:0 with neutral chroma, converted as limited: 0 and 255.
    # Untagged is limited too (docs/checkpoint.md).
    h264 = [grey_levels(grey_clip("libx264", "mp4", y))[0] for y in (16, 100, 235)]
    assert near_exact(h264), h264
    for colour_range in (None, 1):
        assert [grey_levels(grey_clip(codec, fmt, y, colour_range))[0] for y in (16, 100, 235)] == h264, colour_range
    assert [grey_levels(grey_clip(codec, fmt, y, 2))[0] for y in (16, 100, 235)] == [16, 100, 235]  # full range: as stored


def test_odd_sized_and_deep_grey_frames() -> None:
    # 17x9 (the neutral chroma planes are 9x5) and 1x1, 8 and 10 bits (white is 940, black 64)
    for bits in (8, 10):
        assert near_exact([grey_levels(grey_clip("ffv1", "matroska", y, 1, (17, 9), bits))[0] for y in (16, 100, 235)]), bits
        assert near_exact([grey_levels(grey_clip("ffv1", "matroska", y, None, (1, 1), bits))[0] for y in (16, 100, 235)]), bits
    assert grey_levels(grey_clip("ffv1", "matroska", 235, 2, (1, 1), bits=10)) == [235]  # full range: 940 of 1023
