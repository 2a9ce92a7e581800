"""The audio modality: recordings as log-mel patches through the ``audio`` tower.

Tensors and math are in docs/checkpoint.md ("Audio tower"); decoding rules in docs/media.md
("Audio"). The host decodes with PyAV (FFmpeg), one packet at a time, mixes every frame to
mono as the mean of its channels, resamples with FFmpeg's libswresample (the same
resampler for files and for ``audio_encode_samples``) and stops as soon as the tower's
window of ``N`` samples is full, so a 10-hour file costs what its first seconds cost. The
log-mel front end runs inside the ONNX graph: framing is a ``Gather``, the windowed DFT
(folded on the frame's symmetry, half the products) and the mel filters are constant
matrices built from the config.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from uform.core.arena import Arena, Encoded, RowsTape
from uform.core.config import Geometry, ModelConfig, integer
from uform.core.errors import CheckpointError, InputError
from uform.core.graph import GraphBuilder
from uform.core.hookspecs import hookimpl
from uform.core.pipeline import EncodeOptions, check_stats, encode
from uform.core.plugin import Modality, TensorSpec, Tower, stack_tensors
from uform.core.prepare import ItemBatches
from uform.core.runtime import Call
from uform.core.stats import EncodeStats

from ._sources import Source, sources

if TYPE_CHECKING:
    from typing_extensions import Unpack

LOG_FLOOR = 1e-6
MAX_ROWS = 16  # items per batch: small enough that decoding batch k + 1 overlaps computing k
SAMPLE_BUDGET = 1 << 21  # items x window samples per batch (8 MiB of float32)
CHUNK = 1 << 14  # source samples gathered before one resampler call
TAIL = 64  # periods of zeros fed to the resampler before its flush
MAX_FAILED_PACKETS = 64  # undecodable packets in a row before a recording is refused
MAX_RATE = 1_000_000
MAX_FRAME_VALUES = 1 << 26  # frames x n_fft a config may ask for
# FFmpeg probes a WAV's PCM for S/PDIF-wrapped DTS/AC-3 over up to 2500 packets, which is
# most of the time spent opening a WAV; one packet (16 KiB, several S/PDIF bursts) decides it.
OPEN_OPTIONS = {"max_probe_packets": "1"}
# an ended recording shorter than its container declares, by more than this, is truncated
TRUNCATION_SLACK_SECONDS, TRUNCATION_SLACK_SHARE = 0.25, 0.05


@dataclass
class AudioEncodeStats(EncodeStats):
    """Counters of audio calls.

    ``audio_seconds``: seconds of recording read (decoded from files, or taken from
    buffers), at the source rate; decoding stops at the window, so a long file counts
    about the window's length. ``seconds_decode``: wall time spent preparing batches
    (decode, mix, resample) on the prefetch thread and its workers; the part of it hidden
    behind ONNX Runtime is ``seconds_decode - seconds_preprocess``. ``padded_items``:
    recordings shorter than the window, zero-padded; ``truncated_items``: longer ones, cut.
    ``skipped_packets``: packets that failed to decode and were left out.
    """

    audio_seconds: float = 0.0
    seconds_decode: float = 0.0
    padded_items: int = 0
    truncated_items: int = 0
    skipped_packets: int = 0


@dataclass(frozen=True)
class AudioTower:
    geometry: Geometry
    sample_rate: int
    samples: int
    n_fft: int
    hop: int
    n_mels: int
    patch_frames: int

    @property
    def frames(self) -> int:
        return 1 + (self.samples - self.n_fft) // self.hop

    @property
    def tokens(self) -> int:
        return self.frames // self.patch_frames

    @property
    def bins(self) -> int:
        return self.n_fft // 2 + 1


def read(cfg: Mapping[str, Any], model: ModelConfig) -> AudioTower:
    """Check ``towers.audio``; the bounds keep the graph's constants (DFT 2 × [n_fft/2, bins],
    frame indices 2 × [frames, n_fft/2]) within a few hundred MiB whatever the file says."""
    w = "towers.audio"
    n_fft = integer(cfg, "n_fft", w, 2, 4096)
    t = AudioTower(
        Geometry.read(cfg, w), integer(cfg, "sample_rate", w, 1000, 384000), integer(cfg, "samples", w, n_fft, 1 << 24),
        n_fft, integer(cfg, "hop", w, 1, 65536), integer(cfg, "n_mels", w, 1, 1024), integer(cfg, "patch_frames", w, 1, 65536),
    )  # fmt: skip
    if t.tokens < 1:
        raise CheckpointError(f"config field {w}.patch_frames: {t.patch_frames} is more than the {t.frames} frames of the window")
    if t.frames * t.n_fft > MAX_FRAME_VALUES:
        raise CheckpointError(f"config field {w}.hop: {t.frames} frames of {t.n_fft} samples are over {MAX_FRAME_VALUES} values")
    return t


def tensors(t: AudioTower, model: ModelConfig) -> dict[str, TensorSpec]:
    w = t.geometry.width
    out = {
        "audio.patch.weight": TensorSpec((w, t.n_mels * t.patch_frames)),
        "audio.patch.bias": TensorSpec((w,)),
        "audio.cls": TensorSpec((w,)),
        "audio.pos.weight": TensorSpec((1 + t.tokens, w)),
    }
    out.update(stack_tensors("audio", t.geometry, model.dimensions))
    return out


def mel_filters(t: AudioTower) -> np.ndarray:
    """The triangular HTK mel filter bank, float64 [bins, n_mels] (no area normalisation)."""
    top = 2595.0 * np.log10(1.0 + t.sample_rate / 2 / 700.0)  # mel(0) = 0
    points = np.linspace(0.0, top, t.n_mels + 2)
    z = 700.0 * (10.0 ** (points / 2595.0) - 1.0)
    f = np.arange(t.bins)[:, None] * t.sample_rate / t.n_fft
    up = (f - z[None, :-2]) / (z[1:-1] - z[:-2])[None, :]
    down = (z[None, 2:] - f) / (z[2:] - z[1:-1])[None, :]
    return np.maximum(0.0, np.minimum(up, down))


def dft_halves(t: AudioTower) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The windowed real DFT folded on the frame's symmetry: ``(j, C, S)`` with
    ``j = 1 … ⌊n_fft/2⌋`` and ``C``, ``S`` float64 [len(j), bins] such that for a frame ``x``

        Re = (x[j] + x[n_fft − j]) @ C,   Im = (x[j] − x[n_fft − j]) @ S

    (the periodic Hann window is symmetric, ``w[n] = w[n_fft − n]``, and ``w[0] = 0``; at
    ``j = n_fft/2`` the pair is one sample counted twice, so that row of ``C`` is halved).
    Two products of half the size of the plain ``[n_fft, 2 bins]`` DFT matrix.
    """
    j = np.arange(1, t.n_fft // 2 + 1)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * j / t.n_fft)
    angle = 2 * np.pi * ((j[:, None] * np.arange(t.bins)[None, :]) % t.n_fft) / t.n_fft
    once = np.where(2 * j == t.n_fft, 0.5, 1.0)
    return j, np.cos(angle) * (window * once)[:, None], np.sin(angle) * window[:, None]


def graph(t: AudioTower, model: ModelConfig, b: GraphBuilder) -> None:
    samples = b.input("samples", TensorProto.FLOAT, ["batch", t.samples])
    used = t.tokens * t.patch_frames  # trailing frames are dropped, so never computed
    j, cos, sin = dft_halves(t)
    starts = np.arange(used)[:, None] * t.hop
    head = b.op("Gather", samples, b.const(starts + j, "frame_head", np.int64), axis=1)  # x[j], [B, used, n_fft/2]
    tail = b.op("Gather", samples, b.const(starts + t.n_fft - j, "frame_tail", np.int64), axis=1)  # x[n_fft − j]
    real = b.op("MatMul", b.op("Add", head, tail), b.const(cos, "dft_cos", np.float32))  # [B, used, bins]
    imag = b.op("MatMul", b.op("Sub", head, tail), b.const(sin, "dft_sin", np.float32))
    power = b.op("Add", b.op("Mul", real, real), b.op("Mul", imag, imag))
    mel = b.op("MatMul", power, b.const(mel_filters(t), "mel", np.float32))  # [B, used, n_mels]
    logmel = b.op("Log", b.op("Add", mel, b.const(np.float32(LOG_FLOOR), "floor")))
    if b.float_type != TensorProto.FLOAT:
        logmel = b.op("Cast", logmel, to=b.float_type)
    patches = b.op("Reshape", logmel, b.ints([-1, t.tokens, t.patch_frames, t.n_mels]))
    patches = b.op("Reshape", b.op("Transpose", patches, perm=[0, 1, 3, 2]), b.ints([-1, t.n_mels * t.patch_frames]))
    x = b.op("Reshape", b.linear(patches, "audio.patch"), b.ints([-1, t.tokens, t.geometry.width]))
    x = b.op("Add", x, b.op("Slice", b.weight("audio.pos.weight"), b.ints([1]), b.ints([1 + t.tokens])))
    hidden = b.transformer(b.prepend_class_token(x, "audio"), "audio", t.geometry)
    b.output(b.pooled_embedding(hidden, "audio"), "embeddings", None, ["batch", model.dimensions])


# -- host side: mono, resampling, the window ----------------------------------------------

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
    end the resampler gets ``TAIL`` periods of zeros and is flushed, and its output is cut
    to what the input's duration gives (``round(n R / rate)``): no tail sample is lost, even
    of a recording too short for libswresample to answer anything without the zeros.
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


def declared_seconds(container: Any, stream: Any, source: Source) -> float | None:
    """How long the container says the audio is: the stream's duration, else the
    container's, or what a WAV header's ``data`` chunk declares when that is longer."""
    found = None
    if stream.duration and stream.time_base:
        found = float(stream.duration * stream.time_base)
    elif container.duration:
        found = container.duration / 1_000_000
    wav = _wav_seconds(source.head()) if container.format.name == "wav" else None
    return max(found or 0.0, wav or 0.0) or None


def decode(source: Source, t: AudioTower) -> Recording:
    """Decode ``source`` packet by packet until the tower's window is full; InputError if bad."""
    import av

    index, path = source.index, source.path
    try:
        container: Any = av.open(source.target(), metadata_errors="replace", options=OPEN_OPTIONS)
    except av.error.EOFError:
        raise InputError(index, "is truncated: it ends before its headers do", path) from None
    except Exception as exc:  # noqa: BLE001 - FFmpeg, OS and metadata errors all mean "cannot open"
        raise InputError(index, f"is not a recording uform can decode ({_reason(exc)})", path) from None
    with container:
        if not container.streams.audio:
            raise InputError(index, "holds no audio stream", path)
        stream = container.streams.audio[0]
        window = Window(t.sample_rate, t.samples)
        skipped = in_row = 0
        ended = True
        try:
            for packet in container.demux(stream):
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
                if window.full:
                    ended = False
                    break
            samples = window.finish()
        except (av.FFmpegError, ValueError) as exc:
            raise InputError(index, f"cannot be decoded past {window.seconds:.3f} s ({_reason(exc)})", path) from None
        if window.seconds == 0:
            failed = f" ({skipped} packets failed to decode)" if skipped else ""
            raise InputError(index, f"holds no decodable audio{failed}", path)
        declared = declared_seconds(container, stream, source) if ended else None
        if declared is not None and window.seconds + max(TRUNCATION_SLACK_SECONDS, TRUNCATION_SLACK_SHARE * declared) < declared:
            raise InputError(
                index, f"is truncated or corrupt: its container declares {declared:.2f} s of audio, "
                f"only {window.seconds:.2f} s decode", path,
            )  # fmt: skip
    if not np.isfinite(samples).all():
        raise InputError(index, "holds NaN or infinite samples", path)
    return Recording(samples, window.seconds, window.produced < t.samples, not ended or window.produced > t.samples, skipped)


def resample(index: int, x: np.ndarray, rate: int, t: AudioTower) -> Recording:
    """The window of a mono float32 buffer at ``rate``, made exactly as for decoded files."""
    window = Window(t.sample_rate, t.samples)
    start = 0
    while start < len(x) and not window.full:
        step = window.wanted(rate)
        window.add(x[start : start + step], rate)
        start += step
    samples = window.finish()
    if not np.isfinite(samples).all():
        raise InputError(index, "holds NaN or infinite samples")
    return Recording(samples, window.seconds, window.produced < t.samples, start < len(x) or window.produced > t.samples)


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
        rows = []
        for i, item in enumerate(samples):
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


# -- verbs ------------------------------------------------------------------------------------


def _run(call: Call, count: int, prepare: Callable[[int], Recording], arena: Arena, stats: AudioEncodeStats | None, options: EncodeOptions) -> Encoded:
    """Encode ``count`` items, each window made by ``prepare(index)`` in the executor's threads."""
    t: AudioTower = call.parsed
    tally = AudioEncodeStats()

    def count_items(recordings: list[Recording]) -> None:
        tally.audio_seconds += math.fsum(r.seconds for r in recordings)
        tally.padded_items += sum(r.padded for r in recordings)
        tally.truncated_items += sum(r.truncated for r in recordings)
        tally.skipped_packets += sum(r.skipped_packets for r in recordings)

    items = ItemBatches(call, prepare, lambda recordings: {"samples": np.stack([r.samples for r in recordings])}, count_items)
    result = encode(call, count, items.thunks(count, max(1, min(MAX_ROWS, SAMPLE_BUDGET // t.samples))), arena, stats=stats, **options)
    if stats is not None:
        tally.seconds_decode = items.seconds
        stats.add(tally)
    return result


def audio_encode(
    call: Call, files: Iterable[Any], arena: Arena, /, *, stats: AudioEncodeStats | None = None, **options: Unpack[EncodeOptions]
) -> Encoded:
    """Decode recordings (paths, bytes, binary file objects) to windows and embed them."""
    check_stats(stats, AudioEncodeStats)
    items = sources(files, "recordings (paths, bytes or binary file objects)")
    t: AudioTower = call.parsed
    return _run(call, len(items), lambda i: decode(items[i], t), arena, stats, options)


def audio_encode_samples(
    call: Call,
    samples: Sequence[Any] | RowsTape,
    sample_rate: int,
    arena: Arena,
    /,
    *,
    stats: AudioEncodeStats | None = None,
    **options: Unpack[EncodeOptions],
) -> Encoded:
    """Resample 1-D float32 mono recordings at ``sample_rate`` to windows and embed them."""
    check_stats(stats, AudioEncodeStats)
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or not 1 <= sample_rate <= MAX_RATE:
        raise ValueError(f"sample_rate must be an integer in [1, {MAX_RATE}] Hz, got {sample_rate!r}")
    rows = buffers(samples)
    t: AudioTower = call.parsed
    return _run(call, len(rows), lambda i: resample(i, rows[i], int(sample_rate), t), arena, stats, options)


@hookimpl
def uform_modalities() -> Iterable[Modality]:
    front = {"sample_rate": 16000, "n_fft": 400, "hop": 160}
    presets = {
        "tiny": {"width": 64, "depth": 2, "heads": 2, "mlp_width": 128, "samples": 16000, "n_mels": 32, "patch_frames": 7, **front},
        "small": {"width": 256, "depth": 4, "heads": 4, "mlp_width": 1024, "samples": 80000, "n_mels": 64, "patch_frames": 8, **front},
        "base": {"width": 768, "depth": 12, "heads": 12, "mlp_width": 3072, "samples": 160000, "n_mels": 128, "patch_frames": 16, **front},
    }
    tower = Tower("audio", read, tensors, graph, presets)
    yield Modality("audio", tower, {"audio_encode": audio_encode, "audio_encode_samples": audio_encode_samples})
