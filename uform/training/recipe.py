"""The recipe of the default model: procedural paired data, contrastive towers, a byte decoder.

Every tower is the PyTorch reference (:mod:`uform.exporters.reference`) of the runtime's
graphs, so trained weights mean the same in both. Inputs are prepared exactly as the
runtime prepares them: pictures go through file bytes and the image plugin's own decode
(:func:`uform.plugins.pictures.decode`), clips through MP4/WebM bytes and the video plugin's
own sampling (:func:`uform.plugins.clips.sample`), recordings are 16-bit samples read as
``s16 / 32768`` at the tower's rate (what the runtime reads from a WAV or FLAC at 16 kHz:
no resampling, the window is exactly the one-second recording).

Losses, summed each step: for images, clips and recordings a CLIP-style contrastive loss
with the caption text as the anchor (the distinct captions of a batch are the classes: the
media → text direction is a cross-entropy over them, the text → media direction a
cross-entropy whose target spreads evenly over the batch's items carrying that caption),
each with its own learnt logit scale; for the byte decoder, the cross-entropy of the answer
byte after each question. AdamW, linear warm-up then cosine decay. Afterwards the
checkpoint is written in BF16. A second phase (:func:`train_decoder`) trains the byte decoder
alone from that checkpoint on more varied questions, keeping every other tensor byte for
byte; it also runs alone from a given checkpoint (``phase="decoder"``, ``--phase decoder
--from CHECKPOINT``). Last, the choice temperatures are fitted per question group through
the runtime (:func:`uform.calibrate.calibrate`, labels smoothed).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from uform.core import checkpoint as ckpt
from uform.core.config import ModelConfig, make_config
from uform.demo import generate as g
from uform.demo import variety as v
from uform.demo.evaluate import CALIBRATION_STREAM, DECODER_STREAM, HELDOUT_STREAM, TRAINING_STREAM
from uform.demo.media import image_bytes, video_bytes
from uform.exporters.reference import ReferenceModel
from uform.exporters.reference.blocks import Block, Stack, causal_mask
from uform.exporters.reference.decoder import BEGIN, DecoderTower
from uform.exporters.reference.text import TextTower
from uform.exporters.reference.video import VideoTower

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
STACK = {"width": 128, "depth": 3, "heads": 4, "mlp_width": 256}
DIMENSIONS, CONTEXT = 64, 128
PHASES = ("all", "decoder", "reading", "clips", "pictures", "sounds", "questions")  # Settings.phase, --phase
# the phases that train one tower of the first phase alone (uform.training.alone), and its tower
ALONE = {"clips": "video", "pictures": "image", "sounds": "audio", "questions": "decoder"}
FRONT = ("n_fft", "hop", "n_mels")  # what Settings.audio_front (--audio-front) may set of the sound tower's config


def towers_in_bf16(enabled: bool) -> AbstractContextManager[Any]:
    """The media and text towers' forward passes under BF16 autocast when ``enabled``
    (``Settings.autocast``): their products in BF16 with float32 sums; what they answer is cast
    back to float32 by the caller, so every loss head (logits, cross-entropies, the auxiliary
    losses) and the decoder run in float32."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else nullcontext()


@contextmanager
def deterministic() -> Iterator[None]:
    """``torch.use_deterministic_algorithms`` within the block, as it was after it: on 2 threads
    a decoder trained without it differed from run to run (an op's reduction order), in the
    first phase and in the decoder's own phase alike. Without the fill of every fresh tensor
    that deterministic mode adds by default (NaN, to catch a read of memory no op wrote): the
    steps write all they read, the same bytes come out, and a first-phase step costs 4 % less."""
    fill = torch.utils.deterministic  # its flag is a module property that the stubs do not declare
    before, filled = torch.are_deterministic_algorithms_enabled(), getattr(fill, "fill_uninitialized_memory")  # noqa: B009
    torch.use_deterministic_algorithms(True)
    setattr(fill, "fill_uninitialized_memory", False)  # noqa: B010
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)
        setattr(fill, "fill_uninitialized_memory", filled)  # noqa: B010


def decoder_draw(settings: Settings) -> int:
    """The seed of the byte decoder's draw: ``settings.decoder_seed``, else ``settings.seed``."""
    return settings.seed if settings.decoder_seed is None else settings.decoder_seed


def default_config() -> ModelConfig:
    """The default model's geometry: every tower 128 wide, 3 blocks, 4 heads (docs/training.md)."""
    return make_config(
        DIMENSIONS,
        CONTEXT,
        {
            "text": {**STACK, "token_width": 0},
            "image": {**STACK, "image_size": 32, "patch_size": 8, "mean": MEAN, "std": STD},
            "video": {**STACK, "frames": 4, "image_size": 32, "patch_size": 8, "mean": MEAN, "std": STD},
            "audio": {**STACK, "sample_rate": g.SAMPLE_RATE, "samples": int(g.SAMPLE_RATE * g.AUDIO_SECONDS), "n_fft": 400,
                      "hop": 160, "n_mels": 32, "patch_frames": 7},  # fmt: skip
            "decoder": dict(STACK),
        },
        choice_temperatures=(1.0, 1.0, 1.0),
    )


