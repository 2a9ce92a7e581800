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

from bomb_files import clip

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


# -- python tests/test_media_webm_head.py [--unchecked]: the 100 MB attachment behind 140,000 Voids, peak RSS growth and seconds --

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
        for name, data in (("voids-then-attached-100MB.webm", with_voids(plain, 140_000, 100_000_000)),
                           ("attached-100MB-after-clusters.webm", with_voids(plain, 1000, 100_000_000, after_clusters=True))):  # fmt: skip
            (Path(tmp) / name).write_bytes(data)
            print(subprocess.run([sys.executable, "-c", _MEASURE, str(Path(tmp) / name), *sys.argv[1:]], capture_output=True, text=True).stdout, end="")
