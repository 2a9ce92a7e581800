"""A fused CLAP's front end (``fusion: "aff"``, laion/clap-htsat-fused): a recording to the four
log-mel channels and the ``longer`` flag its tower reads, on the host.

transformers' ``ClapFeatureExtractor(truncation="fusion")``: the HTK mel bank (no area norm)
and, for a recording of up to ``samples`` samples, the log-mel of its window (filled by
``padding``) in all four channels, not longer; for a longer one, the log-mel of the WHOLE
recording, whose ``chunk`` = ``1 + samples // hop`` frame crops from the front, middle and back
thirds of the possible starts fill channels 1 to 3 and whose whole, shrunk to ``chunk`` frames
(bilinear, ``align_corners=False``), fills channel 0: longer. transformers draws each crop's
start at random; uform takes the middle of each third's starts (:func:`crop_starts`).
A recording is read to ``max_samples`` samples (the bound on the whole log-mel's memory); a
longer one is taken as its first ``max_samples`` samples. The log-mel is computed as
transformers' ``spectrogram`` does (float64 DFT of centred, reflect-padded frames, the complex
values kept as complex64, ``10·log10`` of the mel power floored at 1e-10), in blocks of frames.
The graph (:func:`graph`) folds the BatchNorm, stretches each channel's frames and lays each
out as the square image (:func:`.clap.layout_graph`, as for the unfused tower), then the fused
patch embedding (:mod:`uform.plugins.swin.fusion`), the Swin stack and the projection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto

from uform.core.config import choice, integer, only_fields
from uform.core.errors import CheckpointError
from uform.core.graph import GraphBuilder
from uform.core.plugin import TensorSpec

from .. import swin
from ..media.window import Recording
from ..swin import fusion as swin_fusion
from . import clap
from .clap import MEL_FLOOR, ClapFront, ClapTower, fill, layout_graph

FIELDS = clap.FIELDS | swin_fusion.FIELDS | {"fusion", "max_samples"}
MAX_WINDOWS = 64  # max_samples may be this many windows at most
SHRINK_BINS = 64  # transformers shrinks the whole log-mel to [chunk, 64] whatever its bins: a fused tower has 64
BLOCK = 512  # frames of the whole recording computed at once
DB_RANGE = (-100.0, 100.0)  # the log-mel of samples within [-1, 1] lies within it (from the floor, -100 dB, to under 60 dB)
INPUTS = "mels, the log-mel in dB of samples within [-1, 1], the range the tower documents"


@dataclass(frozen=True)
class Fusion:
    """A fused tower's front end: the window's (``front``) and the longest recording read."""

    front: ClapFront
    max_samples: int

    @property
    def chunk(self) -> int:
        return self.front.frames


@dataclass(frozen=True)
class FusedTower(ClapTower):
    """A fused CLAP's audio tower: this front end, the fused patch embedding
    (:mod:`uform.plugins.swin.fusion`), the Swin stack, the MLP projection."""

    fusion: Fusion = dataclasses.field(kw_only=True)
    ratio: int = dataclasses.field(kw_only=True)


def read(cfg: Mapping[str, Any], w: str) -> FusedTower:
    """``towers.audio`` (``w``) with ``fusion: "aff"``."""
    only_fields(cfg, w, FIELDS, "a fused CLAP audio tower")
    choice(cfg, "fusion", w, ("aff",), "aff")
    t = clap.read({k: v for k, v in cfg.items() if k not in FIELDS - clap.FIELDS}, w)
    if t.front.n_mels != SHRINK_BINS:
        raise CheckpointError(f"config field {w}.n_mels: {t.front.n_mels}; a fused tower's long recordings are shrunk to {SHRINK_BINS} mel bins, so it has {SHRINK_BINS}")
    most = integer(cfg, "max_samples", w, t.samples, min(MAX_WINDOWS * t.samples, 1 << 26))
    return FusedTower(t.front, t.stack, fusion=Fusion(t.front, most), ratio=swin_fusion.read_ratio(cfg, w, t.stack))


def tensors(t: FusedTower, dimensions: int) -> dict[str, TensorSpec]:
    return clap.tensors(t, dimensions) | swin_fusion.tensors(t.stack, t.ratio, "audio")


def graph(t: FusedTower, dimensions: int, b: GraphBuilder) -> None:
    mel = b.input("mels", TensorProto.FLOAT, ["batch", 4, t.fusion.chunk, t.front.n_mels])
    longer = b.input("longer", TensorProto.BOOL, ["batch"])
    patches = swin_fusion.patches(b, layout_graph(b, mel, t.front, 4), longer, t.stack, "audio")
    pooled = swin.swin_stack(b, patches, t.stack, "audio")
    b.output(b.projected_embedding(pooled, "audio", "mlp"), "embeddings", None, ["batch", dimensions])


def htk_mel(f: ClapFront) -> np.ndarray:
    """The HTK mel filter bank with no area norm, float64 [bins, n_mels] (transformers'
    ``mel_filter_bank(norm=None, mel_scale="htk")``, torchaudio's default)."""

    def mel(hz: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    edges = 700.0 * (10.0 ** (np.linspace(mel(np.array(f.f_min)), mel(np.array(f.f_max)), f.n_mels + 2) / 2595.0) - 1.0)
    freqs = np.linspace(0, f.sample_rate // 2, f.bins)
    slopes = edges[None, :] - freqs[:, None]
    gaps = np.diff(edges)
    bank: np.ndarray = np.maximum(0.0, np.minimum(-slopes[:, :-2] / gaps[:-1], slopes[:, 2:] / gaps[1:]))
    return bank


def log_mel(x: np.ndarray, f: ClapFront, bank: np.ndarray) -> np.ndarray:
    """The log-mel of the whole of ``x`` (float32 [n], n ≥ n_fft): float32 [1 + n // hop, n_mels];
    one float32 copy of ``x`` (reflect-padded), read as overlapping frames in place and widened
    to float64 a block at a time. Only the bins ``bank`` weighs are squared and summed (the rest
    would add exact zeros)."""
    half = f.n_fft // 2
    frames = sliding_window_view(np.pad(x, half, mode="reflect"), f.n_fft)[:: f.hop]
    used = np.flatnonzero(bank.any(axis=1))
    low, high = (int(used[0]), int(used[-1]) + 1) if len(used) else (0, 0)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(f.n_fft) / f.n_fft)
    out = np.empty((len(frames), f.n_mels), np.float32)
    for start in range(0, len(frames), BLOCK):
        spectrum = np.fft.rfft(frames[start : start + BLOCK] * window, axis=1)[:, low:high].astype(np.complex64)
        power = np.abs(spectrum, dtype=np.float64) ** 2
        out[start : start + BLOCK] = 10.0 * np.log10(np.maximum(MEL_FLOOR, power @ bank[low:high]))
    return out


def crop_starts(total: int, chunk: int) -> tuple[int, int, int]:
    """The first frames of the three crops of a log-mel of ``total`` frames: transformers splits
    the starts ``0 … total − chunk`` into three near-equal thirds (``numpy.array_split``; an empty
    third starts at 0) and draws one of each at random; uform takes each third's middle one,
    ``third[(len(third) − 1) // 2]``."""
    thirds = np.array_split(np.arange(total - chunk + 1), 3)
    starts = [int(t[(len(t) - 1) // 2]) if len(t) else 0 for t in thirds]
    return starts[0], starts[1], starts[2]


def shrink(mel: np.ndarray, chunk: int) -> np.ndarray:
    """``mel`` [total, bins] shrunk to ``chunk`` frames as torch's ``interpolate(mode="bilinear",
    align_corners=False)`` in float32 does: frame ``i`` reads source place
    ``max(0, (i + 0.5) · s − 0.5)``, ``s = float32(total / chunk)``, rounded once to float32 (a
    fused multiply-add: exact in float64, then rounded), between its two nearest frames."""
    total = len(mel)
    scale = np.float64(np.float32(total) / np.float32(chunk))
    place = np.maximum(((np.arange(chunk) + 0.5) * scale - 0.5).astype(np.float32), np.float32(0))
    low = place.astype(np.int64)
    high = np.minimum(low + 1, total - 1)
    up = np.clip(place - low.astype(np.float32), 0, 1).astype(np.float32)[:, None]
    out: np.ndarray = (np.float32(1) - up) * mel[low] + up * mel[high]
    return out


def mels(r: Recording, fu: Fusion, bank: np.ndarray) -> tuple[np.ndarray, bool]:
    """A recording (its first ``kept`` samples read up to ``max_samples``) as the tower's four
    channels, float32 [4, chunk, n_mels], and whether it is longer than the window."""
    f = fu.front
    if r.kept <= f.samples:
        window = fill(np.ascontiguousarray(r.samples[: f.samples]), r.kept, f.padding)
        one = log_mel(window, f, bank)
        return np.stack([one] * 4), False
    whole = log_mel(r.samples[: r.kept], f, bank)
    if len(whole) == fu.chunk:  # under one hop past the window: transformers takes the whole, as a short one
        return np.stack([whole] * 4), False
    crops = [whole[s : s + fu.chunk] for s in crop_starts(len(whole), fu.chunk)]
    return np.stack([shrink(whole, fu.chunk), *crops]), True


def prepared(prepare: Callable[[int], Recording], fu: Fusion) -> Callable[[int], tuple[Recording, np.ndarray, bool]]:
    """``prepare`` (an item's index to its recording read to ``max_samples``) with its channels."""
    bank = htk_mel(fu.front)

    def made(i: int) -> tuple[Recording, np.ndarray, bool]:
        r = prepare(i)
        channels, longer = mels(r, fu, bank)  # the recording's samples dropped: padded is now "shorter than the window"
        return dataclasses.replace(r, samples=r.samples[:0], padded=r.kept < fu.front.samples), channels, longer

    return made


def feeds(items: list[tuple[Recording, np.ndarray, bool]]) -> dict[str, np.ndarray]:
    """A batch's feeds: ``mels`` float32 [B, 4, chunk, n_mels] (dB) and ``longer`` bool [B]."""
    return {"mels": np.stack([m for _, m, _ in items]), "longer": np.array([lo for _, _, lo in items], np.bool_)}