@dataclass
class Settings:
    """What a run does; the defaults are the recipe's (docs/training.md)."""

    out: str
    seed: int = 0
    steps: int = 4400
    minutes: float | None = None  # stop early after this long (the schedule still assumes ``steps``)
    batch: int = 64  # pictures and clips a step (recordings on the steps that have them)
    image_factor: int = 2  # pictures a step: this many times ``batch`` (the seventh run's 2; 1 the fourth run's, docs/training.md)
    decoder_batch: int = 48  # questions a decoder step
    text_groups: int = 4  # a text step encodes its captions in this many groups of like length (the same embeddings as 1, less padding)
    decoder_row: int = 128  # > 0: the decoder's questions packed into rows of this many bytes in both phases (the same losses, less
    # padding); 0: the first phase's padded (decoder_loss), the decoder phase's rows of 256 bytes, as the fourth run's
    lr: float = 2e-3
    warmup: int = 100
    image_pool: int = 24000  # pictures decoded once through the runtime (canonical and varied), drawn from every step
    video_pool: int = 12000  # clips decoded once through the runtime, drawn from every step
    audio_pool: int = 5000  # varied recordings made once (through the runtime's resampler), drawn from every step
    voice_partials: int = v.PARTIALS  # the most partials a varied recording's voice has (variety._voice: 12 as before; more
    # draws each voice's count, bright and dull alike)
    canonical: float = 0.3  # share of recordings from the canonical renderer (the own suite's), the rest varied
    canonical_vision: float = 0.2  # share of pictures and clips from the canonical renderers after the curriculum (the fourth run's 0.4)
    curriculum: float = 0.25  # share of the steps, first, whose pictures and clips are all canonical
    audio_every: int = 2  # the audio tower's steps: every this many
    text_every: int = 3  # the text tower's steps (every meaning in one phrasing against its prototype)
    decoder_every: int = 2  # the byte decoder's steps
    jumbled: float = 0.35  # share of non-canonical captions that are jumbles (variety.jumbles)
    motion: float = 1.0  # weight of the video tower's auxiliary losses: where the shape is in each frame, and looking at it
    calibration_examples: int = 6000  # about 220 of them how-many questions: with fewer, all answered right, that group sat at the floor
    log_every: int = 25
    evaluate: bool = True
    config: ModelConfig = field(default_factory=default_config)
    # the second phase: the byte decoder alone, from the first phase's BF16 checkpoint (docs/training.md)
    phase: str = "all"  # "all": the towers' phase, then the decoder's; "decoder": the decoder's alone (and its reading stage),
    # from ``start``; "reading": the decoder's reading stage alone, from ``start``;
    # "clips", "pictures", "sounds" or "questions": the first phase's clip, picture or sound tower or its decoder alone, into
    # ``start`` (uform.training.alone)
    start: str | None = None  # the checkpoint every phase but "all" starts from
    clips_from_pictures: bool = False  # the clips phase: the clip tower starts from the checkpoint's picture tower (uform.training.alone)
    clip_stage: bool = False  # the whole recipe: the first phase trains no clip tower; the clip stage then trains it alone from
    # the first phase's picture tower (the clips phase with clips_from_pictures), before the decoder's phase
    variant: int | None = None  # the phases of one tower: seeds the tower's initialisation and data (default: ``seed``, which seeds the prototypes)
    decoder_seed: int | None = None  # the byte decoder's draw: its initialisation and every question it trains on, in every
    # phase (default: ``seed``); the towers, the held-out questions and calibration keep ``seed`` (docs/training.md)
    audio_front: dict[str, int] | None = None  # the sounds phase: the audio tower's n_fft, hop and n_mels in place of the checkpoint's
    decoder_steps: int = 2000  # 0 skips the phase (the recipe as it was before it)
    decoder_phase_batch: int = 64  # questions a step of the decoder phase
    decoder_lr: float = 1e-3
    decoder_warmup: int = 100
    # the decoder's reading stage, after its phase (uform.training.reading): every lettered list in a random order
    reading_steps: int = 2000  # 0 skips it (the seventh run's recipe)
    reading_letters: float = 0.4  # share of its questions that are lettered
    smoothing: bool = True  # calibration labels smoothed by 1/(n+2) a group (uform.calibrate.fit_temperatures): no group at the floor
    autocast: bool = False  # the first phase's and the clip stage's tower forwards in BF16 autocast, the losses in float32 (towers_in_bf16)


@dataclass
class Result:
    """What a run did: losses (first and last logged means), steps, seconds, calibration, evaluations."""

    out: str
    steps: int
    seconds: float
    first_loss: float
    last_loss: float
    losses: list[float]
    temperatures: tuple[float, ...] = ()
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)
    decoder_steps: int = 0  # steps of the decoder phase
    decoder_seconds: float = 0.0
    decoder_losses: list[float] = field(default_factory=list)  # the decoder phase's logged answer losses
    reading_steps: int = 0  # steps of the decoder's reading stage
    reading_seconds: float = 0.0
    reading_losses: list[float] = field(default_factory=list)
    clip_steps: int = 0  # steps of the clip stage (Settings.clip_stage)
    clip_seconds: float = 0.0
    heldout: dict[str, float] = field(default_factory=dict)  # the decoder's accuracy on held-out questions (stream 6) after its last stage


# -- inputs, as the runtime makes them ---------------------------------------------------

# what a flip, a transpose or playing a clip backwards does to its direction
_FLIP_X = {"left": "right", "right": "left", "up": "up", "down": "down"}
_FLIP_Y = {"left": "left", "right": "right", "up": "down", "down": "up"}
_TRANSPOSE = {"left": "up", "up": "left", "right": "down", "down": "right"}
_REVERSE = {"left": "right", "right": "left", "up": "down", "down": "up"}


PARTS = ("image", "video", "audio", "captions", "questions")  # Inputs' parts, each drawn from a stream of its own


