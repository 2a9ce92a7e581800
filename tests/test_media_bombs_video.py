"""Hostile clips and containers: a frame size declared past the limit (refused before FFmpeg's
probe), a recording's video track, MP4 metadata, WebM attachments, tags and large tracks, each
refused or read in bounded memory, by name (docs/media-video.md). Recordings:
tests/test_media_bombs.py; pictures: tests/test_media_bombs_pictures.py."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.bomb_files import clip, m4a_with_cover, m4a_with_video, window, with_attachment, with_attachment_pointed, with_large_tracks
from uform.core.errors import InputError
from uform.plugins.media import files as sources


@pytest.mark.parametrize("container, codec", [("mp4", "libx264"), ("webm", "libvpx")])
def test_a_clip_s_declared_frame_size_is_refused_before_ffmpeg_opens_it(container: str, codec: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # measured: an 8000x6000 H.264 clip (142 KB) took +114 MB and 0.32 s of FFmpeg's probe to be refused
    import av

    from uform.plugins.media import video

    data = clip(64, 48, container, codec)
    path = tmp_path / f"clip.{container}"
    path.write_bytes(data)
    monkeypatch.setattr(video, "MAX_FRAME_PIXELS", 64 * 48 - 1)
    opened: list[Any] = []
    real_open = av.open
    monkeypatch.setattr(av, "open", lambda *a, **kw: opened.append(a) or real_open(*a, **kw))
    for item in (str(path), data, io.BytesIO(data)):
        with pytest.raises(InputError, match=r"^item 0( \(.*\))?: frames are 64x48, over the limit of 3071 pixels \(uform.plugins.media.video.MAX_FRAME_PIXELS\)$"):
            video.sample(sources.sources([item], "clips")[0], 2, 16)
    assert opened == []
    monkeypatch.setattr(video, "MAX_FRAME_PIXELS", 64 * 48)
    assert video.sample(sources.sources([data], "clips")[0], 2, 16)[0].shape == (2, 16, 16, 3)


@pytest.mark.parametrize("container", ["mp4", "webm"])
def test_a_recording_s_video_track_is_held_to_the_frame_limit(monkeypatch: pytest.MonkeyPatch, container: str) -> None:
    # measured: audio_encode on an MP4 with an 8000x6000 H.264 track took +116 MB of peak RSS and
    # 0.21 s (FFmpeg's probe decoded a frame), against +7 MB for a 64x48 one; on a WebM with an
    # 8000x6000 VP9 track +83 MB and 0.19 s, against +6 MB for a 64x48 one (a VP8 track cost nothing:
    # its probe decodes no frame)
    from uform.plugins.media import video

    data = m4a_with_video(64, 48, container)
    assert window(data).shape == (16000,)
    monkeypatch.setattr(video, "MAX_FRAME_PIXELS", 64 * 48 - 1)
    with pytest.raises(InputError, match=r"^item 0: its video track's frames are 64x48, over the limit of 3071 pixels \(uform.plugins.media.video.MAX_FRAME_PIXELS\) that FFmpeg's probe would decode one of$"):
        window(data)


def test_an_mp4_s_metadata_is_bounded(tmp_path: Path) -> None:
    # measured: audio_encode on an M4A with a 100 MB cover (moov/udta/meta/ilst/covr) took +103 MB of
    # peak RSS and 0.11 s (FFmpeg read the cover whole as it opened the file), against +7 MB without
    from uform.plugins.media import video

    plain = m4a_with_video(64, 48)
    np.testing.assert_array_equal(window(m4a_with_cover(1_000_000)), window(plain))
    path = tmp_path / "cover.m4a"
    path.write_bytes(m4a_with_cover(17_000_000))
    reason = r"its MP4 metadata \(udta and meta boxes: tags, cover art\) holds 17000\d{3} bytes, over the limit of 16777216 \(uform.plugins.media.mp4.MAX_METADATA_BYTES\) that FFmpeg would read whole$"
    with pytest.raises(InputError, match=r"^item 0 \(.*cover.m4a\): " + reason):
        window(str(path))
    with pytest.raises(InputError, match=r"^item 0: " + reason):  # a clip's too
        video.sample(sources.sources([path.read_bytes()], "clips")[0], 2, 16)


def test_a_webm_s_attachments_are_bounded(tmp_path: Path) -> None:
    # measured: FFmpeg read a 100 MB attachment whole as it opened the file, +384 MB of peak RSS and 2.5 s
    from uform.plugins.media import video

    plain = clip(64, 48, "webm", "libvpx", frames=4)
    frames = video.sample(sources.sources([plain], "clips")[0], 2, 16)[0]
    np.testing.assert_array_equal(video.sample(sources.sources([with_attachment(plain, 1_000_000)], "clips")[0], 2, 16)[0], frames)
    path = tmp_path / "attached.webm"
    path.write_bytes(with_attachment(plain, 17_000_000))
    with pytest.raises(InputError, match=r"^item 0 \(.*attached.webm\): its attachments hold 170000\d\d bytes, over the limit of 16777216 \(uform.plugins.media.video.MAX_ATTACHED_BYTES\) that FFmpeg would read whole$"):
        video.sample(sources.sources([str(path)], "clips")[0], 2, 16)


def test_a_webm_recording_s_attachments_are_bounded(tmp_path: Path) -> None:
    # measured: audio_encode on a WebM with a 100 MB attachment took +387 MB of peak RSS and 0.76 s
    # (FFmpeg read it whole as it opened the file), against +6 MB without
    plain = m4a_with_video(64, 48, "webm")
    np.testing.assert_array_equal(window(with_attachment(plain, 1_000_000)), window(plain))
    path = tmp_path / "attached.weba"
    path.write_bytes(with_attachment(plain, 17_000_000))
    with pytest.raises(InputError, match=r"^item 0 \(.*attached.weba\): its attachments hold 170000\d\d bytes, over the limit of 16777216 \(uform.plugins.media.video.MAX_ATTACHED_BYTES\) that FFmpeg would read whole$"):
        window(str(path))


def test_a_webm_s_attachments_are_found_where_its_seek_head_points(monkeypatch: pytest.MonkeyPatch) -> None:
    # FFmpeg reads the Attachments a SeekHead points to as it opens the file, wherever they lie:
    # measured, 100 MB of them after the clusters, behind 140,000 Void elements (past MAX_ELEMENTS),
    # +387 MB of peak RSS for audio_encode (python -m tests.test_media_bombs --unchecked)
    from uform.plugins.media import webm

    plain = m4a_with_video(64, 48, "webm")
    monkeypatch.setattr(webm, "MAX_ELEMENTS", 3)  # the walk ends before the clusters do
    np.testing.assert_array_equal(window(with_attachment_pointed(plain, 1_000_000)), window(plain))
    with pytest.raises(InputError, match=r"^item 0: its attachments hold 170000\d\d bytes, over the limit of 16777216 \(uform.plugins.media.video.MAX_ATTACHED_BYTES\) that FFmpeg would read whole$"):
        window(with_attachment_pointed(plain, 17_000_000))


def test_a_webm_s_large_tracks_are_walked_for_the_frame_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Tracks element over webm.MAX_TRACKS_BYTES was not read: FFmpeg's probe then decoded a frame
    # of whatever size the track declared before anything was checked
    from uform.plugins.media import video, webm

    plain = m4a_with_video(64, 48, "webm")
    large = with_large_tracks(plain, 2 * webm.MAX_TRACKS_BYTES)
    assert webm.declared_frame(io.BytesIO(large)) == webm.declared_frame(io.BytesIO(plain)) == (64, 48)
    np.testing.assert_array_equal(window(large), window(plain))
    monkeypatch.setattr(video, "MAX_FRAME_PIXELS", 64 * 48 - 1)
    with pytest.raises(InputError, match=r"^item 0: its video track's frames are 64x48, over the limit of 3071 pixels"):
        window(large)
