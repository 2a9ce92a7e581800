"""Test media made on the spot: images in every mode and format, clips in every codec. Nothing is downloaded."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Sequence

import numpy as np
from PIL import Image

LEVEL_STEP = 6  # grey level step between consecutive frames of a clip: frame i is 4 + 6 i (40 frames at most)


class OneWay(io.RawIOBase):
    """A readable, unseekable stream of ``data`` (as a pipe or a socket gives)."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        return self._inner.readinto(b)


def pattern(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth RGB picture (compresses well, survives JPEG) with an asymmetric layout."""
    y, x = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(seed)
    a, b, c = rng.uniform(0.5, 3.0, 3)
    rgb = np.stack([128 + 100 * np.sin(a * x / width * 6), 128 + 100 * np.cos(b * y / height * 6), 255 * x / max(width - 1, 1) * (y < height // 3) + c], -1)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def encode_image(image: Image.Image | np.ndarray, fmt: str, **kwargs: object) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


def with_orientation(array: np.ndarray, orientation: int, fmt: str = "PNG") -> bytes:
    """``array`` stored as is, with an EXIF orientation tag (lossless PNG by default)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode_image(array, fmt, exif=exif)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width × height`` but holds almost no data (a bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def webp_claiming(width: int, height: int, chunk: str) -> bytes:
    """A small WebP whose first chunk (``VP8 ``, ``VP8L`` or ``VP8X``) claims ``width × height``
    (a bomb's header; up to 16383 a side, 2^24 for ``VP8X``'s canvas)."""
    picture = Image.new("RGBA" if chunk == "VP8X" else "RGB", (16, 16), (1, 2, 3, 4))
    data = bytearray(encode_image(picture, "WEBP", **({"quality": 50} if chunk != "VP8L" else {"lossless": True})))
    assert data[12:16] == chunk.encode()
    if chunk == "VP8X":
        data[24:30] = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    elif chunk == "VP8L":
        data[21:25] = ((width - 1) | (height - 1) << 14 | (int.from_bytes(data[21:25], "little") & ~0xFFFFFFF)).to_bytes(4, "little")
    else:
        data[26:30] = width.to_bytes(2, "little") + height.to_bytes(2, "little")
    return bytes(data)


def png16(array: np.ndarray) -> bytes:
    """A 16-bit RGB (``[h, w, 3]``) or RGBA (``[h, w, 4]``) PNG, written by hand (Pillow cannot)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    h, w, c = array.shape
    raw = b"".join(b"\x00" + array[r].astype(">u2").tobytes() for r in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2 if c == 3 else 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def frame_level(i: int) -> int:
    return 4 + LEVEL_STEP * i


def level_index(frame: np.ndarray) -> int:
    """Which frame of :func:`clip` a sampled (grey) frame is."""
    return int(round((float(frame.mean()) - 4) / LEVEL_STEP))


def clip(
    codec: str = "libx264",
    fmt: str = "mp4",
    frames: int = 30,
    fps: int = 30,
    size: tuple[int, int] = (64, 48),
    gop: int = 10,
    rotation: int | None = None,
    pts: Sequence[int] | None = None,
    picture: np.ndarray | None = None,
    audio: bool = False,
    options: dict[str, str] | None = None,
) -> bytes:
    """A clip whose frame ``i`` is flat grey at :func:`frame_level` ``(i)`` (or ``picture``).

    ``pts`` gives each frame's presentation time in 1/``fps`` units (variable frame rate);
    ``options`` are the muxer's (``{"movflags": "faststart"}``: the MP4 index first;
    ``{"live": "1"}``: a WebM that declares no duration, as a live recording).
    """
    import tempfile

    width, height = size
    with tempfile.TemporaryDirectory() as tmp:  # a real file: faststart rewrites it when closing
        path = f"{tmp}/clip.{fmt}"
        _write_clip(path, codec, fmt, frames, fps, width, height, gop, rotation, pts, picture, audio, options or {})
        with open(path, "rb") as f:
            return f.read()


def _write_clip(
    path: str, codec: str, fmt: str, frames: int, fps: int, width: int, height: int, gop: int, rotation: int | None,
    pts: Sequence[int] | None, picture: np.ndarray | None, audio: bool, options: dict[str, str],
) -> None:  # fmt: skip
    import av

    with av.open(path, "w", format=fmt, options=options) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        if codec == "libx265":
            stream.codec_context.options = {"x265-params": "log-level=none"}
        if rotation is not None:
            stream.set_display_rotation(rotation)
        sound = container.add_stream("libopus" if fmt == "webm" else "aac", rate=48000) if audio else None
        for i in range(frames):
            array = picture if picture is not None else np.full((height, width, 3), frame_level(i), np.uint8)
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts = pts[i] if pts is not None else i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            _write_tone(container, sound, 1.0)


def _write_tone(container: object, stream: object, seconds: float) -> None:
    import av

    rate = 48000
    samples = (0.1 * np.sin(np.arange(int(rate * seconds)) * 2 * np.pi * 440 / rate)).astype(np.float32)
    for start in range(0, len(samples), 960):
        part = samples[start : start + 960]
        if len(part) < 960:
            break
        frame = av.AudioFrame.from_ndarray(part[None, :], format="flt", layout="mono")
        frame.sample_rate, frame.pts = rate, start
        for packet in stream.encode(frame):  # type: ignore[attr-defined]
            container.mux(packet)  # type: ignore[attr-defined]
    for packet in stream.encode():  # type: ignore[attr-defined]
        container.mux(packet)  # type: ignore[attr-defined]


def audio_only(fmt: str = "mp4") -> bytes:
    """A container with one audio stream and no video."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream("libopus" if fmt == "webm" else "aac", rate=48000)
        _write_tone(container, stream, 0.5)
    return buf.getvalue()


def no_frames(fmt: str = "webm", codec: str = "libvpx") -> bytes:
    """A container with a video stream that holds no frame (and a short audio stream, so it is written)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        sound = container.add_stream("libopus" if fmt == "webm" else "aac", rate=48000)
        _write_tone(container, sound, 0.3)
    return buf.getvalue()


def _boxes(data: bytes | bytearray, start: int, end: int) -> list[tuple[bytes, int, int]]:
    """``(kind, offset, size)`` of every box of an MP4 under ``moov`` down to the sample tables."""
    found, pos = [], start
    while pos + 8 <= end:
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        found.append((kind, pos, size))
        if kind in (b"moov", b"trak", b"mdia", b"minf", b"stbl"):
            found += _boxes(data, pos + 8, pos + size)
        pos += size
    return found


def mp4_declaring(samples: int, mp4: bytes | None = None) -> bytes:
    """A 10-frame H.264 MP4 (2 KB; or the one-track ``mp4`` given) whose tables declare ``samples``
    samples of one constant size (``stsz``, one ``stts`` entry, one chunk of them all in ``stsc``):
    FFmpeg indexes them all."""
    data = bytearray(clip(frames=10) if mp4 is None else mp4)
    box = {kind: (pos, size) for kind, pos, size in _boxes(data, 0, len(data))}
    pos, size = box[b"stsz"]
    first = struct.unpack(">I", data[pos + 20 : pos + 24])[0]
    data[pos : pos + size] = struct.pack(">I4sIII", 20, b"stsz", 0, first, samples) + struct.pack(">I4s", size - 20, b"free") + bytes(size - 28)
    pos, size = box[b"stts"]
    data[pos + 12 : pos + size] = struct.pack(">III", 1, samples, 512) + bytes(size - 24)
    pos, size = box[b"stsc"]
    data[pos + 12 : pos + 28] = struct.pack(">IIII", 1, 1, samples, 1)
    return bytes(data)


def webm_of_packets(count: int) -> bytes:
    """A 64x48 VP8 WebM of one keyframe and ``count - 1`` 3-byte packets a millisecond apart
    (never decoded by the demux-only pass: 9 bytes of file a packet)."""
    import av
    from fractions import Fraction

    out_bytes = io.BytesIO()
    with av.open(out_bytes, "w", format="webm") as out:
        stream = out.add_stream("libvpx", rate=1000)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 1000)
        frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 100, np.uint8), format="rgb24")
        frame.pts = 0
        out.mux((list(stream.encode(frame)) + list(stream.encode(None)))[0])
        for i in range(1, count):
            packet = av.Packet(b"\x01\x00\x00")
            packet.stream, packet.pts, packet.dts, packet.time_base = stream, i, i, Fraction(1, 1000)
            out.mux(packet)
    return out_bytes.getvalue()


def with_cover(data: bytes) -> bytes:
    """The MP4 ``data`` (its moov box last) with an iTunes cover, moov/udta/meta/ilst/covr (a PNG):
    album art, which FFmpeg reads as a video stream of one attached picture."""

    def box(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", 8 + len(body)) + kind + body

    at = data.index(b"moov") - 4
    covr = box(b"covr", box(b"data", struct.pack(">II", 14, 0) + encode_image(pattern(32, 32), "PNG")))
    return data[:at] + box(b"moov", data[at + 8 :] + box(b"udta", box(b"meta", bytes(4) + box(b"hdlr", bytes(8) + b"mdirappl" + bytes(9)) + box(b"ilst", covr))))