class Inputs:
    """Batches of preprocessed media and their meanings, drawn from seeded generators (one a part).

    Pictures and clips come from pools decoded once through the runtime, half of each pool
    from the canonical renderers of :mod:`uform.demo.generate` and half from
    :mod:`uform.demo.variety`; a batch takes a given share from the canonical half, and each
    item is flipped or transposed at random (and a varied clip played backwards), its label
    following (a clip's direction turns with it). A share ``canonical`` of the recordings is made
    afresh by the canonical renderer, the rest drawn from a pool of varied ones. Every
    item's label is its meaning (its canonical caption's index among the modality's meanings).

    Each part draws from a stream of its own (:data:`PARTS`: ``[TRAINING_STREAM, seed, i]``), its
    pool and its batches alike, so a change to one part (a larger picture batch, a pool of
    another size) leaves what every other part draws as it was."""

    def __init__(self, config: ModelConfig, seed: int, video_pool: int, log: Callable[[str], None], *, audio_pool: int = 0,
                 image_pool: int = 0, canonical: float = 0.3, jumbled: float = 0.35, questions_seed: int | None = None,
                 partials: int = v.PARTIALS) -> None:  # fmt: skip
        from uform.plugins import video as video_plugin

        self.image_size = int(config.towers["image"]["image_size"])
        self.window = int(config.towers["audio"]["samples"])
        self.video_tower = video_plugin.read(config.towers["video"], config)
        self.canonical, self.jumbled = canonical, jumbled
        self.meanings = {m: v.meanings(m) for m in ("image", "video", "audio")}
        self.index = {m: {x.caption: i for i, x in enumerate(ms)} for m, ms in self.meanings.items()}
        video = self.meanings["video"]
        where = {x.attributes: i for i, x in enumerate(video)}
        self.turn = {name: np.array([where[(x.attributes[0], x.attributes[1], table[x.attributes[2]])] for x in video])
                     for name, table in (("x", _FLIP_X), ("y", _FLIP_Y), ("t", _TRANSPOSE), ("r", _REVERSE))}  # fmt: skip
        self.rngs = {part: np.random.default_rng([TRAINING_STREAM, seed, i]) for i, part in enumerate(PARTS, 1)}
        if questions_seed is not None:  # the decoder's questions from a draw of their own (Settings.decoder_seed)
            self.rngs["questions"] = np.random.default_rng([TRAINING_STREAM, questions_seed, PARTS.index("questions") + 1])
        started = time.perf_counter()
        pictures = [self._picture(i % 2 == 0) for i in range(max(image_pool, 2))]
        self.pictures = np.stack([p for p, _ in pictures])
        self.picture_labels = np.array([label for _, label in pictures], np.int64)
        log(f"decoded {len(pictures)} training pictures through the image plugin in {time.perf_counter() - started:.0f} s")
        started = time.perf_counter()
        clips = [self._clip(i) for i in range(max(video_pool, 2))]
        self.clip_frames = np.stack([c[0] for c in clips])
        self.clip_labels = np.array([c[1] for c in clips], np.int64)
        log(f"decoded {len(clips)} training clips through the video plugin in {time.perf_counter() - started:.0f} s")
        started = time.perf_counter()
        made = [v.sound(self.rngs["audio"], self.window, partials) for _ in range(audio_pool)]
        self.sound_windows = np.stack([w for w, _ in made]) if made else np.zeros((0, self.window), np.float32)
        self.sound_labels = np.array([self.index["audio"][m.caption] for _, m in made], np.int64)
        log(f"made {audio_pool} varied training recordings in {time.perf_counter() - started:.0f} s")

    def _picture(self, canonical: bool) -> tuple[np.ndarray, int]:
        from uform.plugins.pictures import decode as decode_picture
        from uform.plugins.sources import Source

        rng = self.rngs["image"]
        if canonical:
            p = g.picture(rng, int(rng.choice([32, 32, 48, 64, 128])))
            pixels, caption, quality = p.pixels, p.caption, 95
        else:
            pixels, m = v.picture(rng, int(rng.choice([32, 40, 48, 64, 96, 128])))
            caption, quality = m.caption, int(rng.integers(60, 96))
        data = image_bytes(pixels, "jpeg", quality=quality) if rng.random() < 0.3 else image_bytes(pixels, "png")
        return decode_picture(Source(0, None, data=data), self.image_size)[0], self.index["image"][caption]

    def _clip(self, i: int) -> tuple[np.ndarray, int]:
        from uform.plugins.clips import sample as sample_clip
        from uform.plugins.sources import Source

        rng = self.rngs["video"]
        fmt = "mp4" if i % 4 < 2 else "webm"
        if i % 2 == 0:  # the even clips are canonical, the odd ones varied
            c = g.clip(rng, int(rng.choice([32, 64])))
            data, caption = video_bytes(c.frames, fmt), c.caption
        else:
            vc = v.clip(rng)
            crf = int(rng.integers(14, 32)) if fmt == "mp4" else int(rng.integers(4, 30))
            gop = int(rng.choice([1, 3, 8, 30, 250]))
            data, caption = video_bytes(vc.frames, fmt, fps=vc.fps, gop=gop, crf=crf), vc.meaning.caption
        frames, _ = sample_clip(Source(0, None, data=data), self.video_tower.frames, self.video_tower.pixels.image_size)
        return frames, self.index["video"][caption]

    @staticmethod
    def _pick(rng: np.random.Generator, count: int, n: int, canonical: float) -> np.ndarray:
        """``n`` pool indices, a share ``canonical`` of them even (canonical), the rest odd (varied)."""
        half = max(count // 2, 1)
        odd = rng.random(n) >= canonical
        return np.minimum(2 * rng.integers(0, half, n) + odd, count - 1)

    def images(self, n: int, canonical: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rngs["image"]
        pick = self._pick(rng, len(self.picture_labels), n, canonical)
        out = self.pictures[pick].copy()
        for i, (flip_x, flip_y, transpose) in enumerate(rng.random((n, 3)) < 0.5):
            x = out[i][:, ::-1] if flip_x else out[i]
            x = x[::-1] if flip_y else x
            out[i] = x.transpose(1, 0, 2) if transpose else x
        return out, self.picture_labels[pick]

    def videos(self, n: int, canonical: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rngs["video"]
        pick = self._pick(rng, len(self.clip_labels), n, canonical)
        out, labels = self.clip_frames[pick].copy(), self.clip_labels[pick].copy()
        for i, (flip_x, flip_y, transpose, reverse) in enumerate(rng.random((n, 4)) < 0.5):
            reverse = reverse and pick[i] % 2 == 1  # a varied clip backwards is a clip; a canonical one would lead with its trail
            x = out[i][:, :, ::-1] if flip_x else out[i]
            x = x[:, ::-1] if flip_y else x
            x = x.transpose(0, 2, 1, 3) if transpose else x
            out[i] = x[::-1] if reverse else x
            for name, done in (("x", flip_x), ("y", flip_y), ("t", transpose), ("r", reverse)):
                labels[i] = self.turn[name][labels[i]] if done else labels[i]
        return out, labels

    def sounds(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rngs["audio"]
        fresh = int((rng.random(n) < self.canonical).sum()) if len(self.sound_labels) else n
        made = [g.sound(rng) for _ in range(fresh)]
        windows = [g.samples_float(s) for s in made]
        labels = [self.index["audio"][s.caption] for s in made]
        pick = rng.integers(0, len(self.sound_labels), n - fresh) if n > fresh else np.zeros(0, np.int64)
        data = np.concatenate([np.stack(windows) if windows else np.zeros((0, self.window), np.float32), self.sound_windows[pick]])
        return data, np.concatenate([np.array(labels, np.int64), self.sound_labels[pick]])

    def captions(self, modality: str) -> list[str]:
        """One phrasing of every meaning of ``modality`` (canonical, a paraphrase or a jumble), in meaning order."""
        return [v.phrase(self.rngs["captions"], m, canonical=0.3, jumbled=self.jumbled) for m in self.meanings[modality]]

    def questions(self, n: int) -> list[g.Question]:
        rng = self.rngs["questions"]
        return [g.question(rng) if rng.random() < 0.2 else v.question(rng, jumbled=self.jumbled) for _ in range(n)]


# -- model -------------------------------------------------------------------------------


def class_tokens_only(model: ReferenceModel) -> None:
    """Every tower but the decoder runs its last block for its class token alone: training
    reads nothing else of them (the same losses and gradients, a quarter of the last block;
    a first-phase step 0.75 -> 0.68 s on 2 Zen 1 cores, docs/training.md)."""
    for name, tower in model.towers.items():
        if name != "decoder" and isinstance(tower, Stack):
            tower.class_token_only = True


def initialise(model: nn.Module, seed: int) -> None:
    """As ``uform new`` does: normal(0, 0.02) for every tensor, LayerNorm weights 1 and biases 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln" in name or "ln_final" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)


MODALITIES = ("image", "video", "audio")


def prototypes(dimensions: int, seed: int) -> dict[str, torch.Tensor]:
    """Every meaning's target embedding, fixed for the run: the normalised sum of a random
    vector for each of its attributes' values (colour and shape share theirs between
    pictures and clips; counts, directions and the sounds' kind, pitch and rhythm have their
    own). Meanings that differ in one attribute of three are at cosine 2/3."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    vectors: dict[tuple[str, str], torch.Tensor] = {}

    def vector(kind: str, value: str) -> torch.Tensor:
        if (kind, value) not in vectors:
            vectors[kind, value] = torch.randn(dimensions, generator=generator)
        return vectors[kind, value]

    kinds = {"image": ("colour", "shape", "count"), "video": ("colour", "shape", "direction"), "audio": ("sound", "pitch", "rhythm")}
    out = {}
    for modality in MODALITIES:
        rows = [sum((vector(k, a) for k, a in zip(kinds[modality], m.attributes) if a), torch.zeros(dimensions)) for m in v.meanings(modality)]
        out[modality] = F.normalize(torch.stack(rows), dim=1)
    return out


def text_embeddings(tower: TextTower, captions: list[str], groups: int = 1) -> torch.Tensor:
    """The text tower's embeddings of ``captions``, in their order; with ``groups`` > 1 encoded
    in that many groups of like length (sorted by length: each group is padded only to its own
    longest), which gives the same embeddings with less padding."""
    if groups <= 1 or len(captions) < 2 * groups:
        embeddings, _ = tower.encode([c.encode() for c in captions])
        return embeddings
    data = [c.encode() for c in captions]
    order = sorted(range(len(data)), key=lambda i: len(data[i]))
    parts = [list(p) for p in np.array_split(np.array(order), groups)]
    encoded = torch.cat([tower.encode([data[i] for i in p])[0] for p in parts])
    return encoded[torch.argsort(torch.tensor([i for p in parts for i in p]))]


def contrastive(media: torch.Tensor, texts: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """CLIP-style loss over a closed caption space: ``texts`` holds one vector for every
    meaning (the prototypes), ``labels`` each item's meaning. Media → text is a cross-entropy
    over all the meanings; text → media, for each meaning present in the batch, a
    cross-entropy whose target spreads evenly over the items carrying it."""
    logits = scale.exp().clamp(max=100.0) * media @ texts.T  # [items, meanings]
    to_text = F.cross_entropy(logits, labels)
    present: torch.Tensor = torch.unique(labels)
    target = (labels[None, :] == present[:, None]).float()  # [present, items]
    target = target / target.sum(1, keepdim=True)
    to_media: torch.Tensor = -(target * logits.T[present].log_softmax(1)).sum(1).mean()
    return (to_text + to_media) / 2


def cosine(step: int, warmup: int, steps: int) -> float:
    """The recipe's learning-rate factor: linear warm-up over ``warmup`` steps, then a cosine
    decay to 2 % at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    done = (step - warmup) / max(1, steps - warmup)
    return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))


def optimise(total: torch.Tensor, optimiser: torch.optim.Optimizer, scheduler: Any, clipped: list[nn.Parameter]) -> None:
    """One step of a single tower's phase: the gradients of ``total``, clipped at norm 1 over
    ``clipped``, then the optimiser's step and the schedule's."""
    optimiser.zero_grad(set_to_none=True)
    total.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(clipped, 1.0)
    optimiser.step()
    scheduler.step()


def clip_losses(tower: VideoTower, where: nn.Linear, scale: torch.Tensor, target: torch.Tensor, data: np.ndarray,
                labelled: np.ndarray, weight: float, autocast: bool = False) -> dict[str, torch.Tensor]:  # fmt: skip
    """A batch of clips' losses: ``video``, the contrastive loss against the clips' prototypes
    ``target``, and with ``weight`` > 0 the auxiliary ``place`` (where the shape is in each
    frame, read from the class token's final state by ``where``) and ``look`` (attention on it).
    With ``autocast`` the tower runs in BF16 autocast, the losses in float32."""
    with towers_in_bf16(autocast):
        media, hidden, attention = video_forward(tower, torch.from_numpy(data))
    media, hidden, attention = media.float(), hidden.float(), attention.float()
    parts = {"video": contrastive(media, target, torch.from_numpy(labelled), scale)}
    if weight:
        place, seen, cover = motion(data, tower.patch_size)
        parts["place"] = weight * ((where(hidden) - place) ** 2 * seen).sum() / seen.sum().clamp(min=1)
        parts["look"] = weight * attention_loss(attention, cover)
    return parts


def video_forward(tower: VideoTower, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The video tower's embeddings, its class token's final hidden state, and the log of the
    class token's attention in the first block (``[B, heads, F, patches]``; what the
    auxiliary losses read). The tower's own forward, unrolled."""
    from uform.exporters.reference.blocks import normalize, with_class_token
    from uform.exporters.reference.image import patches

    b, f, s = frames.shape[0], frames.shape[1], frames.shape[2]
    x = tower.patch(patches(frames.reshape(b * f, s, s, 3), tower.patch_size, tower.mean, tower.std))
    x = x.reshape(b, f, -1, x.shape[-1]) + tower.pos.weight[1:] + tower.time.weight[:, None, :]
    x = with_class_token(x.reshape(b, -1, x.shape[-1]), tower.cls, tower.pos.weight[0])
    first = tower.blocks[0]
    assert isinstance(first, Block)
    heads, width = first.attn.heads, first.attn.head_dim
    q, k, _ = first.attn.qkv(first.ln1(x)).view(b, x.shape[1], 3, heads, width).permute(2, 0, 3, 1, 4)
    attention = ((q[:, :, :1] / math.sqrt(width)) @ k.transpose(-1, -2))[:, :, 0].log_softmax(-1)  # [B, heads, 1 + F·P]
    hidden = tower.run(x)
    return normalize(tower.projection(hidden[:, 0])), hidden[:, 0], attention[:, :, 1:].reshape(b, heads, f, -1)


def motion(frames: np.ndarray, patch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the moving shape is in each frame of each clip: the pixels that differ from the
    clip's per-pixel median over its frames. Answers its centre ``[B, 2F]`` (x and y in
    -1 … 1), a weight ``[B, 2F]`` of 0 where a frame shows too little of it, and the share of
    each patch it covers ``[B, F, patches]``."""
    f = torch.from_numpy(np.ascontiguousarray(frames)).float()  # [B, F, S, S, 3]
    moving = ((f - f.median(dim=1, keepdim=True).values).abs().sum(-1) > 60).float()  # [B, F, S, S]
    b, n, size = moving.shape[0], moving.shape[1], moving.shape[2]
    grid = torch.linspace(-1, 1, size)
    weight = moving.sum((2, 3))
    x = (moving * grid[None, None, None, :]).sum((2, 3)) / weight.clamp(min=1)
    y = (moving * grid[None, None, :, None]).sum((2, 3)) / weight.clamp(min=1)
    g = size // patch
    cover = moving.reshape(b, n, g, patch, g, patch).mean((3, 5)).reshape(b, n, g * g)
    return torch.stack([x, y], -1).reshape(b, -1), (weight > 3).float().repeat_interleave(2, 1), cover


def attention_loss(attention: torch.Tensor, cover: torch.Tensor) -> torch.Tensor:
    """Head ``h`` of the first block's class token is taught to look at the moving shape in
    frame ``h`` (for as many heads as frames): the cross-entropy of its attention against
    the patches the shape covers there, over the clips whose frame ``h`` shows it."""
    total, counted = torch.zeros(()), 0
    for h in range(min(attention.shape[1], attention.shape[2])):
        target = cover[:, h]
        shown = target.sum(-1) > 0.05
        if bool(shown.any()):
            target = target[shown] / target[shown].sum(-1, keepdim=True)
            total = total - (target * attention[shown, h, h]).sum(-1).mean()
            counted += 1
    return total / max(counted, 1)


def decoder_loss(tower: DecoderTower, questions: list[g.Question]) -> tuple[torch.Tensor, float]:
    """Next-byte cross-entropy over each question and its answer byte, plus the answer byte's
    own cross-entropy (the one ``text_choose`` reads); and the fraction answered right."""
    seqs = [(q.text + q.choices[q.answer]).encode()[-tower.context :] for q in questions]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    ids[:, 0] = BEGIN
    targets = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, 1 : len(s)] = torch.tensor(list(s[:-1]))
        targets[i, : len(s)] = torch.tensor(list(s))
    hidden = tower.run(tower.embed(ids) + tower.pos.weight[:width], causal_mask(width))
    logits = tower.head(hidden)  # [B, T, 256]: position j predicts byte j
    modelled = F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), ignore_index=-100)
    last = logits[torch.arange(len(seqs)), torch.tensor([len(s) - 1 for s in seqs])]
    answer = F.cross_entropy(last, torch.tensor([s[-1] for s in seqs]))
    right = sum(int(int(torch.argmax(last[i, [ord(c) for c in q.choices]])) == q.answer) for i, q in enumerate(questions))
    return modelled + answer, right / len(questions)


def save(model: ReferenceModel, config: ModelConfig, path: str | os.PathLike[str]) -> None:
    """The reference's weights as a uform checkpoint (BF16, names from the state dict)."""
    tensors = {
        name.removeprefix("towers."): value.detach().float().numpy().astype(ml_dtypes.bfloat16)
        for name, value in model.state_dict().items()
    }
    ckpt.save(path, config, tensors)


# -- the run -----------------------------------------------------------------------------


def train(settings: Settings, log: Callable[[str], None] = print) -> Result:
    """Train, save, calibrate and (``settings.evaluate``) evaluate; reproducible from the seed.

    Two phases. The towers' (:func:`train_towers`; ``phase="all"``): every tower learns on its
    own against fixed targets (:func:`prototypes`), the media towers mapping each item near its
    meaning's prototype, the text tower each phrasing there, and the byte decoder the
    questions; their losses share a step but no parameters. Its weights are written BF16. The
    decoder's (:func:`train_decoder`, ``decoder_steps`` > 0): the byte decoder alone, from that
    BF16 checkpoint, on more and more varied questions; every other tensor is kept byte for
    byte; then its reading stage (:func:`uform.training.reading.train_reading`,
    ``reading_steps`` > 0), every lettered list in a random order. With ``phase="decoder"``
    only the second phase runs, from the checkpoint ``start`` (whose towers are then the first
    phase's output: the shipped checkpoint's are); with ``phase="reading"`` only the reading
    stage, from ``start`` (a checkpoint after the decoder phase). Then the choice temperatures
    are fitted (:func:`calibrate`). With ``phase="clips"``, ``"pictures"`` or ``"sounds"`` the
    first phase's clip, picture or sound tower alone is trained into ``start``, which keeps its
    temperatures (:mod:`uform.training.alone`); with ``phase="questions"`` the first phase's
    decoder alone (the decoder that phase gives, bit for bit), then the temperatures are fitted."""
    if settings.phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(map(repr, PHASES))}, got {settings.phase!r}")
    if settings.phase != "all" and not settings.start:
        raise ValueError(f"the {settings.phase} phase starts from a checkpoint: give Settings.start (--from CHECKPOINT)")
    started = time.perf_counter()
    out = Path(settings.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_name(out.name + ".uncalibrated")
    if settings.phase in ALONE:
        from .alone import train_alone

        if settings.phase != "questions":  # a media tower: the checkpoint keeps its temperatures
            return finish(train_alone(settings, log, started), out, settings, log, started)
    try:
        if settings.phase == "questions":  # the first phase's decoder alone, deterministic as there, then calibrated
            with deterministic():
                result = train_alone(replace(settings, out=str(raw)), log, started)
            result.out = str(out)
            result.temperatures = calibrate(raw, out, settings, log)
            return finish(result, out, settings, log, started)
        if settings.phase == "all":
            steps, losses = train_towers(settings, raw, log, started)
            result = Result(str(out), steps, 0.0, losses[0], losses[-1], losses)
            source = raw
            if settings.clip_stage:
                clip_stage(raw, settings, log, result)
        else:
            result, source = Result(str(out), 0, 0.0, float("nan"), float("nan"), []), Path(str(settings.start))
        trained = False
        if settings.decoder_steps > 0 and settings.phase != "reading":
            train_decoder(source, raw, settings, log, result)
            source, trained = raw, True
        if settings.reading_steps > 0:
            from .reading import train_reading

            train_reading(source, raw, settings, log, result)
            source, trained = raw, True
        if not result.losses and trained:
            stage = result.decoder_losses or result.reading_losses
            result.first_loss, result.last_loss = stage[0], stage[-1]
        if not trained and settings.phase != "all":  # recalibration alone: the same tensors, the temperatures fitted afresh
            from uform.calibrate import write_temperatures

            with safe_open(str(source), framework="np") as f:
                groups = len(ModelConfig.from_metadata(f.metadata() or {}).choice_temperatures)
            write_temperatures(source, [1.0] * groups, raw)
        source = raw
        result.temperatures = calibrate(source, out, settings, log)
    finally:
        raw.unlink(missing_ok=True)
    return finish(result, out, settings, log, started)


def clip_stage(raw: Path, settings: Settings, log: Callable[[str], None], result: Result) -> None:
    """The clip stage (``settings.clip_stage``): the clip tower of the first phase's checkpoint
    ``raw`` trained alone from its picture tower (:func:`uform.training.alone.train_alone` with
    ``clips_from_pictures``: the first phase's clip steps, schedule, data and losses), written
    back into ``raw``, every other tensor byte for byte. Deterministic algorithms, as the phases."""
    from .alone import train_alone

    started = time.perf_counter()
    staged = raw.with_name(raw.name + ".clips")
    try:
        with deterministic():
            done = train_alone(replace(settings, phase="clips", start=str(raw), out=str(staged), variant=None, clips_from_pictures=True),
                               log, started)  # fmt: skip
        staged.replace(raw)
    finally:
        staged.unlink(missing_ok=True)
    result.clip_steps, result.clip_seconds = done.steps, time.perf_counter() - started
    log(f"clip stage: {done.steps} steps in {result.clip_seconds:.0f} s")


def finish(result: Result, out: Path, settings: Settings, log: Callable[[str], None], started: float) -> Result:
    """A run's seconds and log line, and (``settings.evaluate``) both suites' figures."""
    result.seconds = time.perf_counter() - started
    media = settings.phase in ALONE and settings.phase != "questions"  # a media tower keeps the temperatures
    done = "trained and saved" if media else "trained, saved and calibrated"
    log(f"{done} in {result.seconds:.0f} s: {out} ({out.stat().st_size} bytes)")
    if settings.evaluate:
        result.evaluations = evaluate_all(out, settings.seed, log)
    return result


@deterministic()
def train_towers(settings: Settings, raw: Path, log: Callable[[str], None], started: float) -> tuple[int, list[float]]:
    """The first phase: every tower, from the seed's initialisation, for ``settings.steps``
    steps; writes the BF16 checkpoint ``raw`` (uncalibrated) and answers the steps taken and
    the logged losses. Runs with ``torch.use_deterministic_algorithms`` (:func:`deterministic`)."""
    torch.manual_seed(settings.seed)
    config = settings.config
    model = ReferenceModel(config)
    initialise(model, settings.seed)
    if decoder_draw(settings) != settings.seed:  # the decoder as a run of its draw initialises it (the global RNG untouched)
        with torch.random.fork_rng(devices=[]):
            other = ReferenceModel(config)
        initialise(other, decoder_draw(settings))
        model.towers["decoder"].load_state_dict(other.towers["decoder"].state_dict())
    class_tokens_only(model)
    targets = prototypes(config.dimensions, settings.seed)
    every = torch.cat([targets[m] for m in MODALITIES])  # the text tower's classes: every meaning of every modality
    scales = nn.ParameterDict({m: nn.Parameter(torch.tensor(math.log(10.0))) for m in (*MODALITIES, "text")})
    where = nn.Linear(int(config.towers["video"]["width"]), 2 * int(config.towers["video"]["frames"]))  # the auxiliary head: the shape's place in each frame
    params = list(model.parameters()) + list(scales.parameters()) + list(where.parameters())
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    optimiser = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}],
                                  lr=settings.lr, betas=(0.9, 0.98))  # fmt: skip

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: cosine(step, settings.warmup, settings.steps))
    # each tower's gradients are clipped on their own, so one loss cannot starve another
    towers = model.towers
    clipped = [list(t.parameters()) for name, t in towers.items() if name != "video"]
    clipped += [list(towers["video"].parameters()) + list(where.parameters()), list(scales.parameters())]
    clips = not settings.clip_stage  # with the clip stage, the clip tower trains after this phase, from its picture tower
    inputs = Inputs(config, settings.seed, settings.video_pool if clips else 0, log, audio_pool=settings.audio_pool,
                    image_pool=settings.image_pool, canonical=settings.canonical, jumbled=settings.jumbled,
                    questions_seed=decoder_draw(settings), partials=settings.voice_partials)  # fmt: skip
    text_tower, decoder_tower, video_tower = towers["text"], towers["decoder"], towers["video"]
    assert isinstance(text_tower, TextTower) and isinstance(decoder_tower, DecoderTower) and isinstance(video_tower, VideoTower)
    losses: list[float] = []
    window: dict[str, list[float]] = {}
    accuracy: list[float] = []
    b = settings.batch
    step = 0
    model.train()
    for step in range(settings.steps):
        if settings.minutes is not None and time.perf_counter() - started > 60 * settings.minutes:
            log(f"stopping after {settings.minutes} minutes at step {step}")
            break
        canonical = 1.0 if step < settings.curriculum * settings.steps else settings.canonical_vision
        parts: dict[str, torch.Tensor] = {}
        data, labelled = inputs.images(settings.image_factor * b, canonical)
        with towers_in_bf16(settings.autocast):
            pictures = towers["image"](torch.from_numpy(data))
        parts["image"] = contrastive(pictures.float(), targets["image"], torch.from_numpy(labelled), scales["image"])
        if clips:
            data, labelled = inputs.videos(b, canonical)
            parts |= clip_losses(video_tower, where, scales["video"], targets["video"], data, labelled, settings.motion, settings.autocast)
        if step % settings.audio_every == 0:
            data, labelled = inputs.sounds(b)
            with towers_in_bf16(settings.autocast):
                sounds = towers["audio"](torch.from_numpy(data))
            parts["audio"] = contrastive(sounds.float(), targets["audio"], torch.from_numpy(labelled), scales["audio"])
        if step % settings.text_every == 0:
            with towers_in_bf16(settings.autocast):
                texts = text_embeddings(text_tower, [c for m in MODALITIES for c in inputs.captions(m)], settings.text_groups).float()
            parts["text"] = F.cross_entropy(scales["text"].exp().clamp(max=100.0) * texts @ every.T, torch.arange(len(every)))
        if step % settings.decoder_every == 0:
            asked = inputs.questions(settings.decoder_batch)
            step_loss = packed_decoder_step(decoder_tower, asked, settings.decoder_row) if settings.decoder_row else decoder_loss(decoder_tower, asked)
            parts["decoder"], right = step_loss
            accuracy.append(right)
        total = torch.stack(list(parts.values())).sum()
        optimiser.zero_grad(set_to_none=True)
        total.backward()  # type: ignore[no-untyped-call]
        for group in clipped:
            if any(p.grad is not None for p in group):
                torch.nn.utils.clip_grad_norm_(group, 1.0)
        optimiser.step()
        scheduler.step()
        for name, value in parts.items():
            window.setdefault(name, []).append(float(value.detach()))
        if (step + 1) % settings.log_every == 0 or step + 1 == settings.steps:
            means = {name: float(np.mean(values)) for name, values in window.items() if values}
            losses.append(sum(means.values()))
            log(f"step {step + 1}/{settings.steps}  loss {losses[-1]:.4f} ("
                + ", ".join(f"{name} {value:.3f}" for name, value in means.items())
                + f")  decoder accuracy {np.mean(accuracy) if accuracy else float('nan'):.3f}  {time.perf_counter() - started:.0f} s")  # fmt: skip
            window, accuracy = {}, []
    if any(window.values()):
        losses.append(sum(float(np.mean(values)) for values in window.values() if values))
    model.eval()
    save(model, config, raw)
    return step + 1, losses


# -- the second phase: the byte decoder alone ------------------------------------------------


def decoder_questions(rng: np.random.Generator, n: int, context: int) -> list[g.Question]:
    """``n`` questions for the decoder phase: ``generate.question`` (0.2), ``variety.question``
    with jumbles (0.2) and ``variety.decoder_question`` (0.6); a question whose text would not
    fit the decoder's context (the runtime would cut its description off) is drawn again."""
    out: list[g.Question] = []
    while len(out) < n:
        u = rng.random()
        q = g.question(rng) if u < 0.2 else v.question(rng, jumbled=0.35) if u < 0.4 else v.decoder_question(rng)
        if len(q.text.encode()) < context:
            out.append(q)
    return out


def _packed(tower: DecoderTower, questions: list[g.Question], row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed forward of :func:`packed_decoder_loss`: the next-byte cross-entropy over every
    byte, the logits after each question (in ``questions``' order, ``[N, 256]``) and the answer bytes."""
    seqs = [(q.text + q.choices[q.answer]).encode()[-tower.context :] for q in questions]
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i])):
        for r, used in enumerate(fill):
            if used + len(seqs[i]) <= row:
                rows[r].append(i)
                fill[r] += len(seqs[i])
                break
        else:
            rows.append([i])
            fill.append(len(seqs[i]))
    width = max(fill)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.full((len(rows), width), -100, dtype=torch.long)
    segment = torch.full((len(rows), width), -1, dtype=torch.long)
    ends: list[tuple[int, int]] = [(0, 0)] * len(seqs)
    for r, members in enumerate(rows):
        at = 0
        for k, i in enumerate(members):
            s, n = seqs[i], len(seqs[i])
            ids[r, at] = BEGIN
            ids[r, at + 1 : at + n] = torch.tensor(list(s[:-1]))
            targets[r, at : at + n] = torch.tensor(list(s))
            positions[r, at : at + n] = torch.arange(n)
            segment[r, at : at + n] = k
            ends[i] = (r, at + n - 1)
            at += n
    allowed = (segment[:, :, None] == segment[:, None, :]) & torch.ones(width, width, dtype=torch.bool).tril()
    allowed |= torch.eye(width, dtype=torch.bool)  # padding attends to itself (its outputs are never read)
    mask = torch.zeros(len(rows), 1, width, width).masked_fill(~allowed[:, None], -1e9)
    logits = tower.head(tower.run(tower.embed(ids) + tower.pos.weight[positions], mask))
    modelled = F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), ignore_index=-100)
    where = torch.tensor(ends)
    return modelled, logits[where[:, 0], where[:, 1]], torch.tensor([s[-1] for s in seqs])


