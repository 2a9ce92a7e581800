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



def flac_with(plain: bytes, blocks: list[tuple[int, bytes]]) -> bytes:
    """A FLAC with metadata ``blocks`` (type, body) put after its STREAMINFO."""
    pos, kept = 4, []
    while True:
        last, size = plain[pos] & 0x80, int.from_bytes(plain[pos + 1 : pos + 4], "big")
        kept.append((plain[pos] & 0x7F, plain[pos + 4 : pos + 4 + size]))
        pos += 4 + size
        if last:
            break
    every = kept[:1] + blocks + kept[1:]
    heads = [bytes([kind | (0x80 if i == len(every) - 1 else 0)]) + len(body).to_bytes(3, "big") + body for i, (kind, body) in enumerate(every)]
    return b"fLaC" + b"".join(heads) + plain[pos:]


def wav_with(plain: bytes, before: bytes, after: bytes) -> bytes:
    """A WAV with the chunks ``before`` put ahead of its ``data`` chunk and ``after`` behind it."""
    at = plain.index(b"data")
    body = plain[12:at] + before + plain[at:] + after
    return b"RIFF" + (4 + len(body)).to_bytes(4, "little") + b"WAVE" + body


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



def _ogg_crc(data: bytes) -> int:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if r & 0x80000000 else (r << 1) & 0xFFFFFFFF
        table.append(r)
    r = 0
    for b in data:
        r = ((r << 8) & 0xFFFFFFFF) ^ table[(r >> 24) ^ b]
    return r


