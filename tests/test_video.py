"""The video plugin: frame sampling in every codec, rotation, variable frame rate, parity, bad input."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest
from media import OneWay, audio_only, clip, encode_image, level_index, no_frames, pattern, webm_of_packets, with_cover
from PIL import Image

import uform
from ckpt import make_checkpoint
from uform.core import checkpoint
from uform.core.host import get_host
from uform.plugins.media import video as clips_module
from uform.plugins.media import frames as frames_module
from uform.plugins import video
from uform.plugins.media import files as sources

F, S = 4, 32  # tiny preset
CODECS = [("libx264", "mp4"), ("libx265", "mp4"), ("libvpx", "webm"), ("libvpx-vp9", "webm"), ("libsvtav1", "webm")]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("video") / "tiny-video.safetensors", "tiny", 5, ["video"])


@pytest.fixture(scope="module")
def model(ckpt: Path) -> uform.Model:
    return uform.Model.load_ram(ckpt, quantization=uform.Scalar.F32)  # the graph against the reference, exactly


@pytest.fixture(scope="module")
def tower(ckpt: Path) -> video.VideoTower:
    config, _ = checkpoint.new(get_host(), "tiny", 5, ["video"])
    return video.read(config.towers["video"], config)


def sampled(tower: video.VideoTower, data: bytes, seeking: bool = True) -> tuple[list[int], np.ndarray, clips_module.Counters]:
    frames, counters = clips_module.sample(sources.Source(0, None, data=data), tower.frames, tower.pixels.image_size, seeking)
    return [level_index(f) for f in frames], frames, counters


def expected(times: list[float], span: float, count: int = F) -> list[int]:
    """The rule of docs/checkpoint.md, independently: the last frame at or before t0 + (i + 1/2) d / F."""
    t0 = min(times)
    out = []
    for i in range(count):
        target = t0 + (i + 0.5) * span / count
        at_or_before = [k for k, t in enumerate(times) if t <= target + 1e-9]
        out.append(max(at_or_before, key=lambda k: times[k]) if at_or_before else 0)
    return out


@pytest.mark.parametrize(("codec", "fmt"), CODECS)
def test_sampling_in_every_codec(tower: video.VideoTower, codec: str, fmt: str) -> None:
    data = clip(codec, fmt, frames=30, gop=10)
    picks, frames, counters = sampled(tower, data)
    assert picks == expected([float(i) for i in range(30)], 30.0) == [3, 11, 18, 26]
    assert frames.shape == (F, S, S, 3) and frames.dtype == np.uint8
    assert counters.seeks >= 1 and counters.decoded < 30  # seeking skipped whole keyframe groups
    everything = sampled(tower, data, seeking=False)
    assert everything[0] == picks and everything[2].seeks == 0
    np.testing.assert_array_equal(everything[1], frames)  # the same decoded frames either way


def test_seeking_only_when_a_later_keyframe_group_holds_the_next_frame(tower: video.VideoTower) -> None:
    one_group = clip("libx264", "mp4", frames=40, gop=250)
    picks, _, counters = sampled(tower, one_group)
    assert picks == [5, 15, 25, 35] and counters.seeks == 0 and counters.decoded <= 37
    many = clip("libx264", "mp4", frames=40, gop=4)
    picks, _, counters = sampled(tower, many)
    assert picks == [5, 15, 25, 35] and counters.seeks == 4 and counters.decoded < 20


def test_short_clips_repeat_frames(tower: video.VideoTower) -> None:
    assert sampled(tower, clip(frames=2))[0] == [0, 0, 1, 1]
    assert sampled(tower, clip("libvpx-vp9", "webm", frames=1))[0] == [0, 0, 0, 0]
    assert sampled(tower, clip(frames=3))[0] == expected([0.0, 1.0, 2.0], 3.0) == [0, 1, 1, 2]


def test_variable_frame_rate(tower: video.VideoTower) -> None:
    pts = [0, 1, 2, 3, 20, 21, 22, 40, 41, 59]  # in 1/30 s, the last frame lasting 1/30 s: d = 60
    # targets 7.5, 22.5, 37.5, 52.5: the frames at 3, 22, 22 (again: nothing between 22 and 40), 41
    for codec, fmt in [("libx264", "mp4"), ("libvpx-vp9", "webm")]:
        data = clip(codec, fmt, frames=len(pts), pts=pts, gop=3)
        picks, _, _ = sampled(tower, data)
        assert picks == expected([float(p) for p in pts], 60.0) == [3, 6, 6, 8], codec
        late = clip(codec, fmt, frames=len(pts), pts=[p + 45 for p in pts], gop=3)  # a clip that starts at 1.5 s
        assert sampled(tower, late)[0] == picks, codec


@pytest.mark.parametrize("rotation", [90, -90, 180])
def test_rotation_metadata_is_applied(tower: video.VideoTower, rotation: int) -> None:
    picture = pattern(48, 64)
    _, frames, _ = sampled(tower, clip(frames=3, rotation=rotation, picture=picture))
    # the display matrix turns the stored picture counterclockwise by its angle, as FFmpeg's autorotate does
    errors = [np.abs(frames[0].astype(int) - frames_module.fit(Image.fromarray(np.ascontiguousarray(np.rot90(picture, k))), S)).mean() for k in range(4)]
    assert int(np.argmin(errors)) == (rotation // 90) % 4 and min(errors) < 6 < sorted(errors)[1]


def test_parity_with_reference(model: uform.Model, ckpt: Path, tower: video.VideoTower) -> None:
    torch = pytest.importorskip("torch")

    from uform.exporters.reference import ReferenceModel

    clips = [clip(frames=12), clip("libvpx", "webm", frames=5, picture=pattern(48, 64)), clip(frames=9, size=(80, 32))]
    ours = np.array(model.video_encode(clips, uform.Arena()).embeddings)
    frames = np.stack([clips_module.sample(sources.Source(0, None, data=c), tower.frames, tower.pixels.image_size)[0] for c in clips])
    with torch.no_grad():
        ref = ReferenceModel.from_checkpoint(ckpt).towers["video"](torch.from_numpy(frames)).numpy()
    assert ours.shape == (3, 32)
    np.testing.assert_allclose(ours, ref, atol=2e-5)


def test_paths_bytes_and_file_objects(model: uform.Model, tmp_path: Path) -> None:
    data = clip("libvpx-vp9", "webm", frames=8)
    path = tmp_path / "clip.mp4"  # the content decides the container, never the name
    path.write_bytes(data)
    with open(path, "rb") as f:
        out = np.array(model.video_encode([data, path, str(path), io.BytesIO(data), f], uform.Arena()).embeddings)
    assert np.ptp(out, axis=0).max() == 0


def test_stats_and_batches(model: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    clips = [clip(frames=30, gop=10), clip("libvpx", "webm", frames=6), clip(frames=2)]
    whole = np.array(model.video_encode(clips, uform.Arena()).embeddings)
    monkeypatch.setattr(video, "MAX_ROWS", 2)
    stats = uform.VideoEncodeStats()
    np.testing.assert_allclose(np.array(model.video_encode(clips, uform.Arena(), stats=stats).embeddings), whole, atol=1e-6)
    assert (stats.items, stats.batches, stats.frames) == (3, 2, 12)
    assert stats.seconds_media == pytest.approx(1.0 + 0.2 + 2 / 30, abs=0.01)
    assert 0 < stats.frames_decoded < 38 and stats.seeks >= 1
    assert stats.bytes_read == sum(len(c) for c in clips)
    assert stats.seconds_decode > 0 and stats.seconds_compute > 0 and stats.skipped_packets == 0
    broken = bytearray(clips[0])  # its last packet in the file zeroed: skipped, counted, the same embedding
    with av.open(io.BytesIO(clips[0])) as container:
        pos, size = max((p.pos, p.size) for p in container.demux(video=0) if p.size)
    broken[pos : pos + size] = bytes(size)
    stats = uform.VideoEncodeStats()
    np.testing.assert_allclose(np.array(model.video_encode([bytes(broken)], uform.Arena(), stats=stats).embeddings), whole[:1], atol=1e-6)
    assert stats.skipped_packets == 1


def cut(data: bytes) -> bytes:
    return data[: len(data) * 6 // 10]


def test_a_cut_file_that_declares_no_duration_encodes_what_it_holds(model: uform.Model) -> None:
    """A live WebM recording declares no duration: a cut one cannot be told from a short one."""
    whole, live = clip("libvpx", "webm", frames=40), clip("libvpx", "webm", frames=40, options={"live": "1"})
    with pytest.raises(uform.InputError, match="is truncated or corrupt"):
        model.video_encode([cut(whole)], uform.Arena())
    assert np.isfinite(np.array(model.video_encode([cut(live)], uform.Arena()).embeddings)).all()


def test_a_fragmented_mp4_cut_in_its_closing_index_is_the_clip_it_holds(model: uform.Model) -> None:
    # a fragmented MP4 (a browser's or OBS's recording) ends with an mfra box, an index of its
    # fragments FFmpeg does without; cut inside it (a recorder stopped while writing it), every
    # fragment is whole, yet it was refused 'is truncated: it ends 104 bytes into its mfra box of
    # 105, before its fragments are whole'. Now it gives the whole clip's frames; cut in a fragment, refused as before
    fragmented = clip(frames=40, gop=5, options={"movflags": "frag_keyframe+empty_moov"})
    tail = fragmented.rindex(b"mfra") - 4
    assert int.from_bytes(fragmented[tail : tail + 4], "big") == len(fragmented) - tail
    whole = np.array(model.video_encode([fragmented], uform.Arena()).embeddings)
    for cut_at in (len(fragmented) - 1, tail + 8):
        np.testing.assert_array_equal(np.array(model.video_encode([fragmented[:cut_at]], uform.Arena()).embeddings), whole)
    with pytest.raises(uform.InputError, match=r"it ends 8 bytes into its mdat box of \d+, before its fragments are whole$"):
        model.video_encode([fragmented[: fragmented.rindex(b"mdat") + 4]], uform.Arena())


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[object, str]]:
    good = clip(frames=10)
    fragmented = clip(frames=40, gop=5, options={"movflags": "frag_keyframe+empty_moov"})  # as browsers and streams record
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "dir.webm").mkdir()
    return {
        "empty bytes": (b"", "the bytes are empty"),
        "empty file": (tmp_path / "empty.mp4", "the file is empty"),
        "missing": (tmp_path / "missing.mp4", "no such file"),
        "directory": (tmp_path / "dir.webm", "is a directory"),
        "random bytes": (np.random.default_rng(0).bytes(5000), "not an MP4 or WebM file"),
        "random after an mp4 box": (b"\x00\x00\x00\x18ftypmp42" + np.random.default_rng(1).bytes(3000), "item 9: is truncated or corrupt: it has no moov box, the index of its samples$"),
        "truncated mp4": (good[: len(good) // 2], "item 9: is truncated or corrupt: it has no moov box, the index of its samples$"),
        "truncated fragmented mp4": (fragmented[: len(fragmented) // 2], r"item 9: is truncated: it ends \d+ bytes into its (moof|mdat) box of \d+, before its fragments are whole$"),
        "unknown codec": (clip("libvpx", "webm", frames=10).replace(b"V_VP8", b"V_XY8"), "item 9: the video stream is in a codec this FFmpeg cannot decode$"),
        "truncated mp4, index first": (cut(clip(frames=40, options={"movflags": "faststart"})), "is truncated or corrupt: its container declares 1.33 s"),
        "truncated webm": (cut(clip("libvpx-vp9", "webm", frames=40)), "is truncated or corrupt: its container declares 1.33 s, its packets end at 0."),
        "truncated webm with sound": (cut(clip("libvpx", "webm", frames=40, audio=True)), "is truncated or corrupt: its container declares 1.33 s"),
        "image": (encode_image(pattern(20, 20), "PNG"), "not an MP4 or WebM file"),
        "audio-only mp4": (audio_only("mp4"), "no video stream"),
        "audio-only webm": (audio_only("webm"), "no video stream"),
        "audio with a cover m4a": (with_cover(audio_only("mp4")), r"item 9: the file has no video stream \(streams: audio, cover picture\)$"),
        "no frames": (no_frames("webm"), "no frames"),
        "no frames mp4": (no_frames("mp4", "libx264"), "no video stream"),
    }


@pytest.mark.parametrize(
    "case",
    ["empty bytes", "empty file", "missing", "directory", "random bytes", "random after an mp4 box", "truncated mp4",
     "truncated fragmented mp4", "unknown codec", "truncated mp4, index first", "truncated webm", "truncated webm with sound", "image", "audio-only mp4", "audio-only webm", "audio with a cover m4a",
     "no frames", "no frames mp4"],
)  # fmt: skip
def test_bad_files_name_item_path_and_reason_and_write_nothing(model: uform.Model, tmp_path: Path, case: str) -> None:
    bad, reason = _bad_inputs(tmp_path)[case]
    good = clip(frames=6)
    arena = uform.Arena()
    before = model.video_encode([good], arena)
    kept, generation = np.array(before.embeddings), arena.generation
    with pytest.raises(uform.InputError, match=reason) as info:
        model.video_encode([good] * 9 + [bad], arena)  # the bad item sits in the second batch
    assert info.value.index == 9
    if isinstance(bad, Path):
        assert info.value.path == str(bad) and str(bad) in str(info.value)
    assert arena.generation == generation
    np.testing.assert_array_equal(before.embeddings, kept)


def test_bounds_on_frame_size_and_duration(model: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clips_module, "MAX_FRAME_PIXELS", 64 * 48 - 1)
    with pytest.raises(uform.InputError, match=r"item 0: frames are 64x48, over the limit"):
        model.video_encode([clip(frames=3)], uform.Arena())
    monkeypatch.setattr(clips_module, "MAX_FRAME_PIXELS", 10**8)
    monkeypatch.setattr(clips_module, "MAX_SECONDS", 0.5)
    with pytest.raises(uform.InputError, match=r"item 0: the clip spans 1 s, over the limit"):
        model.video_encode([clip(frames=30)], uform.Arena())
    monkeypatch.setattr(clips_module, "MAX_PACKETS", 5)
    with pytest.raises(uform.InputError, match=r"over 5 frames"):
        model.video_encode([clip(frames=10)], uform.Arena())


def test_a_missed_seek_falls_back_to_reading_through(tower: video.VideoTower, monkeypatch: pytest.MonkeyPatch) -> None:
    data = clip(frames=30, gop=5)
    want = sampled(tower, data, seeking=False)[1]
    real = clips_module.pick
    calls: list[bool] = []

    def missing(container: object, stream: object, p: clips_module.Plan, count: int, seeking: bool, keep: object) -> clips_module.Counters:
        calls.append(seeking)
        if seeking:
            raise clips_module._SeekMissed
        return real(container, stream, p, count, seeking, keep)  # type: ignore[arg-type]

    monkeypatch.setattr(clips_module, "pick", missing)
    np.testing.assert_array_equal(sampled(tower, data)[1], want)
    assert calls == [True, False]


@pytest.mark.parametrize(("codec", "fmt"), [("libx264", "mp4"), ("libvpx-vp9", "webm")])
def test_corrupted_clips_raise_input_errors_only(model: uform.Model, codec: str, fmt: str) -> None:
    """Flipped bytes and cuts anywhere: each clip either decodes or raises InputError naming it."""
    data = clip(codec, fmt, frames=12, gop=4, picture=pattern(48, 64))
    rng = np.random.default_rng(11)
    for _ in range(25):
        b = bytearray(data)
        for at in rng.integers(0, len(b), rng.integers(1, 8)):
            b[at] = int(rng.integers(0, 256))
        mutant = bytes(b[: int(rng.integers(len(b) // 3, len(b) + 1))])
        try:
            out = model.video_encode([mutant], uform.Arena())
            assert np.isfinite(out.embeddings).all()
        except uform.InputError as exc:
            assert exc.index == 0 and exc.reason


def test_empty_call_and_one_way_streams(model: uform.Model) -> None:
    assert model.video_encode([], uform.Arena()).embeddings.shape == (0, 32)

    data = clip(frames=5)
    out = np.array(model.video_encode([OneWay(data), data], uform.Arena()).embeddings)
    np.testing.assert_array_equal(out[0], out[1])


def test_the_demux_pass_holds_8_bytes_a_packet() -> None:
    """plan() keeps every frame's time as int64 (it kept a Python int in a list and a dict
    entry of durations: 125 bytes a packet, 124 MB for a 9 MB WebM of 10^6 packets)."""
    import tracemalloc

    import av

    count = 100_000
    data = webm_of_packets(count)
    (source,) = sources.sources([data], "clips")
    with av.open(io.BytesIO(data), format="matroska") as container:
        stream = clips_module.video_stream(container, source)
        tracemalloc.start()
        p = clips_module.plan(container, stream, source)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert len(p.times) == count and p.span == count  # the last packet's duration: the median gap, 1 ms
    assert peak < 40 * count, peak  # times (8 bytes), sorted (8), gaps (8), the array's growth