def packed_decoder_loss(tower: DecoderTower, questions: list[g.Question], row: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`decoder_loss`'s two cross-entropies (every next byte, and the answer byte), with
    the questions packed into rows of up to ``row`` bytes (longest first, first fit), each
    question with its own positions from 0 and attending to itself alone: the same losses as
    one padded row each, with less padding. Answers (their sum, the answer byte's alone)."""
    modelled, last, answers = _packed(tower, questions, row)
    answer = F.cross_entropy(last, answers)
    return modelled + answer, answer


def packed_decoder_step(tower: DecoderTower, questions: list[g.Question], row: int = 128) -> tuple[torch.Tensor, float]:
    """:func:`decoder_loss` (its loss and the fraction answered right) with the questions packed
    as :func:`packed_decoder_loss` packs them: the first phase's decoder step."""
    modelled, last, answers = _packed(tower, questions, row)
    right = sum(int(int(torch.argmax(last[i, [ord(c) for c in q.choices]])) == q.answer) for i, q in enumerate(questions))
    return modelled + F.cross_entropy(last, answers), right / max(len(questions), 1)


def decoder_accuracy(tower: DecoderTower, questions: list[g.Question]) -> float:
    """The fraction of ``questions`` whose most likely choice byte (after the question) is the right one."""
    right = 0
    with torch.no_grad():
        for i in range(0, len(questions), 200):
            chunk = questions[i : i + 200]
            logits = tower.logits([q.text.encode() for q in chunk])
            right += sum(int(int(torch.argmax(logits[j, [ord(c) for c in q.choices]])) == q.answer) for j, q in enumerate(chunk))
    return right / max(len(questions), 1)


def heldout_questions(seed: int, n: int = 400) -> dict[str, list[g.Question]]:
    """Questions of stream ``[6, seed, 1]`` (no training or calibration draws from it), for
    reading a decoder before either suite: canonical, as the first phase phrases them, as the
    decoder phase does, in the calibration's phrasings (never trained), and lettered options
    in the first phase's phrasings listed in a random order (``options in any order``: the
    seventh run's decoder read 0.455 of them, docs/training.md), and of those the lists of all
    six colours (``six options in any order``: where decoders that find three options read
    0.34-0.57 and the shipped one 0.90). Each kind is drawn after the ones before it, so a
    kind added last leaves the others' questions as they were."""
    rng = np.random.default_rng([HELDOUT_STREAM, seed, 1])

    def lettered(options: int = 0) -> g.Question:
        while (q := v.question(rng, jumbled=0.35, shuffled=1.0)).group != g.LETTERS or len(q.choices) < options:
            pass
        return q

    makers: dict[str, Callable[[], g.Question]] = {
        "canonical": lambda: g.question(rng), "training": lambda: v.question(rng, jumbled=0.35),
        "decoder phase": lambda: v.decoder_question(rng), "unseen phrasings": lambda: v.question(rng, calibration=True),
        "options in any order": lettered, "six options in any order": lambda: lettered(6),
    }  # fmt: skip
    return {name: [make() for _ in range(n)] for name, make in makers.items()}


def neutral(config: ModelConfig) -> ModelConfig:
    """``config`` with every choice temperature 1.0, as an uncalibrated checkpoint carries them:
    calibration reads the logits back through ``text_choose`` at the checkpoint's temperatures,
    and at a low one (0.001, 0.02) the wrong choices' probabilities underflow and their logits are lost."""
    return ModelConfig.from_dict(dict(config.raw) | {"choice_temperatures": [1.0] * len(config.choice_temperatures)})


def train_decoder(source: Path, target: Path, settings: Settings, log: Callable[[str], None], result: Result | None = None) -> None:
    """The second phase: the byte decoder of checkpoint ``source`` alone, for
    ``settings.decoder_steps`` steps of ``decoder_phase_batch`` questions
    (:func:`decoder_questions`, stream ``[7, seed]``), with the first phase's optimiser
    (AdamW, β 0.9/0.98, weight decay 0.05 on matrices; ``decoder_lr`` after ``decoder_warmup``
    steps of warm-up, cosine decay to 2 %; gradients clipped at norm 1). Writes ``target``: every
    tensor of ``source`` but the decoder's byte for byte (BF16 → float32 → BF16 is exact), the
    decoder's trained, the choice temperatures 1.0 (:func:`neutral`: calibration fits them).
    Records the phase in ``result`` when given. Deterministic for a checkpoint, seed and thread
    count (:func:`decoder_stage`)."""

    def draw(rng: np.random.Generator, context: int) -> list[g.Question]:
        return decoder_questions(rng, settings.decoder_phase_batch, context)

    steps = settings.decoder_steps
    seconds, losses, heldout = decoder_stage(source, target, settings, log, DECODER_STREAM, steps, settings.decoder_warmup, draw,
                                             ("decoder step", "decoder phase"))  # fmt: skip
    if result is not None:
        result.decoder_steps, result.decoder_seconds, result.decoder_losses, result.heldout = steps, seconds, losses, heldout


@deterministic()
def decoder_stage(source: Path, target: Path, settings: Settings, log: Callable[[str], None], stream: int, steps: int, warmup: int,
                  draw: Callable[[np.random.Generator, int], list[g.Question]],
                  names: tuple[str, str]) -> tuple[float, list[float], dict[str, float]]:  # fmt: skip
    """``steps`` steps of the byte decoder of checkpoint ``source`` alone, on ``draw(rng,
    context)``'s questions a step (``rng``: stream ``[stream, decoder seed]``, :func:`decoder_draw`), packed into rows of
    ``decoder_row`` bytes: AdamW (β 0.9/0.98, weight decay 0.05 on matrices) at ``decoder_lr``
    after ``warmup`` steps, cosine decay to 2 %, gradients clipped at norm 1. Writes ``target``
    (every other tensor byte for byte, the choice temperatures 1.0: :func:`neutral`), reads the
    held-out questions and logs as ``names`` (a step's line, the stage's). Answers the seconds,
    the logged answer losses and the held-out accuracies. The decoder phase and the reading
    stage (:mod:`uform.training.reading`) are two of these. Runs with
    ``torch.use_deterministic_algorithms``, so that the same checkpoint, seed and thread count
    give the same decoder."""
    started = time.perf_counter()
    torch.manual_seed(decoder_draw(settings))
    model = ReferenceModel.from_checkpoint(source)
    tower = model.towers["decoder"]
    assert isinstance(tower, DecoderTower)
    rng = np.random.default_rng([stream, decoder_draw(settings)])
    params = list(tower.parameters())
    optimiser = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.05},
                                   {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                                  lr=settings.decoder_lr, betas=(0.9, 0.98))  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: cosine(step, warmup, steps))
    losses, window = [], []
    tower.train()
    for step in range(steps):
        total, answer = packed_decoder_loss(tower, draw(rng, tower.context), settings.decoder_row or 256)
        optimise(total, optimiser, scheduler, params)
        window.append(float(answer.detach()))
        if (step + 1) % settings.log_every == 0 or step + 1 == steps:
            losses.append(float(np.mean(window)))
            window = []
            if (step + 1) % (4 * settings.log_every) == 0 or step + 1 == steps:
                log(f"{names[0]} {step + 1}/{steps}  answer loss {losses[-1]:.4f}  {time.perf_counter() - started:.0f} s")
    tower.eval()
    save(model, neutral(model.config), target)
    seconds = time.perf_counter() - started
    heldout = {name: decoder_accuracy(tower, qs) for name, qs in heldout_questions(settings.seed).items()}
    log(f"{names[1]}: {steps} steps in {seconds:.0f} s; held-out accuracy "
        + ", ".join(f"{name} {value:.3f}" for name, value in heldout.items()))  # fmt: skip
    return seconds, losses, heldout