def ogg_with_tags(data: bytes, size: int) -> bytes:
    """An Ogg Opus file whose OpusTags packet (its second page, replaced) holds a ``size``-byte tag."""
    import struct

    pages, pos = [], 0
    while pos < len(data):
        n = data[pos + 26]
        body = sum(data[pos + 27 : pos + 27 + n])
        pages.append((data[pos : pos + 27], data[pos + 27 : pos + 27 + n], data[pos + 27 + n : pos + 27 + n + body]))
        pos += 27 + n + body

    def page(flags: int, granule: int, seq: int, body: bytes, lacing: list[int]) -> bytes:
        p = b"OggS\x00" + bytes([flags]) + struct.pack("<qII", granule, serial, seq) + b"\x00" * 4 + bytes([len(lacing)]) + bytes(lacing) + body
        return p[:22] + struct.pack("<I", _ogg_crc(p)) + p[26:]

    serial = struct.unpack("<I", pages[0][0][14:18])[0]
    tags = b"OpusTags" + struct.pack("<I", 5) + b"uform" + struct.pack("<I", 1) + struct.pack("<I", size) + b"A=" + b"x" * (size - 2)
    out, seq, at = [b"".join(pages[0])], 1, 0
    while at < len(tags):
        part = tags[at : at + 255 * 255]
        at += len(part)
        lacing = [255] * (len(part) // 255) + ([len(part) % 255] if at >= len(tags) else [])
        out.append(page(0 if seq == 1 else 1, 0 if at >= len(tags) else -1, seq, part, lacing))
        seq += 1
    for header, lacing_bytes, body in pages[2:]:
        out.append(page(header[5], struct.unpack("<q", header[6:14])[0], seq, body, list(lacing_bytes)))
        seq += 1
    return b"".join(out)


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


# -- JPEG: what Pillow's reader holds, or steps through, before the picture ----------------


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(out, "JPEG")
    return out.getvalue()


def segment(marker: int, payload: int) -> bytes:
    return bytes([0xFF, marker]) + (payload + 2).to_bytes(2, "big") + b"x" * payload


def picture(item: Any) -> np.ndarray:
    from uform.plugins.media import image as pictures

    return pictures.decode(sources.sources([item], "images")[0], 32)[0]


@pytest.mark.parametrize(
    "insert, reason",
    [
        # 257 APP3 segments of 65533 bytes: 16.8 MB that Pillow's applist held (5,000 of them: +316 MB)
        (lambda: segment(0xE3, 65533) * 257, r"its JPEG metadata \(APPn and COM segments before the picture\) holds over 16777216 bytes, the limit of uform.plugins.media.jpeg.MAX_METADATA_BYTES"),
        (lambda: segment(0xFE, 65533) * 257, r"holds over 16777216 bytes"),  # COM too
        # 10,001 empty APP3 segments, 40 KB (1,000,000 of them: +132 MB, 7 s)
        (lambda: segment(0xE3, 0) * 10_001, r"it has over 10000 JPEG segments before the picture, the limit of uform.plugins.media.jpeg.MAX_SEGMENTS"),
        # 70,000 fill bytes, stepped through a byte a read (10 MB of them: 22.6 s)
        (lambda: b"\xff" * 70_000, r"it has over 65536 stray bytes \(fill or junk\) between its JPEG segments, the limit of uform.plugins.media.jpeg.MAX_STRAY_BYTES"),
        (lambda: segment(0xFE, 2) + b"\x01" * 70_000, r"over 65536 stray bytes"),  # junk after a segment
    ],
)
def test_a_jpeg_s_segments_before_the_picture_are_bounded(jpeg: bytes, insert: Any, reason: str, tmp_path: Path) -> None:
    data = jpeg[:2] + insert() + jpeg[2:]
    path = tmp_path / "bomb.jpg"
    path.write_bytes(data)
    for item in (data, str(path), io.BytesIO(data)):
        with pytest.raises(InputError, match=r"^item 0( \(.*\))?: .*" + reason):
            picture(item)


def test_a_jpeg_within_the_limits_reads_as_pillow_reads_it(jpeg: bytes) -> None:
    plain = picture(jpeg)
    within = segment(0xE3, 65533) * 250 + segment(0xE3, 0) * 9_000 + b"\xff" * 60_000 + segment(0xFE, 3) + b"\x01" * 5_000
    np.testing.assert_array_equal(picture(jpeg[:2] + within + jpeg[2:]), plain)




def test_a_progressive_jpeg_s_fill_between_its_scans_is_bounded() -> None:
    # measured: libjpeg passes fill bytes between a progressive JPEG's scans as Pillow feeds it,
    # in time that grows with their square: 10 MB took 4.7 s and +21 MB, 20 MB 15 s and +40 MB
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(out, "JPEG", progressive=True)
    plain = out.getvalue()
    second = plain.index(b"\xff\xda", plain.index(b"\xff\xda") + 2)  # the second scan's SOS
    fill = lambda n: plain[:second] + b"\xff" * n + plain[second:]  # noqa: E731
    with pytest.raises(InputError, match=r"^item 0: it has over 65536 stray bytes \(fill or junk\) between its JPEG segments, the limit of uform.plugins.media.jpeg.MAX_STRAY_BYTES$"):
        picture(fill(70_000))
    np.testing.assert_array_equal(picture(fill(60_000)), picture(plain))
    np.testing.assert_array_equal(picture(plain + b"\xff" * 200_000), picture(plain))  # padding after EOI: not read


def test_a_webp_is_held_to_a_quarter_of_the_pixels_it_costs_four_times_as_much(monkeypatch: pytest.MonkeyPatch) -> None:
    # measured: Pillow decodes a WebP at 15.3 bytes a pixel (a 9000x9000 lossless WebP of 3 KB:
    # +1238 MB of peak RSS, where MAX_PIXELS was to hold a picture to 400 MB)
    from PIL import Image

    from uform.plugins.media import image as pictures

    def webp(width: int, height: int, **kw: Any) -> bytes:
        out = io.BytesIO()
        Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(out, "WEBP", **kw)
        return out.getvalue()

    monkeypatch.setattr(pictures, "MAX_PIXELS", 4 * 64 * 64)
    assert picture(webp(64, 64, lossless=True)).shape == (32, 32, 3)
    for data in (webp(65, 64, lossless=True), webp(64, 65, quality=50)):
        with pytest.raises(InputError, match=r"^item 0: the WebP is 6\dx6\d = 4160 pixels, over the limit of 4096 for WebP \(uform.plugins.media.image.MAX_PIXELS // 4: Pillow's WebP decoder holds 16 bytes a pixel\)$"):
            picture(data)
    with pytest.raises(InputError, match=r"^item 0: the image is 200x100 = 20000 pixels, over the limit of 16384"):
        picture(webp(200, 100))



@pytest.mark.parametrize("reader", ["op library", "pillow"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_png_s_chunks_besides_its_image_data_are_bounded(where: str, reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # measured: 300,000 tEXt chunks (4.5 MB) took 2.7 s of uform's chunk walk before the image data,
    # 2.4 s after it; without the op library Pillow walked them, 300,000 tEXt chunks in 1.4-1.6 s,
    # 300,000 unknown ones in 2.5 s and +41 MB of peak RSS
    import struct
    import zlib

    from PIL import Image

    from uform.plugins.media import png

    if reader == "pillow":
        monkeypatch.setattr(png, "native", lambda: None)
    elif png.native() is None:
        pytest.skip("without the op library every PNG is Pillow's to read")
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (8, 8, 3), np.uint8)).save(out, "PNG")
    plain = out.getvalue()
    text = struct.pack(">I", 3) + b"tEXt" + b"k\x00v" + struct.pack(">I", zlib.crc32(b"tEXtk\x00v"))
    at = plain.index(b"IDAT") - 4 if where == "before" else plain.index(b"IEND") - 4
    np.testing.assert_array_equal(picture(plain[:at] + text * 9_990 + plain[at:]), picture(plain))
    with pytest.raises(InputError, match=r"^item 0: cannot decode the image: over 10000 chunks besides the image data \(uform.plugins.media.png.MAX_CHUNKS\)$"):
        picture(plain[:at] + text * 10_001 + plain[at:])


# -- video: the frame size the container declares, checked before FFmpeg's probe ------------


def clip(width: int, height: int, container: str, codec: str, frames: int = 2) -> bytes:
    """A clip of ``frames`` black frames, encoded with PyAV."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format=container) as c:
        stream = c.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"} if codec == "libx264" else {"deadline": "realtime", "cpu-used": "8"}
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                c.mux(packet)
        for packet in stream.encode(None):
            c.mux(packet)
    return out.getvalue()


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



def with_attachment(webm: bytes, size: int) -> bytes:
    """The WebM ``webm`` with an Attachments element of one ``size``-byte file before its first
    cluster (its Segment's size made unknown, as a live recording's is)."""

    def element(ident: bytes, body: bytes) -> bytes:
        return ident + (1 << 56 | len(body)).to_bytes(8, "big") + body

    segment_at = webm.index(b"\x18\x53\x80\x67") + 4
    length = 9 - webm[segment_at].bit_length()
    webm = webm[:segment_at] + b"\x01" + b"\xff" * 7 + webm[segment_at + length :]
    at = webm.index(b"\x1f\x43\xb6\x75")
    attached = element(b"\x61\xa7", element(b"\x46\x6e", b"a.bin") + element(b"\x46\x60", b"application/octet-stream") + element(b"\x46\xae", b"\x01") + element(b"\x46\x5c", b"\x00" * size))
    return webm[:at] + element(b"\x19\x41\xa4\x69", attached) + webm[at:]


def with_attachment_pointed(webm: bytes, size: int, voids: int = 0) -> bytes:
    """The WebM ``webm`` with an Attachments element of one ``size``-byte file at its end, after its
    clusters and ``voids`` empty Void elements before them, which a SeekHead first in its Segment points to."""

    def element(ident: bytes, body: bytes) -> bytes:
        return ident + (1 << 56 | len(body)).to_bytes(8, "big") + body

    def seek_head(position: int) -> bytes:
        return element(b"\x11\x4d\x9b\x74", element(b"\x4d\xbb", element(b"\x53\xab", b"\x19\x41\xa4\x69") + element(b"\x53\xac", position.to_bytes(8, "big"))))

    plain = with_attachment(webm, 0)  # its Segment's size made unknown
    plain = plain[: plain.index(b"\x19\x41\xa4\x69")] + plain[plain.index(b"\x1f\x43\xb6\x75") :]  # without the attachment
    segment = plain.index(b"\x18\x53\x80\x67") + 12
    at = plain.index(b"\x1f\x43\xb6\x75")
    attached = element(b"\x19\x41\xa4\x69", element(b"\x61\xa7", element(b"\x46\x6e", b"a.bin") + element(b"\x46\x60", b"application/octet-stream") + element(b"\x46\xae", b"\x01") + element(b"\x46\x5c", b"\x00" * size)))
    filler = b"\xec\x80" * voids
    position = len(plain) + len(seek_head(0)) + len(filler) - segment
    return plain[:segment] + seek_head(position) + plain[segment:at] + filler + plain[at:] + attached


def with_large_tracks(webm: bytes, size: int) -> bytes:
    """The WebM ``webm`` whose first TrackEntry ends with a Void element of ``size`` bytes (as a
    huge CodecPrivate would make its Tracks), its Segment's size made unknown."""

    def header(data: bytes, at: int) -> tuple[bytes, int, int]:  # an EBML element's ID, size and where its body starts
        n = 9 - data[at].bit_length()
        m = 9 - data[at + n].bit_length()
        return data[at : at + n], int.from_bytes(data[at + n : at + n + m], "big") & ((1 << (7 * m)) - 1), at + n + m

    data = with_attachment(webm, 0)
    data = data[: data.index(b"\x19\x41\xa4\x69")] + data[data.index(b"\x1f\x43\xb6\x75") :]
    tracks = data.index(b"\x18\x53\x80\x67") + 12  # the Segment's first element
    while data[tracks : tracks + 4] != b"\x16\x54\xae\x6b":
        _, element_size, body_at = header(data, tracks)
        tracks = body_at + element_size
    length = 9 - data[tracks + 4].bit_length()
    tracks_size = header(data, tracks)[1]
    body = data[tracks + 4 + length : tracks + 4 + length + tracks_size]
    entries, at = [], 0
    while at < len(body):  # its TrackEntry elements (ID 0xAE, one byte)
        n = 9 - body[at + 1].bit_length()
        entry_size = int.from_bytes(body[at + 1 : at + 1 + n], "big") & ((1 << (7 * n)) - 1)
        entries.append(body[at + 1 + n : at + 1 + n + entry_size])
        at += 1 + n + entry_size
    void = b"\xec" + (1 << 56 | size).to_bytes(8, "big") + b"\x00" * size
    new = b"".join(b"\xae" + (1 << 56 | len(e)).to_bytes(8, "big") + e for e in [entries[0] + void, *entries[1:]])
    return data[:tracks] + b"\x16\x54\xae\x6b" + (1 << 56 | len(new)).to_bytes(8, "big") + new + data[tracks + 4 + length + tracks_size :]


def m4a_with_video(width: int, height: int, container: str = "mp4") -> bytes:
    """An MP4 of 1 s of AAC sound beside one black ``width`` x ``height`` H.264 frame; with
    ``container="webm"``, a WebM of Opus sound and a VP9 frame."""
    import av

    out, signal = io.BytesIO(), media_audio.tone(1.0, 48000)
    webm = container == "webm"
    with av.open(out, "w", format=container) as c:
        sound = c.add_stream("libopus" if webm else "aac", rate=48000, layout="mono")
        moving = c.add_stream("libvpx-vp9" if webm else "libx264", rate=25)
        moving.width, moving.height, moving.pix_fmt = width, height, "yuv420p"
        moving.options = {"deadline": "realtime", "cpu-used": "8"} if webm else {"preset": "ultrafast"}
        frame = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), format="rgb24")
        frame.pts = 0
        for packet in [*moving.encode(frame), *moving.encode(None)]:
            c.mux(packet)
        step = 960 if webm else 1024
        for start in range(0, signal.shape[1], step):
            chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal[:, start : start + step]), format="fltp", layout="mono")
            chunk.sample_rate = 48000
            for packet in sound.encode(chunk):
                c.mux(packet)
        for packet in sound.encode(None):
            c.mux(packet)
    return out.getvalue()


