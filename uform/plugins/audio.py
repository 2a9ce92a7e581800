"""The audio modality: recordings as log-mel patches through the ``audio`` tower.

Tensors and math are in docs/checkpoint.md ("Audio tower"); decoding rules in docs/media-audio.md
("Audio"). The host turns each recording into the tower's window of ``N`` samples
(:mod:`uform.plugins.media.audio`: decode, mix to mono, resample, in the executor's
threads). The log-mel front end runs inside the ONNX graph: framing is a ``Gather``, the
windowed DFT (folded on the frame's symmetry, half the products) and the mel filters are
constant matrices built from the config. A fused CLAP's tower reads a recording past its window
and makes its log-mel on the host (:mod:`uform.plugins.melfront.fusion`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from uform.core.arena import Arena, Encoded, RowsTape
from uform.core.config import GEOMETRY_FIELDS, STACK_ONLY, Geometry, ModelConfig, integer, only_fields, refuse_fields
from uform.core.errors import CheckpointError
from uform.core.graph import GraphBuilder
from uform.core.hookspecs import hookimpl
from uform.core.pipeline import EncodeOptions, check_stats, encode
from uform.core.plugin import Modality, TensorSpec, Tower, stack_tensors
from uform.core.prepare import ItemBatches
from uform.core.runtime import Call
from uform.core.stats import EncodeStats

from .media.audio import Recording, buffers, decode, resample
from .media.window import SAMPLE_RANGE, check_finite
from .media.files import sources
from .melfront import clap, fusion, power
from .melfront.clap import ClapTower
from .melfront.fusion import FusedTower
from .melfront.power import MAX_FRAME_VALUES

if TYPE_CHECKING:
    from typing_extensions import Unpack

LOG_FLOOR = 1e-6
MAX_ROWS = 16  # items per batch: small enough that decoding batch k + 1 overlaps computing k
SAMPLE_BUDGET = 1 << 21  # items x window samples per batch (8 MiB of float32)
MAX_RATE = 1_000_000


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


FIELDS = GEOMETRY_FIELDS | {"sample_rate", "samples", "n_fft", "hop", "n_mels", "patch_frames"}


def read(cfg: Mapping[str, Any], model: ModelConfig) -> AudioTower | ClapTower:
    """Check ``towers.audio``; the bounds keep the graph's constants (DFT 2 × [n_fft/2, bins],
    frame indices 2 × [frames, n_fft/2]) within a few hundred MiB whatever the file says.
    With ``front: "clap"`` it is CLAP's tower (:mod:`uform.plugins.melfront.clap`)."""
    w = "towers.audio"
    if "front" in cfg:
        return fusion.read(cfg, w) if "fusion" in cfg else clap.read(cfg, w)
    refuse_fields(cfg, w, STACK_ONLY, "the audio tower takes activation and layer_norm_eps of version 2's fields, no other")
    only_fields(cfg, w, FIELDS, "an audio tower")
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


def tensors(t: AudioTower | ClapTower, model: ModelConfig) -> dict[str, TensorSpec]:
    if isinstance(t, FusedTower):
        return fusion.tensors(t, model.dimensions)
    if isinstance(t, ClapTower):
        return clap.tensors(t, model.dimensions)
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


