"""CLAP's audio tower: a window of samples to the log-mel "image" its Swin stack reads, then
the stack (:mod:`uform.plugins.swin`) and the MLP projection.

The math is docs/checkpoint-clap.md's, the same as transformers' ``ClapFeatureExtractor``
(``truncation="rand_trunc"``) followed by ``ClapAudioEncoder``'s ``batch_norm`` and
``reshape_mel2img``. The host fills a short recording's window by ``padding`` (:func:`fill`); a
long one keeps its first ``samples`` samples, where transformers crops at a random place. In
the graph: centred frames (reflect padding folded into the frames' ``Gather`` indices), the
Hann-windowed DFT folded on the frame's symmetry (:mod:`.power`, as the version-1 front end),
the Slaney mel bank, ``10·log10``, the folded BatchNorm, the bicubic stretch of the frames to
``spec_size · freq_ratio`` rows (a constant matrix), and the fold of those rows into a square
``[B, 1, spec_size, spec_size]`` (``spec_size`` is the stack's ``image_size``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from uform.core.config import choice, integer, number, only_fields
from uform.core.errors import CheckpointError
from uform.core.graph import GraphBuilder
from uform.core.plugin import TensorSpec, projection_tensors

from .. import swin
from ..media.window import Recording
from . import power
from .power import MAX_FRAME_VALUES

MEL_FLOOR = 1e-10  # transformers' mel_floor and power_to_db's min_value: -100 dB
PADDINGS = ("repeatpad", "repeat", "pad")
CUBIC_A = -0.75  # torch's bicubic kernel
FRONT_FIELDS = frozenset({"front", "sample_rate", "samples", "n_fft", "hop", "n_mels", "f_min", "f_max", "padding", "projection"})
FIELDS = FRONT_FIELDS | swin.SWIN_FIELDS


@dataclass(frozen=True)
class ClapFront:
    sample_rate: int
    samples: int
    n_fft: int
    hop: int
    n_mels: int
    f_min: float
    f_max: float
    padding: str
    spec_size: int

    @property
    def frames(self) -> int:
        """Centred frames: the window padded by ``n_fft // 2`` on both sides."""
        return 1 + self.samples // self.hop

    @property
    def bins(self) -> int:
        return self.n_fft // 2 + 1

    @property
    def freq_ratio(self) -> int:
        return self.spec_size // self.n_mels

    @property
    def rows(self) -> int:
        """Frames after the bicubic stretch: ``spec_size · freq_ratio``."""
        return self.spec_size * self.freq_ratio


def read_front(cfg: Mapping[str, Any], w: str, spec_size: int) -> ClapFront:
    """The front end's fields of ``towers.audio`` (``w``), each checked, naming the field;
    ``spec_size`` is the Swin stack's ``image_size``."""
    n_fft = integer(cfg, "n_fft", w, 2, 4096)
    rate = integer(cfg, "sample_rate", w, 1000, 384000)
    f = ClapFront(
        rate, integer(cfg, "samples", w, n_fft, 1 << 24), n_fft, integer(cfg, "hop", w, 1, 65536),
        integer(cfg, "n_mels", w, 1, 1024), number(cfg, "f_min", w, 0.0, rate / 2), number(cfg, "f_max", w, 0.0, rate / 2),
        choice(cfg, "padding", w, PADDINGS, "repeatpad"), spec_size,
    )  # fmt: skip
    if f.f_min >= f.f_max:
        raise CheckpointError(f"config field {w}.f_max: {f.f_max:g} Hz is not above f_min, {f.f_min:g} Hz")
    if f.n_mels > f.spec_size or f.n_mels * f.freq_ratio != f.spec_size:
        raise CheckpointError(f"config field {w}.n_mels: {f.n_mels} mel bins times a whole number must make image_size {f.spec_size}")
    if f.frames > f.rows:
        raise CheckpointError(f"config field {w}.samples: {f.frames} frames are more than the {f.rows} rows of image_size {f.spec_size}")
    return f


def front_tensors(f: ClapFront) -> dict[str, TensorSpec]:
    """The folded BatchNorm: ``x · scale + shift`` per mel bin."""
    return {"audio.mel_norm.scale": TensorSpec((f.n_mels,), mean=1.0), "audio.mel_norm.shift": TensorSpec((f.n_mels,))}


