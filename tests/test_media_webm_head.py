"""A WebM's elements before its first Cluster, which FFmpeg reads as it opens the file: more
than ``webm.MAX_HEAD_ELEMENTS`` of them is refused by name before FFmpeg opens it (140,000
two-byte Void elements, then a 100 MB attachment no SeekHead points to: +386 MB of peak RSS,
decoded, before); attachments after the first cluster that nothing points to FFmpeg never
reads (docs/media-video.md, "Limits")."""

from __future__ import annotations

import io

import numpy as np
import pytest

from uform.core.errors import InputError
from uform.plugins.media import files as sources
from uform.plugins.media import video, webm

from tests.bomb_files import clip, with_attachment_pointed
from tests.media import clip as grey_clip
from tests.media import level_index

CLUSTER = b"\x1f\x43\xb6\x75"


def element(ident: bytes, body: bytes) -> bytes:
    return ident + (1 << 56 | len(body)).to_bytes(8, "big") + body


def with_voids(webm_bytes: bytes, voids: int, attached: int, after_clusters: bool = False) -> bytes:
    """``webm_bytes`` with ``voids`` empty Void elements before its first cluster and an
    Attachments element of one ``attached``-byte file that no SeekHead points to, after the
    Voids or, ``after_clusters``, at the file's end (its Segment's size made unknown)."""
    at = webm_bytes.index(b"\x18\x53\x80\x67") + 4
    length = 9 - webm_bytes[at].bit_length()
    data = webm_bytes[:at] + b"\x01" + b"\xff" * 7 + webm_bytes[at + length :]
    files = element(b"\x61\xa7", element(b"\x46\x6e", b"a.bin") + element(b"\x46\x60", b"application/octet-stream")
                    + element(b"\x46\xae", b"\x01") + element(b"\x46\x5c", b"\x00" * attached))  # fmt: skip
    attachments = element(b"\x19\x41\xa4\x69", files)
    first = data.index(CLUSTER)
    if after_clusters:
        return data[:first] + b"\xec\x80" * voids + data[first:] + attachments
    return data[:first] + b"\xec\x80" * voids + attachments + data[first:]


def frames(data: bytes) -> np.ndarray:
    return video.sample(sources.sources([data], "clips")[0], 2, 16)[0]


def test_more_elements_before_the_first_cluster_than_the_limit_is_refused_by_name() -> None:
    plain = clip(64, 48, "webm", "libvpx", frames=4)  # a 64x48 VP8 WebM of four black frames
    many = with_voids(plain, 140_000, 1000)  # 131,072 (1 << 17) is the limit
    with pytest.raises(InputError) as caught:
        frames(many)
    with pytest.raises(InputError) as recording:  # a recording's WebM the same (the audio plugin's check)
        video.webm_declared(sources.sources([many], "recordings")[0], io.BytesIO(many))
    said = (f"item 0: its Segment has over {webm.MAX_HEAD_ELEMENTS} elements before its first cluster, the limit of "
            "uform.plugins.media.webm.MAX_HEAD_ELEMENTS (FFmpeg would read them all as it opens the file, attachments among them)")  # fmt: skip
    assert str(caught.value) == str(recording.value) == said



def test_elements_up_to_the_limit_and_attachments_after_the_clusters_are_read_as_before() -> None:
    plain = clip(64, 48, "webm", "libvpx", frames=4)  # a 64x48 VP8 WebM of four black frames
    expected = frames(plain)
    np.testing.assert_array_equal(frames(with_voids(plain, 1000, 1000)), expected)
    np.testing.assert_array_equal(frames(with_voids(plain, 1000, 1000, after_clusters=True)), expected)


INFO, TRACKS, SEEK_HEAD, TRACK_ENTRY, VIDEO = 0x1549A966, 0x1654AE6B, 0x114D9B74, 0xAE, 0xE0
SEGMENT, CLUSTER_ID = 0x18538067, 0x1F43B675


def header(data: bytes, at: int) -> tuple[int, int, int, int]:
    """An EBML element's header at ``at``: its ID, where its size field starts, the field's length, its body's start."""
    n = 9 - data[at].bit_length()
    m = 9 - data[at + n].bit_length()
    return int.from_bytes(data[at : at + n], "big"), at + n, m, at + n + m


def unknown_sized(data: bytes, ids: set[int], inside_tracks: tuple[int, ...] = ()) -> bytes:
    """``data`` with the Segment's children whose IDs are in ``ids`` made of unknown size (all
    ones in their size fields, as long as before, so nothing moves), and inside its Tracks the
    first element of each ID of ``inside_tracks`` in turn (a TrackEntry, then its Video)."""
    out = bytearray(data)

    def unknown(field: int, length: int) -> None:
        out[field : field + length] = ((1 << (7 * length + 1)) - 1).to_bytes(length, "big")

    _, field, length, at = header(data, 0)
    ident, field, length, at = header(data, at + int.from_bytes(data[field : field + length], "big") & ((1 << (7 * length)) - 1))
    assert ident == SEGMENT
    while at < len(data):
        ident, field, length, body = header(data, at)
        size = int.from_bytes(data[field : field + length], "big") & ((1 << (7 * length)) - 1)
        if ident in ids:
            unknown(field, length)
        if ident == TRACKS:
            inner = body
            for wanted in inside_tracks:
                while (found := header(data, inner))[0] != wanted:
                    inner = found[3] + (int.from_bytes(data[found[1] : found[1] + found[2]], "big") & ((1 << (7 * found[2])) - 1))
                unknown(found[1], found[2])
                inner = found[3]
        at = body + size
    return bytes(out)


