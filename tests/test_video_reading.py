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
from media import clip, frame_level, level_index, pattern, with_cover
from PIL import Image

from uform.core.errors import InputError
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

    def counted(container: Any, stream: Any, seek_to: int | None, c: clips_module.Counters) -> Iterator[Any]:
        reads.append(seek_to)
        if len(reads) > 20:
            raise AssertionError(f"sought without end: {reads[:8]} …")
        return frames_from(container, stream, seek_to, c)

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


def test_an_edit_list_that_cuts_into_a_keyframe_group_decodes_each_frame_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # FFmpeg's MP4 seek in such a file lands a group early, every time: the old pick decoded the
    # group before each sought one again: 28 frames for 4 samples where reading through decodes
    # 22. The packets before the keyframe aimed at are now passed over undecoded: 13 frames, each
    # once, the same pixels.
    grouped = trimmed(clip(frames=30, gop=5), 7)
    decoded: list[int] = []
    frames_from = clips_module._frames_from

    def counted(container: Any, stream: Any, seek_to: int | None, c: clips_module.Counters) -> Iterator[Any]:
        for frame in frames_from(container, stream, seek_to, c):
            decoded.append(level_index(frame.to_ndarray(format="rgb24")))
            yield frame

    monkeypatch.setattr(clips_module, "_frames_from", counted)
    picks, frames, counters = sampled(grouped)
    assert counters.seeks == 3 and counters.decoded == len(decoded)
    assert decoded == [7, 8, 9, 10, 15, 16, 20, 21, 22, 25, 26, 27, 28]  # each once: the frame after a sample ends it
    monkeypatch.setattr(clips_module, "_frames_from", frames_from)
    through, frames_through, read = sampled(grouped, seeking=False)
    assert picks == through == [9, 15, 21, 27] and counters.decoded < read.decoded == 22
    np.testing.assert_array_equal(frames, frames_through)




def zeroed(data: bytes, count: int | None = None) -> bytes:
    """``data`` with the bytes of its last ``count`` video packets in file order (every one: None) zeroed."""
    with av.open(io.BytesIO(data)) as container:
        packets = sorted((p.pos, p.size) for p in container.demux(video=0) if p.size)
    out = bytearray(data)
    for pos, size in packets[-count if count else 0 :]:
        out[pos : pos + size] = bytes(size)
    return bytes(out)


def test_a_packet_that_fails_to_decode_is_skipped_as_players_skip_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # an H.264 MP4 whose last packet (frame 29) is broken: FFmpeg's decoder refuses it (PyAV's decode
    # raises InvalidDataError), and uform refused the whole clip, 'cannot decode the video: Invalid
    # data found when processing input', though the sampled frames 3, 11, 18, 26 decode. FFmpeg's
    # own tools and players skip such a packet, its frame not shown: so does uform now, counting it
    intact = clip(frames=30, gop=10)
    broken = zeroed(intact, 1)
    with av.open(io.BytesIO(broken)) as container, pytest.raises(av.InvalidDataError):
        list(container.decode(video=0))
    for seeking in (True, False):
        picks, frames, counters = sampled(broken, seeking)
        assert picks == [3, 11, 18, 26] and counters.skipped == 1
        np.testing.assert_array_equal(frames, sampled(intact, seeking)[1])
    with pytest.raises(InputError, match=r"^item 0: the video stream has no decodable frames \(30 packets failed to decode\)$"):
        sampled(zeroed(intact))
    monkeypatch.setattr(clips_module, "MAX_FAILED_PACKETS", 2)  # 3 broken in a row: a corrupt clip, in FFmpeg's words
    with pytest.raises(InputError, match=r"^item 0: cannot decode the video: Invalid data found when processing input$"):
        sampled(zeroed(intact, 3), seeking=False)