def slaney_mel(f: ClapFront) -> np.ndarray:
    """The Slaney mel filter bank, area-normalised, float64 [bins, n_mels] (librosa's
    ``filters.mel(htk=False, norm="slaney")``, transformers' ``mel_filter_bank(norm="slaney",
    mel_scale="slaney")``): bins at ``linspace(0, R // 2, bins)`` Hz."""

    def mel(hz: np.ndarray) -> np.ndarray:
        return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-300) / 1000.0) * (27.0 / np.log(6.4)), 3.0 * hz / 200.0)

    def hz(m: np.ndarray) -> np.ndarray:
        return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), 200.0 * m / 3.0)

    edges = hz(np.linspace(mel(np.array(f.f_min)), mel(np.array(f.f_max)), f.n_mels + 2))
    freqs = np.linspace(0, f.sample_rate // 2, f.bins)
    slopes = edges[None, :] - freqs[:, None]
    gaps = np.diff(edges)
    bank = np.maximum(0.0, np.minimum(-slopes[:, :-2] / gaps[:-1], slopes[:, 2:] / gaps[1:]))
    normed: np.ndarray = bank * (2.0 / (edges[2:] - edges[:-2]))[None, :]
    return normed


def bicubic(n_in: int, n_out: int) -> np.ndarray:
    """torch's ``interpolate(mode="bicubic", align_corners=True)`` along one axis as a matrix
    float64 [n_out, n_in]: source place ``i · (n_in − 1)/(n_out − 1)`` in float32, four taps of
    the cubic kernel (``A = −0.75``) at indices clamped to the edges."""
    if n_in == n_out:
        return np.eye(n_in)
    scale = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0)
    place = np.arange(n_out, dtype=np.float32) * scale
    base = np.floor(place)
    t = (place - base).astype(np.float32)
    a = np.float32(CUBIC_A)

    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        y: np.ndarray = ((a + 2) * x - (a + 3)) * x * x + 1
        return y

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        y: np.ndarray = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return y

    taps = (far(t + 1), near(t), near(1 - t), far(2 - t))
    out = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    for k, weight in enumerate(taps):
        np.add.at(out, (rows, np.clip(base.astype(np.int64) - 1 + k, 0, n_in - 1)), weight.astype(np.float64))
    return out


def frame_indices(f: ClapFront, offsets: np.ndarray) -> np.ndarray:
    """Window indices of frame ``k``'s samples ``offsets`` (int64 [frames, len(offsets)]) after
    centring: the window padded by ``n_fft // 2`` reflected samples each side (numpy's
    ``pad(mode="reflect")``, the edge sample not repeated)."""
    n = f.samples
    p = np.arange(f.frames)[:, None] * f.hop + offsets[None, :] - f.n_fft // 2
    p = np.abs(p)  # before the start: x[-p]
    reflected: np.ndarray = np.where(p > n - 1, 2 * (n - 1) - p, p).astype(np.int64)
    return reflected


def front_graph(b: GraphBuilder, samples: str, f: ClapFront) -> str:
    """``samples`` float32 [B, N] to the image [B, 1, spec_size, spec_size] in the graph's float type."""
    bank = slaney_mel(f)
    used = np.flatnonzero(bank.any(axis=1))  # the bins between f_min and f_max: 297 of 513 for laion's 50 … 14000 Hz
    spectrum = power.power(b, samples, f.n_fft, lambda offsets: frame_indices(f, offsets), used)  # [B, frames, used]
    mel = b.op("MatMul", spectrum, b.const(bank[used], "mel", np.float32))  # [B, frames, n_mels]
    db = b.op("Mul", power.ln(b, b.op("Max", mel, b.const(np.float32(MEL_FLOOR), "floor"))), b.const(np.float32(10 / np.log(10)), "db"))
    return layout_graph(b, db, f, 1)