def m4a_with_cover(size: int) -> bytes:
    """:func:`m4a_with_video` (64x48) with an iTunes cover (``moov/udta/meta/ilst/covr``) of ``size`` bytes."""
    import struct

    def box(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", 8 + len(body)) + kind + body

    data = m4a_with_video(64, 48)
    at = data.index(b"moov") - 4  # the last box: FFmpeg writes it after the sound
    covr = box(b"covr", box(b"data", struct.pack(">II", 13, 0) + b"\xff\xd8\xff" + b"x" * size))
    meta = box(b"meta", bytes(4) + box(b"hdlr", bytes(8) + b"mdirappl" + bytes(9)) + box(b"ilst", covr))
    return data[:at] + box(b"moov", data[at + 8 :] + box(b"udta", meta))


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


def with_tags(webm: bytes, size: int) -> bytes:
    """The WebM ``webm`` with a Tags element of one ``size``-byte TagString before its first cluster."""

    def element(ident: bytes, body: bytes) -> bytes:
        return ident + (1 << 56 | len(body)).to_bytes(8, "big") + body

    at = webm.index(b"\x1f\x43\xb6\x75")
    simple = element(b"\x67\xc8", element(b"\x45\xa3", b"A") + element(b"\x44\x87", b"x" * size))
    return webm[:at] + element(b"\x12\x54\xc3\x67", element(b"\x73\x73", simple)) + webm[at:]


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


def picture_block(size: int) -> bytes:
    """A FLAC PICTURE block's body: a front cover (type 3), image/png, of ``size`` zero bytes."""
    import struct

    return struct.pack(">II", 3, 9) + b"image/png" + struct.pack(">IIIIII", 0, 1, 1, 24, 0, size) + b"\x00" * size


def ogg_tagged(size: int, codec: str = "libopus") -> bytes:
    """A 2 s Ogg file (``libopus``: Opus, mono; ``vorbis``: FFmpeg's Vorbis, stereo) whose tags
    hold one ``size``-letter tag (none for 0), muxed by FFmpeg."""
    import av

    out, vorbis = io.BytesIO(), codec == "vorbis"
    signal = media_audio.tone(2.0, 48000, (440.0, 660.0) if vorbis else (440.0,))
    layout, step = ("stereo", 1024) if vorbis else ("mono", 960)
    with av.open(out, "w", format="ogg") as muxer:
        if size:
            muxer.metadata["A"] = "x" * size
        stream = muxer.add_stream(codec, rate=48000, layout=layout)
        if vorbis:
            stream.codec_context.options = {"strict": "experimental"}
        for start in range(0, signal.shape[1], step):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal[:, start : start + step]), format="fltp", layout=layout)
            frame.sample_rate = 48000
            for packet in stream.encode(frame):
                muxer.mux(packet)
        for packet in stream.encode(None):
            muxer.mux(packet)
    return out.getvalue()


