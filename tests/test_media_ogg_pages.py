"""An Ogg file's pages before its sound are bounded in number: empty header pages add no bytes
to ``metadata.MAX_OGG_HEADER_BYTES``, and a million of them (27 MB) took uform's walk 1 s and
FFmpeg 2 s more, a 1 GB file 37 times that (+5 MB). Past ``metadata.MAX_OGG_HEADER_PAGES``
the file is refused by name before FFmpeg opens it (docs/media-audio.md, "From file to window")."""

from __future__ import annotations

import io
import struct

import numpy as np

from uform.core.errors import InputError
from uform.plugins.media import audio, files, ogg


def opus() -> bytes:
    """Two seconds of a 440 Hz tone in Ogg Opus, encoded with PyAV."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format="ogg") as c:
        stream = c.add_stream("libopus", rate=48000)
        stream.layout = "mono"
        tone = np.sin(np.arange(96000) / 48000 * 2 * np.pi * 440).astype(np.float32)[None]
        for at in range(0, tone.shape[1], 960):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(tone[:, at : at + 960]), format="flt", layout="mono")
            frame.sample_rate, frame.pts = 48000, at
            for packet in stream.encode(frame):
                c.mux(packet)
        for packet in stream.encode(None):
            c.mux(packet)
    return out.getvalue()


def split(data: bytes) -> tuple[int, bytes]:
    """Where ``data``'s (Ogg) header pages end, and an empty page (no segments, granule 0) of its stream."""
    at, heads = 0, 0
    while struct.unpack("<q", data[at + 6 : at + 14])[0] == 0:
        at += 27 + data[at + 26] + sum(data[at + 27 : at + 27 + data[at + 26]])
        heads += 1
    return at, ogg.page(0, 0, struct.unpack("<I", data[14:18])[0], heads, b"", b"")


def with_empty_pages(data: bytes, n: int) -> bytes:
    """``data`` (Ogg) with ``n`` empty pages after its header pages."""
    at, empty = split(data)
    return data[:at] + empty * n + data[at:]


def decoded(data: bytes) -> np.ndarray:
    return audio.decode(files.sources([data], "recordings")[0], 16000, 16000).samples


def test_more_empty_header_pages_than_the_limit_are_refused_by_name() -> None:
    many = with_empty_pages(opus(), 70_000)  # 65,536 (1 << 16) is the limit
    try:
        decoded(many)
    except InputError as exc:
        said = str(exc)
    else:
        said = "decoded"
    assert said == ("item 0: its Ogg headers span over 65536 pages before its sound, "
                    "the limit of uform.plugins.media.metadata.MAX_OGG_HEADER_PAGES")  # fmt: skip


def test_empty_header_pages_under_the_limit_decode_as_before() -> None:
    plain = opus()
    np.testing.assert_array_equal(decoded(with_empty_pages(plain, 1000)), decoded(plain))


# -- python tests/test_media_ogg_pages.py [PAGES] [--unchecked]: an Ogg Opus file with PAGES (1,000,000) empty header pages, peak RSS growth and seconds --

_MEASURE = """
import sys, time
from uform.plugins.media import audio, files, metadata
if "--unchecked" in sys.argv:
    metadata.MAX_OGG_HEADER_PAGES = 1 << 62
hwm = lambda: next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) // 1024
import av, numpy
base, start = hwm(), time.perf_counter()
try:
    audio.decode(files.sources([sys.argv[1]], "x")[0], 16000, 16000)
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

    count = int(next((a for a in sys.argv[1:] if a.isdigit()), "1000000"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"empty-pages-{count}.ogg"
        data = opus()
        at, empty = split(data)
        with open(path, "wb") as f:  # written in runs of 100,000 pages, not built whole in memory
            f.write(data[:at])
            for done in range(0, count, 100_000):
                f.write(empty * min(100_000, count - done))
            f.write(data[at:])
        print(subprocess.run([sys.executable, "-c", _MEASURE, str(path), *sys.argv[1:]], capture_output=True, text=True).stdout, end="")