def two_streams(fmt: str, default: int | None) -> bytes:
    """Two 12-frame video streams, 64x48 at levels 0, 1, … and 32x32 at 39, 38, …, the ``default``-th
    of them marked default (an MP4's one enabled track, Matroska's FlagDefault; None: the muxer's choice)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        streams = []
        for width, height in ((64, 48), (32, 32)):
            stream = container.add_stream("libx264" if fmt == "mp4" else "libvpx-vp9", rate=30)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            streams.append(stream)
            if default is not None:
                stream.disposition = av.stream.Disposition.default if len(streams) - 1 == default else av.stream.Disposition(0)
        for i in range(12):
            for k, stream in enumerate(streams):
                frame = av.VideoFrame.from_ndarray(np.full((stream.height, stream.width, 3), frame_level(39 - i if k else i), np.uint8), format="rgb24")
                frame.pts = i
                for packet in stream.encode(frame):
                    container.mux(packet)
        for stream in streams:
            for packet in stream.encode():
                container.mux(packet)
    return buffer.getvalue()


def test_of_two_video_streams_the_one_marked_default_is_sampled() -> None:
    # uform took the first video stream, whichever a player shows; FFmpeg's best stream (its
    # av_find_best_stream, which ffmpeg, torchcodec (transformers' video processors) and decord
    # take, as players do) is the one marked default: an MP4's enabled track, a Matroska track
    # flagged default. transformers' load_video with PyAV takes the first (decode(video=0)).
    for fmt in ("mp4", "webm"):
        for default, picks in ((None, [1, 4, 7, 10]), (0, [1, 4, 7, 10]), (1, [38, 35, 32, 29])):
            data = two_streams(fmt, default)
            with av.open(io.BytesIO(data)) as container:
                assert container.streams.best("video").index == (default or 0)
            assert sampled(data)[0] == sampled(data, seeking=False)[0] == picks, (fmt, default)
    covered = with_cover(clip(frames=12))  # an MP4 with album art: FFmpeg's attached picture, never the clip
    with av.open(io.BytesIO(covered)) as container:
        assert [s.disposition & av.stream.Disposition.attached_pic for s in container.streams.video] == [0, av.stream.Disposition.attached_pic]
    assert sampled(covered)[0] == [1, 4, 7, 10]


def test_b_frames_are_sampled_by_presentation_time() -> None:
    # H.264 with B-frames: packets come in decode order (pts 0, 4, 2, 1, 3, …), frames by the rule
    for count, picks in [(30, [3, 11, 18, 26]), (31, [3, 11, 19, 27]), (7, [0, 2, 4, 6])]:
        data = clip(frames=count, gop=12)
        with av.open(io.BytesIO(data)) as container:
            order = [p.pts for p in container.demux(video=0) if p.size]
        assert order != sorted(order)
        assert sampled(data)[0] == sampled(data, seeking=False)[0] == picks


@pytest.mark.parametrize(("codec", "fmt", "size"), [
    ("libvpx-vp9", "webm", (1, 1)), ("libvpx-vp9", "webm", (17, 9)), ("libvpx-vp9", "webm", (4000, 16)),
    ("libvpx", "webm", (17, 9)), ("ffv1", "matroska", (17, 9)), ("libx264", "mp4", (4000, 16)),
])  # fmt: skip
def test_odd_sizes_are_the_frames_pyav_decodes_fitted(codec: str, fmt: str, size: tuple[int, int]) -> None:
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(4):
            picture = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), np.full_like(x, 60 * i)], -1).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    data = buffer.getvalue()
    with av.open(io.BytesIO(data)) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(decoded) == 4 and decoded[0].shape == (height, width, 3)
    _, frames, _ = sampled(data)
    for frame, reference in zip(frames, decoded, strict=True):  # 4 frames, F = 4: each once
        np.testing.assert_array_equal(frame, frames_module.fit(frames_module.from_array(reference), S))

U = 1 << 16  # 1.0 in the matrix's 16.16 fixed point
SHOWN = {  # a display matrix (a, b, c, d) → what FFmpeg's autorotation shows of the stored picture
    "phone upright, -90: turned clockwise": ((0, U, -U, 0), lambda p: np.rot90(p, -1)),
    "90: turned counterclockwise": ((0, -U, U, 0), lambda p: np.rot90(p, 1)),
    "180: turned half way": ((-U, 0, 0, -U), lambda p: p[::-1, ::-1]),
    "mirrored (a < 0)": ((-U, 0, 0, U), lambda p: p[:, ::-1]),
    "flipped (d < 0)": ((U, 0, 0, -U), lambda p: p[::-1]),
    "transposed (-90, c > 0)": ((0, U, U, 0), lambda p: p.transpose(1, 0, 2)),
    "anti-transposed (90, c < 0)": ((0, -U, -U, 0), lambda p: p[::-1, ::-1].transpose(1, 0, 2)),
    "singular: as stored": ((U, 0, U, 0), lambda p: p),
}


@pytest.mark.parametrize("case", list(SHOWN))
def test_the_display_matrix_turns_and_mirrors_the_picture_as_ffmpeg_shows_it(case: str) -> None:
    # tkhd's matrix, patched into a clip: a phone held upright writes (0, 1, -1, 0) and players
    # turn the stored landscape picture clockwise; a mirrored matrix (a selfie camera's) mirrors
    # it, where the old reading of the angle alone turned it (mirrored: upside down; flipped: not
    # at all; transposed: a turn); a singular one, whose angle PyAV reads as -2^31, was turned by 90
    (a, b, c, d), show = SHOWN[case]
    picture = pattern(48, 64)
    data = bytearray(clip(frames=3, picture=picture))
    at = data.find(b"tkhd") + 4 + 4 + 4 * 5 + 8 + 8  # version 0: flags, times, track, duration, layer…volume
    assert data[data.find(b"tkhd") + 4] == 0 and struct.unpack(">9i", data[at : at + 36])[::4] == (U, U, 1 << 30)
    data[at : at + 36] = struct.pack(">9i", a, b, 0, c, d, 0, 0, 0, 1 << 30)
    _, frames, _ = sampled(bytes(data), count=1)
    views = {k: fn(picture) for k, (_, fn) in SHOWN.items()}
    errors = {k: np.abs(frames[0].astype(int) - frames_module.fit(Image.fromarray(np.ascontiguousarray(v)), S)).mean() for k, v in views.items()}
    best = min(errors, key=lambda k: errors[k])
    assert np.array_equal(views[best], views[case]) and errors[case] < 6, errors


def sar_clip() -> bytes:
    """Three 64x48 H.264 frames of :func:`pattern` stored at a sample aspect ratio of 2:1 (shown 128x48, 8:3)."""
    from fractions import Fraction

    picture = pattern(48, 64)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.sample_aspect_ratio = Fraction(2, 1)
        for i in range(3):
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def test_a_sample_aspect_ratio_is_not_applied() -> None:
    # 64x48 stored at a sample aspect ratio of 2:1 is shown 128x48 (8:3); the tower gets the
    # stored frame fitted, as checkpoint.md says ("at the frame's own size"), not the shown one
    from fractions import Fraction

    data = sar_clip()
    with av.open(io.BytesIO(data)) as container:
        assert container.streams.video[0].display_aspect_ratio == Fraction(8, 3)
        stored = next(container.decode(video=0)).to_ndarray(format="rgb24")
    _, frames, _ = sampled(data, count=1)
    np.testing.assert_array_equal(frames[0], frames_module.fit(frames_module.from_array(stored), S))


def test_transformers_video_loading_does_not_apply_it_either(tmp_path: Any) -> None:
    # the peer's rule: transformers' load_video (its default PyAV backend, as its video
    # processors read clips) gives the stored 64x48 frames of the 2:1 clip, not 128x48
    video_utils = pytest.importorskip("transformers.video_utils")
    path = tmp_path / "sar.mp4"
    path.write_bytes(sar_clip())
    video, metadata = video_utils.load_video(str(path), backend="pyav", num_frames=2)
    assert video.shape == (2, 48, 64, 3) and (metadata.width, metadata.height) == (64, 48)

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


def colour_clip(pix_fmt: str, yuv: tuple[int, int, int], colourspace: int | None, colour_range: int | None) -> bytes:
    """Three flat frames of ``yuv`` (8-bit scale, stored at ``pix_fmt``'s depth), H.264 lossless
    (qp 0), tagged with ``colourspace`` (1: BT.709, 5: BT.601) and ``colour_range`` (1, 2) or not."""
    bits = 10 if pix_fmt.endswith("10le") else 8
    dtype = np.dtype(np.uint8 if bits == 8 else "<u2")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 32, 32, pix_fmt
        stream.codec_context.options = {"qp": "0"}
        if colourspace is not None:
            stream.codec_context.colorspace = colourspace
        if colour_range is not None:
            stream.codec_context.color_range = colour_range
        for i in range(3):
            frame = av.VideoFrame(32, 32, pix_fmt)
            for plane, value in zip(frame.planes, yuv, strict=True):
                plane.update(np.full(plane.buffer_size // dtype.itemsize, value << (bits - 8), dtype).tobytes())
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def exact_rgb(yuv: tuple[int, int, int], colourspace: int | None, colour_range: int | None) -> np.ndarray:
    """The matrix's own RGB of an 8-bit-scale YUV, as docs/checkpoint.md names it (untagged: BT.601, limited)."""
    kr, kb = (0.2126, 0.0722) if colourspace == 1 else (0.299, 0.114)
    y, u, v = yuv
    luma, pb, pr = ((y / 255, (u - 128) / 255, (v - 128) / 255) if colour_range == 2 else ((y - 16) / 219, (u - 128) / 224, (v - 128) / 224))
    r, b = luma + 2 * (1 - kr) * pr, luma + 2 * (1 - kb) * pb
    return np.clip(np.array([r, (luma - kr * r - kb * b) / (1 - kr - kb), b]) * 255, 0, 255)


TAGS = [(None, None), (5, 1), (5, 2), (1, 1), (1, 2)]


def colour_errors(pix_fmt: str, yuv: tuple[int, int, int] = (100, 150, 90)) -> list[float]:
    """Largest |uform's RGB − the exact matrix| of each of ``TAGS`` for a flat frame."""
    out = []
    for colourspace, colour_range in TAGS:
        _, frames, _ = sampled(colour_clip(pix_fmt, yuv, colourspace, colour_range), count=1)
        out.append(float(np.abs(frames[0, 0, 0].astype(float) - exact_rgb(yuv, colourspace, colour_range)).max()))
    return out


@pytest.mark.parametrize(("pix_fmt", "bound"), [("yuv444p", 0.5), ("yuv420p", 2.2), ("yuv420p10le", 2.8)])
def test_colour_frames_follow_their_tags_within_libswscale_rounding(pix_fmt: str, bound: float) -> None:
    # the tagged matrix and range are used (a wrong pair is off by over 6 levels here); libswscale's
    # fixed point is within half a level at 4:4:4, and its 4:2:0 path within about 2 (3 at 10 bits)
    errors = colour_errors(pix_fmt)
    assert max(errors) <= bound, errors
    wrong = exact_rgb((100, 150, 90), 1, 2) - exact_rgb((100, 150, 90), None, None)
    assert np.abs(wrong).max() > 6



@pytest.mark.parametrize(("colourspace", "kr", "kb"), [(9, 0.2627, 0.0593), (7, 0.212, 0.087)])  # BT.2020 NCL, SMPTE 240M
def test_bt2020_and_smpte240m_tags_are_followed(colourspace: int, kr: float, kb: float) -> None:
    y, u, v = 100, 150, 90
    luma, pb, pr = (y - 16) / 219, (u - 128) / 224, (v - 128) / 224
    r, b = luma + 2 * (1 - kr) * pr, luma + 2 * (1 - kb) * pb
    exact = np.array([r, (luma - kr * r - kb * b) / (1 - kr - kb), b]) * 255
    _, frames, _ = sampled(colour_clip("yuv444p", (y, u, v), colourspace, 1), count=1)
    assert np.abs(frames[0, 0, 0] - exact).max() <= 0.5
    assert np.abs(exact - exact_rgb((y, u, v), 5, 1)).max() > 2  # not BT.601's

def moving_clip(frames: int, size: tuple[int, int], gop: int) -> bytes:
    """An H.264 MP4 (30 fps, B-frames: x264's superfast preset) of a gradient that moves from frame to frame."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size, stream.codec_context.options = gop, {"preset": "superfast"}
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.stack([(x + 3 * i) % 256, (y + 2 * i) % 256, np.full_like(x, 7 * i % 256)], -1).astype(np.uint8), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def edit_list_costs(rounds: int = 5) -> None:
    """What sampling costs in a 100 s 640x360 clip (a keyframe every 30 frames) cut at frame 7, F = 8, S = 224."""
    import time

    data = trimmed(moving_clip(3000, (640, 360), 30), 7)
    for seeking in (True, False):
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            _, counters = clips_module.sample(sources.Source(0, None, data=data), 8, 224, seeking)
            best = min(best, time.perf_counter() - start)
        print(f"{'seeking' if seeking else 'reading through'}: {counters.decoded} frames decoded, {counters.seeks} seeks, best of {rounds} {best * 1000:.0f} ms")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--edit-list"]:
        edit_list_costs()
        sys.exit()
    print("pix_fmt       " + "  ".join(f"{str(t):10s}" for t in TAGS) + "  (largest |RGB - exact|, levels; tags: colourspace, range)")
    for pix_fmt in ("yuv444p", "yuv420p", "yuv420p10le"):
        print(f"{pix_fmt:12s}  " + "  ".join(f"{e:<10.1f}" for e in colour_errors(pix_fmt)))