def layout_graph(b: GraphBuilder, db: str, f: ClapFront, channels: int) -> str:
    """The log-mel ``db`` float32 [B, (channels,) frames, n_mels] to the image [B, channels,
    spec_size, spec_size] in the graph's float type: the folded BatchNorm, the stretch, the fold."""
    scale, shift = b.weight("audio.mel_norm.scale"), b.weight("audio.mel_norm.shift")
    if b.float_type != TensorProto.FLOAT:  # the front end runs in float32 whatever the stack's type
        scale, shift = b.op("Cast", scale, to=TensorProto.FLOAT), b.op("Cast", shift, to=TensorProto.FLOAT)
    x = b.op("Add", b.op("Mul", db, scale), shift)
    if f.frames != f.rows:
        x = b.op("MatMul", b.const(bicubic(f.frames, f.rows), "stretch", np.float32), x)  # [B, rows, n_mels]
    x = b.op("Reshape", x, b.ints([-1, f.freq_ratio, f.spec_size, f.n_mels]))
    x = b.op("Reshape", b.op("Transpose", x, perm=[0, 1, 3, 2]), b.ints([-1, channels, f.spec_size, f.spec_size]))
    return x if b.float_type == TensorProto.FLOAT else b.op("Cast", x, to=b.float_type)  # type: ignore[no-any-return]


def filled(prepare: Callable[[int], Recording], padding: str) -> Callable[[int], Recording]:
    """``prepare`` (an item's index to its recording) with the window filled by ``padding``."""

    def prepared(i: int) -> Recording:
        r = prepare(i)
        return dataclasses.replace(r, samples=fill(r.samples, r.kept, padding))

    return prepared


def fill(window: np.ndarray, kept: int, padding: str) -> np.ndarray:
    """The window of a recording of ``kept`` samples (the rest zeros), filled as transformers'
    ``padding`` does: ``repeatpad`` the recording repeated ``N // kept`` times then zeros,
    ``repeat`` repeated until the window is full, ``pad`` zeros (as it is)."""
    n = len(window)
    if padding == "pad" or kept == 0 or kept >= n:
        return window
    times = n // kept if padding == "repeatpad" else -(-n // kept)
    out = np.zeros(n, np.float32)
    tiled = np.tile(window[:kept], times)[:n]
    out[: len(tiled)] = tiled
    return out


@dataclass(frozen=True)
class ClapTower:
    """CLAP's audio tower (HTSAT): the front end, the Swin stack, the MLP projection."""

    front: ClapFront
    stack: swin.SwinTower

    @property
    def sample_rate(self) -> int:
        return self.front.sample_rate

    @property
    def samples(self) -> int:
        return self.front.samples


def read(cfg: Mapping[str, Any], w: str) -> ClapTower:
    """``towers.audio`` (``w``) with ``front: "clap"``; the file is version 2 (the core refuses
    ``front`` in a version-1 file)."""
    only_fields(cfg, w, FIELDS, "a CLAP audio tower")
    choice(cfg, "front", w, ("clap",), "clap")
    choice(cfg, "projection", w, ("mlp",), "mlp")
    stack = swin.read(cfg, w)
    if stack.channels != 1:
        raise CheckpointError(f"config field {w}.channels: {stack.channels}; the CLAP front end makes one channel (a fused CLAP's four are not supported)")
    f = read_front(cfg, w, stack.image_size)
    for what, count in (("frames × n_fft", f.frames * f.n_fft), ("frames × stretched rows", f.frames * f.rows)):
        if count > MAX_FRAME_VALUES:
            raise CheckpointError(f"config field {w}.samples: {what} is {count} values, over {MAX_FRAME_VALUES}")
    return ClapTower(f, stack)


def tensors(t: ClapTower, dimensions: int) -> dict[str, TensorSpec]:
    return front_tensors(t.front) | swin.tensors(t.stack, "audio") | projection_tensors("audio", t.stack.width, dimensions, "mlp")


def graph(t: ClapTower, dimensions: int, b: GraphBuilder) -> None:
    samples = b.input("samples", TensorProto.FLOAT, ["batch", t.samples])
    pooled = swin.swin_graph(b, front_graph(b, samples, t.front), t.stack, "audio")
    b.output(b.projected_embedding(pooled, "audio", "mlp"), "embeddings", None, ["batch", dimensions])
