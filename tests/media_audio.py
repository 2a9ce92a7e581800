"""Recordings the audio tests make on the spot with PyAV (nothing is downloaded).

PyAV's wheel writes pcm_s16le, flac, libmp3lame and libopus (and libvpx for a video-only
WebM), so every format uform reads can be made here in milliseconds. A 10-hour WAV costs
nothing: its header declares 10 hours, one second of tone is written, and the rest of the
file is a sparse hole of zero bytes, which is exactly 16-bit digital silence. A 10-hour MP3
is one short CBR file repeated.
"""

from __future__ import annotations

import struct
from pathlib import Path

import av
import numpy as np

# name → (suffix, codec, container format or None, sample rate)
FORMATS: dict[str, tuple[str, str, str | None, int]] = {
    "wav": (".wav", "pcm_s16le", None, 44100),
    "flac": (".flac", "flac", None, 44100),
    "mp3": (".mp3", "libmp3lame", None, 44100),
    "opus-ogg": (".ogg", "libopus", "ogg", 48000),
    "opus-webm": (".webm", "libopus", "webm", 48000),
}


def tone(seconds: float, rate: int, freqs: tuple[float, ...] = (440.0,), amplitude: float = 0.5) -> np.ndarray:
    """One channel per frequency: float32 [channels, seconds * rate] sine waves."""
    t = np.arange(round(seconds * rate)) / rate
    return np.stack([amplitude * np.sin(2 * np.pi * f * t) for f in freqs]).astype(np.float32)


def write(path: Path, signal: np.ndarray, rate: int, codec: str, container: str | None = None) -> Path:
    """Encode ``signal`` [channels, n] (float, -1…1) at ``rate`` into ``path``."""
    layout = {1: "mono", 2: "stereo"}[signal.shape[0]]
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        for start in range(0, signal.shape[1], 4096):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal[:, start : start + 4096]), format="fltp", layout=layout)
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def write_format(directory: Path, name: str, signal: np.ndarray, stem: str = "clip") -> Path:
    """``signal`` (at the format's rate) encoded as one of :data:`FORMATS`."""
    suffix, codec, container, rate = FORMATS[name]
    return write(directory / f"{stem}-{name}{suffix}", signal, rate, codec, container)


def bad_tags_flac(path: Path, signal: np.ndarray, rate: int) -> Path:
    """A FLAC whose title tag is not UTF-8 (PyAV's default ``av.open`` raises
    ``UnicodeDecodeError`` on it)."""
    layout = {1: "mono", 2: "stereo"}[signal.shape[0]]
    with av.open(str(path), "w") as out:
        out.metadata["title"] = "QQQQQQQQ"
        stream = out.add_stream("flac", rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal), format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    path.write_bytes(path.read_bytes().replace(b"QQQQQQQQ", b"\xff\xfe\xfd\xfc\xc3\x28\xa0\xa1"))
    return path


def wav_header(rate: int, channels: int, data_bytes: int) -> bytes:
    """A canonical 44-byte PCM s16le WAV header."""
    return b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 1, channels, rate, rate * channels * 2, channels * 2, 16
    ) + b"data" + struct.pack("<I", data_bytes)


def pcm16(signal: np.ndarray) -> np.ndarray:
    """``signal`` [channels, n] as interleaved int16, rounded and clipped."""
    return np.clip(np.round(signal.T * 32768), -32768, 32767).astype("<i2")


def wav(path: Path, signal: np.ndarray, rate: int, declared_samples: int | None = None) -> Path:
    """A PCM WAV of ``signal``; ``declared_samples`` > n leaves a sparse hole of silence
    (or, if the file is then cut, a truncated file)."""
    data = pcm16(signal).tobytes()
    n = declared_samples or signal.shape[1]
    with open(path, "wb") as f:
        f.write(wav_header(rate, signal.shape[0], n * 2 * signal.shape[0]) + data)
        f.truncate(44 + n * 2 * signal.shape[0])
    return path


def ten_hour_wav(path: Path, rate: int = 16000) -> tuple[Path, np.ndarray]:
    """A 10-hour mono WAV (1.15 GB, sparse): one second of tone, then silence. Answers the tone."""
    head = tone(1.0, rate, (330.0,))
    return wav(path, head, rate, declared_samples=10 * 3600 * rate), head


def ten_hour_mp3(path: Path) -> tuple[Path, Path]:
    """A 10.8-hour MP3 (39 MB, made in ~0.1 s): a 2 s 8 kHz CBR MP3 without ID3 or Xing
    headers, repeated 18000 times; FFmpeg takes its duration from the bit rate. Answers it
    and the 2 s file, whose first second is the same bytes."""
    two = path.with_name(path.stem + "-2s.mp3")
    with av.open(str(two), "w", format="mp3", options={"write_xing": "0", "id3v2_version": "0"}) as out:
        stream = out.add_stream("libmp3lame", rate=8000, layout="mono")
        stream.bit_rate = 8000
        frame = av.AudioFrame.from_ndarray(tone(2.0, 8000, (330.0,)), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    data = two.read_bytes()
    with open(path, "wb") as f:
        f.writelines(data for _ in range(18000))
    return path, two


def video_only_webm(path: Path) -> Path:
    """A WebM holding two tiny VP8 frames and no audio stream."""
    with av.open(str(path), "w", format="webm") as out:
        stream = out.add_stream("libvpx", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(2):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 40 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def cut(path: Path, keep: float, suffix: str = ".cut") -> Path:
    """A copy of ``path`` holding only its first ``keep`` share of bytes."""
    data = path.read_bytes()
    target = path.with_name(path.name + suffix + path.suffix)
    target.write_bytes(data[: int(len(data) * keep)])
    return target


def garbled_mp3(source: Path, path: Path, intact: int = 3) -> Path:
    """``source`` (an MP3) remuxed with every frame after the first ``intact`` kept whole in its
    header and 0xff in all its other bytes: frames the demuxer finds and mp3float refuses."""
    with av.open(str(source)) as inp, av.open(str(path), "w", format="mp3") as out:
        stream = out.add_stream_from_template(inp.streams.audio[0])
        for i, packet in enumerate(inp.demux(inp.streams.audio[0])):
            if packet.size == 0:
                continue
            data = bytes(packet) if i < intact else bytes(packet)[:4] + b"\xff" * (packet.size - 4)
            garbled = av.Packet(data)
            garbled.pts, garbled.dts, garbled.time_base, garbled.duration = packet.pts, packet.dts, packet.time_base, packet.duration
            garbled.stream = stream
            out.mux(garbled)
    return path


def unknown_codec_webm(source: Path, path: Path) -> Path:
    """``source`` (an Opus WebM) with its codec id renamed to one no decoder has (same length)."""
    data = source.read_bytes()
    assert data.count(b"A_OPUS") == 1
    path.write_bytes(data.replace(b"A_OPUS", b"A_XYZS"))
    return path