def graph(t: AudioTower | ClapTower, model: ModelConfig, b: GraphBuilder) -> None:
    if isinstance(t, FusedTower):
        return fusion.graph(t, model.dimensions, b)
    if isinstance(t, ClapTower):
        return clap.graph(t, model.dimensions, b)
    samples = b.input("samples", TensorProto.FLOAT, ["batch", t.samples])
    starts = np.arange(t.tokens * t.patch_frames)[:, None] * t.hop  # trailing frames are dropped, so never computed
    spectrum = power.power(b, samples, t.n_fft, lambda offsets: starts + offsets)  # [B, used, bins]
    mel = b.op("MatMul", spectrum, b.const(mel_filters(t), "mel", np.float32))  # [B, used, n_mels]
    logmel = power.ln(b, b.op("Add", mel, b.const(np.float32(LOG_FLOOR), "floor")))
    if b.float_type != TensorProto.FLOAT:
        logmel = b.op("Cast", logmel, to=b.float_type)
    patches = b.op("Reshape", logmel, b.ints([-1, t.tokens, t.patch_frames, t.n_mels]))
    patches = b.op("Reshape", b.op("Transpose", patches, perm=[0, 1, 3, 2]), b.ints([-1, t.n_mels * t.patch_frames]))
    x = b.op("Reshape", b.linear(patches, "audio.patch"), b.ints([-1, t.tokens, t.geometry.width]))
    x = b.op("Add", x, b.op("Slice", b.weight("audio.pos.weight"), b.ints([1]), b.ints([1 + t.tokens])))
    pooled = b.transformer(b.prepend_class_token(x, "audio"), "audio", t.geometry, pick=b.class_token)
    b.output(b.projected_embedding(pooled, "audio"), "embeddings", None, ["batch", model.dimensions])


# -- verbs ------------------------------------------------------------------------------------


def _run(call: Call, count: int, prepare: Callable[[int], Recording], arena: Arena, stats: AudioEncodeStats | None, options: EncodeOptions) -> Encoded:
    """Encode ``count`` items, each window made by ``prepare(index)`` in the executor's threads
    (a short recording's filled as CLAP's tower says)."""
    t: AudioTower | ClapTower = call.parsed
    tally = AudioEncodeStats()
    if isinstance(t, ClapTower) and not isinstance(t, FusedTower):  # a fused one fills its window as it makes its log-mel
        prepare = clap.filled(prepare, t.front.padding)

    def count_items(recordings: list[Recording]) -> None:
        tally.audio_seconds += math.fsum(r.seconds for r in recordings)
        tally.padded_items += sum(r.padded for r in recordings)
        tally.truncated_items += sum(r.truncated for r in recordings)
        tally.skipped_packets += sum(r.skipped_packets for r in recordings)

    items: ItemBatches[Any]
    if isinstance(t, FusedTower):  # the log-mel made on the host: a fused CLAP reads the whole recording
        items = ItemBatches(call, fusion.prepared(prepare, t.fusion), fusion.feeds, lambda made: count_items([r for r, _, _ in made]),
                            inputs=fusion.INPUTS, ranges={"mels": fusion.DB_RANGE})
    else:
        items = ItemBatches(call, prepare, lambda recordings: {"samples": np.stack([r.samples for r in recordings])}, count_items,
                            inputs=f"samples within [{-SAMPLE_RANGE:g}, {SAMPLE_RANGE:g}], the range the tower documents", ranges={"samples": (-SAMPLE_RANGE, SAMPLE_RANGE)})
    result = encode(call, count, items.thunks(count, max(1, min(call.rows(MAX_ROWS), call.rows(SAMPLE_BUDGET) // t.samples))), arena, stats=stats, **options)
    if stats is not None:
        tally.seconds_decode = items.seconds
        stats.add(tally)
    return result


def _reach(t: AudioTower | ClapTower) -> int:
    """Samples of a recording read: the window's, or a fused CLAP's ``max_samples``."""
    return t.fusion.max_samples if isinstance(t, FusedTower) else t.samples


def audio_encode(
    call: Call, files: Iterable[Any], arena: Arena, /, *, stats: AudioEncodeStats | None = None, **options: Unpack[EncodeOptions]
) -> Encoded:
    """Decode recordings (paths, bytes, binary file objects) to windows and embed them."""
    check_stats(stats, AudioEncodeStats)
    items = sources(files, "recordings (paths, bytes or binary file objects)")
    t: AudioTower | ClapTower = call.parsed
    return _run(call, len(items), lambda i: decode(items[i], t.sample_rate, _reach(t)), arena, stats, options)


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
    t: AudioTower | ClapTower = call.parsed
    check_finite(rows, int(sample_rate), t.sample_rate, _reach(t))  # before any batch: it was found after the items before it were encoded
    return _run(call, len(rows), lambda i: resample(i, rows[i], int(sample_rate), t.sample_rate, _reach(t)), arena, stats, options)


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
