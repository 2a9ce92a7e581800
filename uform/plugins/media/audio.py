"""Recordings to windows on the host: decode, mix to mono, resample, cut or pad.

Files decode with PyAV (FFmpeg) one packet at a time; every frame is mixed to mono as the
mean of its channels and resampled with FFmpeg's libswresample (the same resampler for
files and for buffers) until the window of ``samples`` samples at ``rate`` is full, so a
10-hour file costs what its first seconds cost. Truncation is judged against what the
container declares (docs/media.md, "Audio"). The audio plugin maps :func:`decode` and
:func:`resample` over the executor's threads.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import numpy as np

from uform.core.arena import RowsTape
from uform.core.errors import InputError, check_not_released
from uform.core.pipeline import check_batch

from . import id3, metadata, mp4, ogg, video
from .files import CUT_WHILE_OPENED, HeadKept, Source, falls_short

CHUNK = 1 << 14  # source samples gathered before one resampler call
TAIL = 64  # periods of zeros fed to the resampler before its flush
MAX_FAILED_PACKETS = 64  # undecodable packets in a row before a recording is refused
# FFmpeg probes a WAV's PCM for S/PDIF-wrapped DTS/AC-3 over up to 2500 packets, which is
# most of the time spent opening a WAV; one packet (16 KiB, several S/PDIF bursts) decides it.
OPEN_OPTIONS = {"max_probe_packets": "1"}


# -- mono and the window -------------------------------------------------------------------

# sample format (planar or not) → numpy type, and the scale that takes it to -1…1
_KINDS = {
    "u8": (np.uint8, 1 / 128), "s16": (np.int16, 1 / 32768), "s32": (np.int32, 1 / 2**31),
    "s64": (np.int64, 1 / 2**63), "flt": (np.float32, 1.0), "dbl": (np.float64, 1.0),
}  # fmt: skip


def mono(frame: Any) -> np.ndarray:
    """A decoded PyAV frame as float32 mono: channels averaged, integers scaled to -1…1.

    Reads the frame's planes in place (``to_ndarray`` would copy them into one array first)
    and sums channels one at a time (numpy's mean over a strided axis is ten times slower).
    """
    kind = frame.format.name.rstrip("p")
    if kind not in _KINDS:
        raise ValueError(f"unsupported sample format {frame.format.name}")
    dtype, scale = _KINDS[kind]
    n, channels = frame.samples, frame.layout.nb_channels
    if channels < 1:
        raise ValueError("a frame without channels")
    if frame.format.is_planar:
        planes = [np.frombuffer(p, dtype, n) for p in frame.planes]
    else:
        packed = np.frombuffer(frame.planes[0], dtype, n * channels).reshape(n, channels)
        planes = [packed[:, c] for c in range(channels)]
    x: np.ndarray = planes[0].astype(np.float32)
    for plane in planes[1:]:
        x += plane
    if channels > 1:
        x /= np.float32(channels)
    if kind == "u8":
        x -= 128
    if scale != 1.0:
        x *= np.float32(scale)
    return x


class Window:
    """The first ``samples`` samples at ``rate`` of a mono recording fed in chunks at any rate.

    Resampling is libswresample's default (through PyAV's ``AudioResampler``), run on
    chunks of up to ``CHUNK`` source samples; its output does not depend on the chunking. At the
    end the resampler gets ``TAIL`` periods of zeros (a period: ``ceil(rate / R) + 1`` source
    samples) and is flushed, and its output is cut to what the input's duration gives
    (``(n R + rate // 2) // rate``, ``n R / rate`` rounded half up): no tail sample is lost,
    even of a recording too short for libswresample to answer anything without the zeros.
    docs/checkpoint.md ("Audio tower") states this for a second implementation.
    """

    def __init__(self, rate: int, samples: int) -> None:
        self.rate, self.samples = rate, samples
        self.parts: list[np.ndarray] = []
        self.produced = 0
        self.pending: list[np.ndarray] = []
        self.pending_count = self.pending_rate = 0
        self.seconds = 0.0
        self.resampler: Any = None
        self.fed = self.made = 0  # source samples into, and samples out of, the resampler

    @property
    def full(self) -> bool:
        return self.produced >= self.samples

    def add(self, x: np.ndarray, rate: int) -> None:
        if rate < 1:
            raise ValueError(f"samples at {rate} Hz")
        if rate != self.pending_rate:
            self._drain(flush=True)
            self.pending_rate = rate
        self.pending.append(x)
        self.pending_count += len(x)
        self.seconds += len(x) / rate
        # resample a chunk at a time, or as soon as what is pending could finish the window
        if self.pending_count >= self.wanted(rate) or rate == self.rate:  # at the tower's rate nothing waits
            self._drain(flush=False)

    def wanted(self, rate: int) -> int:
        """Source samples at ``rate`` worth gathering before the next resampler call."""
        return min(CHUNK, -(-(self.samples - self.produced) * rate // self.rate) + TAIL)

    def _emit(self, x: np.ndarray) -> None:
        if not self.full and len(x):
            self.parts.append(x)
            self.produced += len(x)

    def _resample(self, x: np.ndarray, rate: int) -> list[np.ndarray]:
        import av

        if self.resampler is None:
            self.resampler = av.AudioResampler(format="fltp", layout="mono", rate=self.rate)
            self.fed = self.made = 0
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[None, :], np.float32), format="fltp", layout="mono")
        frame.sample_rate = rate
        return [out.to_ndarray()[0] for out in self.resampler.resample(frame)]

    def _drain(self, flush: bool) -> None:
        rate = self.pending_rate
        if self.pending:
            x = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
            self.pending, self.pending_count = [], 0
            if rate == self.rate:
                self._emit(x)
            else:
                made = self._resample(x, rate)
                self.fed += len(x)
                for y in made:
                    self.made += len(y)
                    self._emit(y)
        if flush and self.resampler is not None:
            tail = self._resample(np.zeros(TAIL * (-(-rate // self.rate) + 1), np.float32), rate)
            tail += [out.to_ndarray()[0] for out in self.resampler.resample(None)]
            due = (self.fed * self.rate + rate // 2) // rate - self.made
            if tail and due > 0:
                self._emit(np.concatenate(tail)[:due])
            self.resampler = None

    def finish(self) -> np.ndarray:
        """The window: float32 [samples], zero-padded when the recording is shorter."""
        if not self.full:
            self._drain(flush=True)
        out = np.zeros(self.samples, np.float32)
        got = np.concatenate(self.parts)[: self.samples] if self.parts else out[:0]
        out[: len(got)] = got
        return out


# -- reading items --------------------------------------------------------------------------


@dataclass(frozen=True)
class Recording:
    """One prepared item: its window and what reading it took."""

    samples: np.ndarray
    seconds: float
    padded: bool
    truncated: bool
    skipped_packets: int = 0


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or exc or type(exc).__name__)


def _wav_seconds(head: bytes) -> float | None:
    """Seconds a RIFF/WAVE header's ``data`` chunk declares (FFmpeg clamps it to the file)."""
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, byte_rate = 12, 0
    while pos + 8 <= len(head):
        kind, size = head[pos : pos + 4], int.from_bytes(head[pos + 4 : pos + 8], "little")
        if kind == b"fmt " and pos + 20 <= len(head):
            byte_rate = int.from_bytes(head[pos + 16 : pos + 20], "little")
        if kind == b"data":
            return size / byte_rate if byte_rate and size not in (0, 0xFFFFFFFF) else None
        pos += 8 + size + (size & 1)
    return None


def _flushes_samples(packet: Any) -> bool:
    """Whether the decoder, flushed by demux's last (empty) packet, still holds samples."""
    import av

    try:
        return any(frame.samples for frame in packet.decode())
    except av.FFmpegError:
        return False


def declared_seconds(container: Any, stream: Any, head: bytes) -> float | None:
    """How long the container says the audio is: the stream's duration, else the
    container's, or what a WAV header's ``data`` chunk declares (in ``head``, the file's
    first bytes) when that is longer."""
    found = None
    if stream.duration and stream.time_base:
        found = float(stream.duration * stream.time_base)
    elif container.duration:
        found = container.duration / 1_000_000
    wav = _wav_seconds(head) if container.format.name == "wav" else None
    return max(found or 0.0, wav or 0.0) or None


def decode(source: Source, rate: int, samples: int) -> Recording:
    """Decode ``source`` packet by packet until the window (``samples`` at ``rate``) is full;
    InputError naming the item if it is bad."""
    with ExitStack() as held:
        return _decode(source, _target(source, held), rate, samples)


def _target(source: Source, held: ExitStack) -> Any:
    """What FFmpeg reads of ``source``: from where its leading ID3v2 tags end (never read whole
    by FFmpeg), a FLAC's or WAV's metadata left out, after its MP4 tables are checked; files
    uform opens are closed by ``held``."""
    if source.stream is not None and not source._seekable():  # a one-way stream is read by FFmpeg alone
        return HeadKept(cast(BinaryIO, id3.Dropped(source.stream)))  # its first bytes kept, for a WAV header's sizes
    f = source.open()
    if source.stream is None:
        held.callback(f.close)
    frame = mp4.check(source, f) or _webm_frame(source, f)  # a video track: FFmpeg's probe decodes a frame of it
    if frame is not None and frame[0] * frame[1] > video.MAX_FRAME_PIXELS:
        raise source.fail(
            f"its video track's frames are {frame[0]}x{frame[1]}, over the limit of {video.MAX_FRAME_PIXELS} pixels "
            "(uform.plugins.media.video.MAX_FRAME_PIXELS) that FFmpeg's probe would decode one of"
        )
    try:
        start = id3.tags_end(f)
        # a FLAC's, WAV's or Ogg Opus or Vorbis file's tags and pictures left out too
        spliced = metadata.stripped(f, start) or ogg.stripped(f, start, metadata.SPLICE_FROM)
        headers = metadata.ogg_header_bytes(f, start) if spliced is None else 0  # any other Ogg file's held to a limit
    except ValueError as exc:
        raise source.fail(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a read that fails, of a path or of the caller's object
        raise source.fail(f"cannot read the file ({type(exc).__name__}: {exc})") from None
    if spliced is not None:
        return metadata.Spliced(f, *spliced)
    if headers > metadata.MAX_OGG_HEADER_BYTES:
        raise source.fail(
            f"its Ogg headers (tags, pictures) hold over {metadata.MAX_OGG_HEADER_BYTES} bytes, "
            "the limit of uform.plugins.media.metadata.MAX_OGG_HEADER_BYTES"
        )
    return id3.After(f, start) if start else source.target()


def _webm_frame(source: Source, f: BinaryIO) -> tuple[int, int] | None:
    """The largest frame a WebM's (Matroska's) video track declares in its Tracks, after its
    attachments (read whole by FFmpeg) are held to ``video.MAX_ATTACHED_BYTES``; None for any
    other file, after one read of 4 bytes."""
    try:
        f.seek(0)
        if video.sniff(f.read(4)) != "webm":
            f.seek(0)
            return None
        return video.webm_declared(source, f)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - a read that fails, of a path or of the caller's object
        raise source.fail(f"cannot read the file ({type(exc).__name__}: {exc})") from None


def _decode(source: Source, target: Any, rate: int, samples: int) -> Recording:
    import av

    index, path = source.index, source.path
    try:
        container: Any = av.open(target, metadata_errors="replace", options=OPEN_OPTIONS)
    except av.error.EOFError:
        raise InputError(index, CUT_WHILE_OPENED, path) from None
    except Exception as exc:  # noqa: BLE001 - FFmpeg, OS and metadata errors all mean "cannot open"
        raise InputError(index, f"is not a recording uform can decode ({_reason(exc)})", path) from None
    with container:
        if not container.streams.audio:
            raise InputError(index, "holds no audio stream", path)
        stream = container.streams.audio[0]
        if stream.codec_context is None:  # FFmpeg demuxes it but has no decoder for its codec
            raise InputError(index, "holds audio in a codec this FFmpeg cannot decode", path)
        window = Window(rate, samples)
        skipped = in_row = 0
        ended = True
        try:
            for packet in container.demux(stream):
                if window.full:  # filled to the sample by what came before: is there more?
                    if packet.size or _flushes_samples(packet):
                        ended = False
                        break
                    continue
                try:
                    frames = packet.decode()
                except av.FFmpegError:
                    skipped, in_row = skipped + 1, in_row + 1
                    if in_row > MAX_FAILED_PACKETS:
                        raise InputError(index, f"is corrupt: {in_row} packets in a row fail to decode", path) from None
                    continue
                in_row = 0
                for frame in frames:
                    window.add(mono(frame), frame.sample_rate)
                if window.produced > samples:
                    ended = False
                    break
            window_samples = window.finish()
        except InputError:
            raise
        except (av.FFmpegError, ValueError) as exc:
            raise InputError(index, f"cannot be decoded past {window.seconds:.3f} s ({_reason(exc)})", path) from None
        if window.seconds == 0:
            failed = f" ({skipped} packets failed to decode)" if skipped else ""
            raise InputError(index, f"holds no decodable audio{failed}", path)
        head = target.head if isinstance(target, HeadKept) else source.head()
        declared = declared_seconds(container, stream, head) if ended else None
        if declared is not None and falls_short(window.seconds, declared):
            raise InputError(
                index, f"is truncated or corrupt: its container declares {declared:.2f} s of audio, "
                f"only {window.seconds:.2f} s decode", path,
            )  # fmt: skip
    if not np.isfinite(window_samples).all():
        raise InputError(index, "holds NaN or infinite samples", path)
    return Recording(window_samples, window.seconds, window.produced < samples, not ended or window.produced > samples, skipped)


def resample(index: int, x: np.ndarray, source_rate: int, rate: int, samples: int) -> Recording:
    """The window of a mono float32 buffer at ``source_rate``, made exactly as for decoded files."""
    window = Window(rate, samples)
    start = 0
    while start < len(x) and not window.full:
        step = window.wanted(source_rate)
        window.add(x[start : start + step], source_rate)
        start += step
    made = window.finish()
    if not np.isfinite(made).all():
        raise InputError(index, "holds NaN or infinite samples")
    return Recording(made, window.seconds, window.produced < samples, start < len(x) or window.produced > samples)


def buffers(samples: Any) -> list[np.ndarray]:
    """Each recording of a sequence of buffers, or of a tape, as a 1-D float32 array."""
    if isinstance(samples, RowsTape):
        values, offsets = samples.values, samples.offsets
        if values.dtype != np.float32 or values.ndim != 1:
            raise TypeError(f"a tape of samples must hold 1-D float32 values, got {values.dtype} {values.shape}")
        rows = [values[offsets[i] : offsets[i + 1]] for i in range(len(samples))]
    else:
        if isinstance(samples, (str, bytes, bytearray, memoryview)) or (isinstance(samples, np.ndarray) and samples.ndim < 2):
            raise TypeError("samples must be a sequence of 1-D float32 buffers or a RowsTape; wrap one buffer in a list")
        check_batch(samples, "samples")
        rows = []
        for i, item in enumerate(samples):
            check_not_released(i, item)
            try:
                a = np.asarray(memoryview(item))
            except TypeError:
                raise InputError(i, f"expected a 1-D float32 buffer, got {type(item).__name__}") from None
            if a.dtype != np.float32 or a.ndim != 1:
                raise InputError(i, f"expected a 1-D float32 buffer, got {a.dtype} of shape {list(a.shape)}")
            rows.append(a)
    for i, a in enumerate(rows):
        if not len(a):
            raise InputError(i, "holds no samples")
    return rows
