"""Hostile media: files whose metadata or declared sizes would cost far more than their pictures
or sound, each refused or read in bounded memory, by name (docs/media.md)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import media_audio
from uform.core.errors import InputError
from uform.plugins.media import audio as recordings
from uform.plugins.media import files as sources


def id3_tag(text_bytes: int) -> bytes:
    """An ID3v2.4 tag holding one TXXX frame of ``text_bytes`` letters."""

    def synchsafe(n: int) -> bytes:
        return bytes([(n >> 21) & 127, (n >> 14) & 127, (n >> 7) & 127, n & 127])

    body = b"\x03desc\x00" + b"A" * text_bytes
    frame = b"TXXX" + synchsafe(len(body)) + b"\x00\x00" + body
    return b"ID3\x04\x00\x00" + synchsafe(len(frame)) + frame


@pytest.fixture(scope="module")
def mp3(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("mp3")
    return media_audio.write_format(d, "mp3", media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()


def window(item: Any) -> np.ndarray:
    return recordings.decode(sources.sources([item], "recordings")[0], 16000, 16000).samples


class Counted(io.BytesIO):
    """A seekable file object that counts the bytes read from it."""

    read_bytes = 0

    def read(self, n: int | None = -1) -> bytes:
        data = super().read(n)
        self.read_bytes += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        got = super().readinto(buffer)
        self.read_bytes += got
        return got


class OneWay(io.RawIOBase):
    """A file object that cannot seek, answering reads of at most 7000 bytes."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(min(len(buffer), 7000))
        buffer[: len(data)] = data
        return len(data)


def test_an_mp3_s_id3_tags_are_passed_over_not_read(mp3: bytes, tmp_path: Path) -> None:
    # FFmpeg read a leading tag whole as it opened the file: every byte of a 20 MB text frame
    plain = window(mp3)
    tagged = id3_tag(20_000_000) + id3_tag(100) + mp3  # two tags in a row, as FFmpeg also reads them
    counted = Counted(tagged)
    np.testing.assert_array_equal(window(counted), plain)
    assert counted.read_bytes < 1_000_000
    path = tmp_path / "tagged.bin"  # the content decides, not a name ending in .mp3
    path.write_bytes(tagged)
    np.testing.assert_array_equal(window(str(path)), plain)
    np.testing.assert_array_equal(window(tagged), plain)
    np.testing.assert_array_equal(window(OneWay(tagged)), plain)
    with pytest.raises(InputError, match=r"item 0: is not a recording uform can decode"):
        window(id3_tag(1000))  # a tag and nothing after it


_PEAK = """
import sys
from uform.plugins.media import audio, files
def hwm():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) // 1024
import av, numpy
base = hwm()
source = files.sources([open(sys.argv[1], "rb") if sys.argv[2] == "oneway" else sys.argv[1]], "x")[0]
if sys.argv[2] == "oneway":
    source.stream.seekable = lambda: False
audio.decode(source, 16000, 16000)
print(hwm() - base)
"""


@pytest.mark.parametrize("how", ["path", "oneway"])
def test_a_100_mb_id3_frame_costs_no_memory(mp3: bytes, tmp_path: Path, how: str) -> None:
    # measured: +290 MB of peak RSS for the path (FFmpeg's tag, its UTF-8 copy, PyAV's dict)
    path = tmp_path / "big-tag.mp3"
    path.write_bytes(id3_tag(100_000_000) + mp3)
    done = subprocess.run([sys.executable, "-c", _PEAK, str(path), how], capture_output=True, text=True, check=True)
    assert int(done.stdout) < 40, done.stdout  # MB over the process's peak before decoding
