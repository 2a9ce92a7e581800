"""Hostile recordings: MP3 ID3 tags, FLAC and WAV tags and pictures, Ogg tags, whose metadata
would cost far more than their sound, each refused or read in bounded memory, by name
(docs/media-audio.md). Pictures: tests/test_media_bombs_pictures.py; clips and containers:
tests/test_media_bombs_video.py; the files: tests/bomb_files.py.

``python -m tests.test_media_bombs [--unchecked] [--pillow]`` measures every bomb of the three
(its peak RSS growth and seconds), as docs/media-images.md, media-video.md and media-audio.md quote it."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import media_audio
from tests.bomb_files import bombs, flac_with, id3_tag, ogg_tagged, ogg_with_tags, wav_with, window
from uform.core.errors import InputError


@pytest.fixture(scope="module")
def mp3(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("mp3")
    return media_audio.write_format(d, "mp3", media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()


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


@pytest.mark.parametrize("name", ["wav", "flac"])
def test_a_flac_s_or_wav_s_tags_and_pictures_are_left_out(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # measured: FFmpeg read them whole as it opened the file, a WAV's 50 MB LIST chunk +146 MB of peak RSS
    from uform.plugins.media import metadata

    plain = media_audio.write_format(tmp_path, name, media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()
    if name == "wav":
        listed = b"LIST" + (4 + 8 + 10_000_000).to_bytes(4, "little") + b"INFO" + b"INAM" + (10_000_000).to_bytes(4, "little") + b"x" * 10_000_000
        tagged = wav_with(plain, listed, listed)
    else:
        comment = (5).to_bytes(4, "little") + b"uform" + (1).to_bytes(4, "little") + (10_000_000).to_bytes(4, "little") + b"A=" + b"x" * 9_999_998
        tagged = flac_with(plain, [(4, comment), (6, b"\x00" * 10_000_000), (1, b"\x00" * 10)])
    counted = Counted(tagged)
    got = window(counted)
    assert counted.read_bytes < 1_000_000
    path = tmp_path / "tagged.bin"
    path.write_bytes(tagged)
    np.testing.assert_array_equal(window(str(path)), got)
    monkeypatch.setattr(metadata, "stripped", lambda f, at: None)  # FFmpeg given the whole file: the same window
    np.testing.assert_array_equal(window(tagged), got)
    np.testing.assert_array_equal(window(plain), got)


@pytest.mark.parametrize("name", ["wav", "flac"])
def test_a_flac_s_or_wav_s_metadata_under_a_mib_is_left_to_ffmpeg(name: str, tmp_path: Path) -> None:
    # measured (benchmarks/media_preread.py): a Spliced file is read through Python calls; FFmpeg's
    # own WAV (a 34-byte LIST chunk) took 1-3 % more CPU to decode through one, its FLAC 0-8 %
    from uform.plugins.media import metadata

    plain = media_audio.write_format(tmp_path, name, media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()
    assert metadata.stripped(io.BytesIO(plain), 0) is None  # the encoder's own tags: FFmpeg reads the file

    def padded(n: int) -> bytes:  # n more bytes of metadata
        if name == "wav":
            return wav_with(plain, b"JUNK" + (n - 8).to_bytes(4, "little") + bytes(n - 8), b"")
        return flac_with(plain, [(1, bytes(n - 4))])

    under, over = padded(metadata.SPLICE_FROM - 16384), padded(metadata.SPLICE_FROM)
    assert metadata.stripped(io.BytesIO(under), 0) is None
    found = metadata.stripped(io.BytesIO(over), 0)
    assert found is not None and found[2] == len(over)
    np.testing.assert_array_equal(window(under), window(plain))
    np.testing.assert_array_equal(window(over), window(plain))


def test_a_flac_with_too_many_metadata_blocks_is_refused(tmp_path: Path) -> None:
    plain = media_audio.write_format(tmp_path, "flac", media_audio.tone(2.0, 44100)).read_bytes()
    with pytest.raises(InputError, match=r"^item 0: it has over 65536 metadata blocks or chunks before its sound, the limit of uform.plugins.media.metadata.MAX_BLOCKS$"):
        window(flac_with(plain, [(2, b"abcd")] * 70_000))
    assert window(flac_with(plain, [(2, b"abcd")] * 60_000)).shape == (16000,)


def test_an_ogg_file_s_tags_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # measured: FFmpeg read a 20 MB OpusTags packet whole, +80 MB of peak RSS
    from uform.plugins.media import metadata

    plain = media_audio.write_format(tmp_path, "opus-ogg", media_audio.tone(2.0, 48000)).read_bytes()
    monkeypatch.setattr(metadata, "MAX_OGG_HEADER_BYTES", 100_000)  # 16 MiB of tags would take this CRC a minute to write
    np.testing.assert_array_equal(window(ogg_with_tags(plain, 90_000)), window(plain))
    with pytest.raises(InputError, match=r"^item 0: its Ogg headers \(tags, pictures\) hold over 100000 bytes, the limit of uform.plugins.media.metadata.MAX_OGG_HEADER_BYTES$"):
        window(ogg_with_tags(plain, 110_000))


@pytest.mark.parametrize("codec", ["libopus", "vorbis"])
def test_an_ogg_opus_or_vorbis_file_s_tags_are_left_out(codec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # measured: FFmpeg read a 15 MB tag whole and held it, +61 MB of peak RSS for Opus, +105 MB for
    # Vorbis; given the headers rewritten without it, +6 and +7 MB (python -m tests.test_media_bombs)
    from uform.plugins.media import metadata

    plain, tagged = ogg_tagged(0, codec), ogg_tagged(2_000_000, codec)
    monkeypatch.setattr(metadata, "MAX_OGG_HEADER_BYTES", 1_500_000)  # the tags are never read: no limit holds them
    counted = Counted(tagged)
    np.testing.assert_array_equal(window(counted), window(plain))
    assert counted.read_bytes < 100_000  # the tag (2 MB) never read, by uform or by FFmpeg: the sound is 30 KB


# -- python tests/test_media_bombs.py [--unchecked] [--pillow]: each bomb's peak RSS growth and seconds --------

_MEASURE = """
import sys, time
from uform.plugins.media import audio, files, id3, image, jpeg, metadata, mp4, ogg, png, video, webm
if "--pillow" in sys.argv:  # as without the op library: every PNG Pillow's to read
    png.native = lambda: None