def calibrate(raw: Path, out: Path, settings: Settings, log: Callable[[str], None]) -> tuple[float, ...]:
    """Fit the temperatures of the three question groups through the runtime on fresh questions."""
    from uform.calibrate import Example
    from uform.calibrate import calibrate as fit

    rng = np.random.default_rng([CALIBRATION_STREAM, settings.seed])
    asked = [v.question(rng, calibration=True) for _ in range(settings.calibration_examples)]
    examples = [Example(q.text, q.choices, q.answer, q.group) for q in asked]
    report = fit(raw, examples, out, holdout=0.25, seed=settings.seed, groups=3, smoothing=settings.smoothing)
    log(f"calibration: temperatures {[round(t, 4) for t in report.temperatures]}, held-out ECE "
        f"{report.ece_before:.4f} -> {report.ece_after:.4f}, accuracy {report.accuracy:.4f}")  # fmt: skip
    return report.temperatures


def evaluate_all(path: Path, seed: int, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Both suites (``uform.demo.evaluate``, ``uform.demo.foreign.evaluate``) of the checkpoint
    with BF16 and with E4M3 weights: keys ``own bf16``, ``foreign bf16``, ``own e4m3``, ``foreign e4m3``."""
    from uform import Model, Scalar
    from uform.demo import evaluate, foreign

    out = {}
    for quantization in (Scalar.BF16, Scalar.E4M3):
        model = Model.load_ram(path, quantization=quantization)
        try:
            for suite, run in (("own", evaluate), ("foreign", foreign.evaluate)):
                figures = run(model, seed=seed).as_dict()
                out[f"{suite} {quantization.value}"] = figures
                log(f"evaluation ({suite}, {quantization.value}): "
                    + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))  # fmt: skip
        finally:
            model.close()
    return out