def test_a_recorders_webm_of_unknown_sizes_is_the_clip_it_holds() -> None:
    # a browser's MediaRecorder writes its Segment and every Cluster of unknown size (the 8-byte
    # 0x01FFFFFFFFFFFFFF) and no duration: the head walk stops at the first Cluster, past the
    # Tracks; the frames, the frame count and the span are those of the same clip written whole
    import av

    whole = grey_clip("libvpx-vp9", "webm", frames=40, gop=10, options={"live": "1"})
    live = unknown_sized(whole, {CLUSTER_ID})
    at = live.index(b"\x18\x53\x80\x67") + 4
    assert live[at : at + 8] == b"\x01" + b"\xff" * 7 and live.count(CLUSTER) >= 2
    with av.open(io.BytesIO(live)) as container:
        assert container.duration is None and sum(1 for _ in container.decode(video=0)) == 40
    assert webm.declared(io.BytesIO(live)) == ((64, 48), 0)
    for seeking in (True, False):
        held, counters = video.sample(sources.Source(0, None, data=live), 8, 16, seeking)
        assert [level_index(frame) for frame in held] == [2, 7, 12, 17, 22, 27, 32, 37]
        assert abs(counters.seconds - 40 / 30) < 0.002


UNKNOWN = {  # which elements before the Tracks' frame size are of unknown size (FFmpeg reads each file)
    "Info": ({INFO}, ()),
    "Tracks": ({TRACKS}, ()),
    "Tracks, TrackEntry, Video": ({TRACKS}, (TRACK_ENTRY, VIDEO)),
    "SeekHead": ({SEEK_HEAD}, ()),
}


@pytest.mark.parametrize("case", list(UNKNOWN))
def test_elements_of_unknown_size_before_the_tracks_are_walked_into(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the walk stopped at the first element of unknown size, which FFmpeg reads into (it ends where
    # one of the Segment's own children begins): an Info so made hid the Tracks and the Attachments
    # after it: a 100 MB attachment behind it cost +383 MB of peak RSS, decoded, an 8000x6000 VP9
    # track +81 MB of FFmpeg's probe (python -m tests.test_media_webm_head, info-unknown-*.webm)
    ids, inside = UNKNOWN[case]
    plain = clip(64, 48, "webm", "libvpx-vp9", frames=4)
    made = unknown_sized(plain, ids, inside)
    assert webm.declared(io.BytesIO(made)) == ((64, 48), 0)
    np.testing.assert_array_equal(frames(made), frames(plain))
    monkeypatch.setattr(video, "MAX_ATTACHED_BYTES", 1000)
    with pytest.raises(InputError, match=r"^item 0: its attachments hold 20\d\d bytes, over the limit of 1000 "):
        frames(unknown_sized(with_voids(plain, 10, 2000), ids, inside))


def test_attachments_a_seekhead_of_unknown_size_points_to_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    # past Clusters of unknown size only a SeekHead finds them, as FFmpeg does; one of unknown size went unread
    monkeypatch.setattr(video, "MAX_ATTACHED_BYTES", 1000)
    pointed = with_attachment_pointed(clip(64, 48, "webm", "libvpx", frames=4), 2000)
    for ids in ({CLUSTER_ID}, {CLUSTER_ID, SEEK_HEAD}):
        with pytest.raises(InputError, match=r"^item 0: its attachments hold 20\d\d bytes, over the limit of 1000 "):
            frames(unknown_sized(pointed, ids))


# -- python -m tests.test_media_webm_head [--unchecked]: the 100 MB attachment behind 140,000 Voids, peak RSS growth and seconds --

_MEASURE = """
import sys, time
from uform.plugins.media import files, video, webm
if "--unchecked" in sys.argv:
    webm.MAX_HEAD_ELEMENTS = 1 << 62
hwm = lambda: next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) // 1024
import av, numpy
base, start = hwm(), time.perf_counter()
try:
    video.sample(files.sources([sys.argv[1]], "x")[0], 8, 224)
    said = "decoded"
except Exception as exc:
    said = str(exc)[:160]
print(f"{sys.argv[1].rsplit('/', 1)[1]}: +{hwm() - base} MB peak RSS, {time.perf_counter() - start:.2f} s: {said}")
"""

if __name__ == "__main__":
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        plain = clip(64, 48, "webm", "libvpx", frames=4)  # a 64x48 VP8 WebM of four black frames
        vp9 = clip(8000, 6000, "webm", "libvpx-vp9", frames=1)
        for name, data in (("voids-then-attached-100MB.webm", with_voids(plain, 140_000, 100_000_000)),
                           ("attached-100MB-after-clusters.webm", with_voids(plain, 1000, 100_000_000, after_clusters=True)),
                           ("info-unknown-attached-100MB.webm", unknown_sized(with_voids(plain, 0, 100_000_000), {INFO})),
                           ("info-unknown-8000x6000.webm", unknown_sized(vp9, {INFO}))):  # fmt: skip
            (Path(tmp) / name).write_bytes(data)
            print(subprocess.run([sys.executable, "-c", _MEASURE, str(Path(tmp) / name), *sys.argv[1:]], capture_output=True, text=True).stdout, end="")