def hwm():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) // 1024
if "--unchecked" in sys.argv[2:]:  # the checks this file guards lifted: what the bombs cost without them
    id3.tags_end = lambda f: 0
    metadata.stripped = lambda f, at: None
    jpeg.MAX_METADATA_BYTES = jpeg.MAX_SEGMENTS = jpeg.MAX_STRAY_BYTES = 1 << 62
    png.MAX_CHUNKS = mp4.MAX_METADATA_BYTES = 1 << 62
    webm.declared, check = (lambda f: (None, 0)), mp4.check
    ogg.stripped = lambda f, at, least: None
    mp4.check = lambda source, f: check(source, f) and None
import av, PIL.Image, numpy
base, start = hwm(), time.perf_counter()
source = files.sources([sys.argv[1]], "x")[0]
kind = sys.argv[1].rsplit(".", 1)[1]
try:
    {"mp3": lambda: audio.decode(source, 16000, 16000), "wav": lambda: audio.decode(source, 16000, 16000), "flac": lambda: audio.decode(source, 16000, 16000), "ogg": lambda: audio.decode(source, 16000, 16000), "m4a": lambda: audio.decode(source, 16000, 16000), "weba": lambda: audio.decode(source, 16000, 16000), "jpg": lambda: image.decode(source, 224), "png": lambda: image.decode(source, 224), "mp4": lambda: video.sample(source, 8, 224), "webm": lambda: video.sample(source, 8, 224)}[kind]()
    said = "decoded"
except Exception as exc:
    said = str(exc)
print(f"+{hwm() - base} MB peak RSS, {time.perf_counter() - start:.2f} s: {said[:100]}")
"""


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, data in bombs(Path(tmp)).items():
            (Path(tmp) / name).write_bytes(data)
            said = subprocess.run([sys.executable, "-c", _MEASURE, str(Path(tmp) / name), *(sys.argv[1:] or ["-"])], capture_output=True, text=True)
            print(f"{name} ({len(data) / 1e6:.1f} MB): {said.stdout.strip() or said.stderr.strip()[-300:]}")
