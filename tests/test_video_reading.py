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
