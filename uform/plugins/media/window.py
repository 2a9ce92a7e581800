"""A recording's window: decoded frames or the caller's buffers made mono, resampled, cut or padded.

Every frame is mixed to mono as the mean of its channels (:func:`mono`) and resampled with FFmpeg's
libswresample (the same resampler for files and for buffers) into a :class:`Window` of ``samples``
samples at ``rate``, which says when it is full, so a 10-hour file costs what its first seconds
cost. :func:`resample` makes the window of a caller's buffer (:func:`buffers`) exactly as
:mod:`uform.plugins.media.audio` makes a file's (docs/media-audio.md, "From file to window").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from uform.core.arena import RowsTape
from uform.core.errors import InputError, check_not_released
from uform.core.pipeline import check_batch

CHUNK = 1 << 14  # source samples gathered before one resampler call
TAIL = 64  # periods of zeros fed to the resampler before its flush
NONFINITE = "holds NaN or infinite samples"
SAMPLE_RANGE = 1.0  # the tower's samples lie within [-1, 1] (decoders scale integers to it): beyond, the input may overflow

# sample format (planar or not) → numpy type, and the scale that takes it to -1…1
KINDS = {
    "u8": (np.uint8, 1 / 128), "s16": (np.int16, 1 / 32768), "s32": (np.int32, 1 / 2**31),
    "s64": (np.int64, 1 / 2**63), "flt": (np.float32, 1.0), "dbl": (np.float64, 1.0),
}  # fmt: skip


def mono(frame: Any) -> np.ndarray:
    """A decoded PyAV frame as float32 mono: channels averaged, integers scaled to -1…1.

    Reads the frame's planes in place (``to_ndarray`` would copy them into one array first)
    and sums channels one at a time (numpy's mean over a strided axis is ten times slower).
    """
    kind = frame.format.name.rstrip("p")
    if kind not in KINDS:
        raise ValueError(f"unsupported sample format {frame.format.name}")
    dtype, scale = KINDS[kind]
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


@dataclass(frozen=True)
class Recording:
    """One prepared item: its window and what reading it took. ``kept``: the window's samples
    that are the recording's (the rest, when it is shorter, are zeros)."""

    samples: np.ndarray
    seconds: float
    padded: bool
    truncated: bool
    kept: int
    skipped_packets: int = 0


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
        raise InputError(index, NONFINITE)
    return Recording(made, window.seconds, window.produced < samples, start < len(x) or window.produced > samples, min(window.produced, samples))


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


def surely_read(source_rate: int, rate: int, samples: int) -> int:
    """How many leading source samples at ``source_rate`` each reach a window of ``samples`` at
    ``rate``: all ``samples`` at the tower's rate; else every one whose resampled place lies in the
    window (``ceil(samples · source_rate / rate)``), which the resampler's filter always carries
    in: a NaN there makes the window NaN (found for 8,000 to 96,000 Hz; the filter carries in a
    few beyond, 15 to 95 source samples, which :func:`resample` refuses as it makes the window)."""
    return samples if source_rate == rate else -(-samples * source_rate // rate)


def check_finite(rows: list[np.ndarray], source_rate: int, rate: int, samples: int) -> None:
    """InputError naming the first buffer whose samples that surely reach its window hold NaN or
    infinity, before any is resampled or encoded; one whose only such samples lie past the
    window's span is refused by :func:`resample` as its window is made where the filter carries
    them in, or not at all."""
    read = surely_read(source_rate, rate, samples)
    for i, x in enumerate(rows):
        if not np.isfinite(x[:read]).all():
            raise InputError(i, NONFINITE)