def png_with(kind: bytes, body: bytes, count: int) -> bytes:
    """An 8x8 PNG with ``count`` chunks ``kind`` of ``body`` before its image data."""
    import struct
    import zlib

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (8, 8, 3), np.uint8)).save(out, "PNG")
    plain = out.getvalue()
    at = plain.index(b"IDAT") - 4
    chunk = struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return plain[:at] + chunk * count + plain[at:]


def _bombs(d: Path) -> dict[str, bytes]:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(out, "JPEG")
    j = out.getvalue()
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(out, "JPEG", progressive=True)
    p = out.getvalue()
    second = p.index(b"\xff\xda", p.index(b"\xff\xda") + 2)
    mp3_bytes = media_audio.write_format(d, "mp3", media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()
    wav = media_audio.write_format(d, "wav", media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()
    flac = media_audio.write_format(d, "flac", media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()
    info = b"INFO" + b"INAM" + (50_000_000).to_bytes(4, "little") + b"x" * 50_000_000
    comment = (5).to_bytes(4, "little") + b"uform" + (1).to_bytes(4, "little") + (16_000_000).to_bytes(4, "little") + b"A=" + b"x" * 15_999_998
    return {
        "id3-100MB.mp3": id3_tag(100_000_000) + mp3_bytes,
        "list-50MB.wav": wav_with(wav, b"LIST" + len(info).to_bytes(4, "little") + info, b""),
        "comment-16MB.flac": flac_with(flac, [(4, comment)]),
        "pictures-6x16MB.flac": flac_with(flac, [(6, picture_block(16_000_000))] * 6),
        "app3-5000x64KB.jpg": j[:2] + segment(0xE3, 65533) * 5000 + j[2:],
        "app3-1Mx0.jpg": j[:2] + segment(0xE3, 0) * 1_000_000 + j[2:],
        "fill-10MB.jpg": j[:2] + b"\xff" * 10_000_000 + j[2:],
        "progressive-fill-10MB.jpg": p[:second] + b"\xff" * 10_000_000 + p[second:],
        "progressive-app3-1500x64KB.jpg": p[:second] + segment(0xE3, 65533) * 1500 + p[second:],  # not walked: libjpeg skips them
        "progressive-app3-1Mx0.jpg": p[:second] + segment(0xE3, 0) * 1_000_000 + p[second:],
        "opus-tag-15MB.ogg": ogg_tagged(15_000_000),  # under MAX_OGG_HEADER_BYTES: left out (ogg.stripped)
        "vorbis-tag-15MB.ogg": ogg_tagged(15_000_000, "vorbis"),
        "opus-tag-1KB.ogg": ogg_tagged(1000),  # under metadata.SPLICE_FROM: FFmpeg reads it as it is
        "text-300k.png": png_with(b"tEXt", b"k\x00v", 300_000),
        "private-300k.png": png_with(b"prVt", b"abc", 300_000),
        "video-8000x6000.m4a": m4a_with_video(8000, 6000),  # audio_encode on it
        "video-8000x6000.weba": m4a_with_video(8000, 6000, "webm"),  # audio_encode on it
        "cover-100MB.m4a": m4a_with_cover(100_000_000),  # audio_encode on it
        "cover-16MB.m4a": m4a_with_cover(16_000_000),  # under mp4.MAX_METADATA_BYTES: read, not refused
        "8000x6000.mp4": clip(8000, 6000, "mp4", "libx264"),
        "8000x6000.webm": clip(8000, 6000, "webm", "libvpx"),
        "tags-100MB.webm": with_tags(clip(64, 48, "webm", "libvpx"), 100_000_000),  # read through, not held: left alone
        "attached-100MB.webm": with_attachment(clip(64, 48, "webm", "libvpx"), 100_000_000),
        "attached-100MB.weba": with_attachment(m4a_with_video(64, 48, "webm"), 100_000_000),  # audio_encode on it
        "attached-pointed-100MB.weba": with_attachment_pointed(m4a_with_video(64, 48, "webm"), 100_000_000, voids=140_000),
        "tracks-2MB-8000x6000.weba": with_large_tracks(m4a_with_video(8000, 6000, "webm"), 2 << 20),  # audio_encode on it
        "tracks-2MB-8000x6000.webm": with_large_tracks(clip(8000, 6000, "webm", "libvpx-vp9"), 2 << 20),
    }


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, data in _bombs(Path(tmp)).items():
            (Path(tmp) / name).write_bytes(data)
            said = subprocess.run([sys.executable, "-c", _MEASURE, str(Path(tmp) / name), *(sys.argv[1:] or ["-"])], capture_output=True, text=True)
            print(f"{name} ({len(data) / 1e6:.1f} MB): {said.stdout.strip() or said.stderr.strip()[-300:]}")
