"""The recipe of the default model: procedural paired data, contrastive towers, a byte decoder.

Every tower is the PyTorch reference (:mod:`uform.exporters.reference`) of the runtime's
graphs, so trained weights mean the same in both. Inputs are prepared exactly as the
runtime prepares them: pictures go through file bytes and the image plugin's own decode
(:func:`uform.plugins.image.decode`), clips through MP4/WebM bytes and the video plugin's
own sampling (:func:`uform.plugins.video.sample`), recordings are 16-bit samples read as
``s16 / 32768`` at the tower's rate (what the runtime reads from a WAV or FLAC at 16 kHz:
no resampling, the window is exactly the one-second recording).

Losses, summed each step: for images, clips and recordings a CLIP-style contrastive loss
with the caption text as the anchor (the distinct captions of a batch are the classes: the
media → text direction is a cross-entropy over them, the text → media direction a
cross-entropy whose target spreads evenly over the batch's items carrying that caption),
each with its own learnt logit scale; for the byte decoder, the cross-entropy of the answer
byte after each question. AdamW, linear warm-up then cosine decay. Afterwards the
checkpoint is written in BF16, and the choice temperatures are fitted per question group
through the runtime (:func:`uform.calibrate.calibrate`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from uform.core import checkpoint as ckpt
from uform.core.config import ModelConfig, make_config
from uform.demo import generate as g
from uform.demo import variety as v
from uform.demo.evaluate import CALIBRATION_STREAM, TRAINING_STREAM
from uform.demo.media import image_bytes, video_bytes
from uform.exporters.reference import ReferenceModel
from uform.exporters.reference.blocks import causal_mask
from uform.exporters.reference.decoder import BEGIN, DecoderTower
from uform.exporters.reference.text import TextTower

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
STACK = {"width": 128, "depth": 3, "heads": 4, "mlp_width": 256}
DIMENSIONS, CONTEXT = 64, 128


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
    """What a run does; the defaults are the shipped model's."""

    out: str
    seed: int = 0
    steps: int = 2800
    minutes: float | None = None  # stop early after this long (the schedule still assumes ``steps``)
    batch: int = 64  # items of each modality a step
    decoder_batch: int = 48  # questions a step
    lr: float = 2e-3
    warmup: int = 100
    video_pool: int = 6000  # clips decoded once through the runtime, drawn from every step
    audio_pool: int = 5000  # varied recordings made once (through the runtime's resampler), drawn from every step
    canonical: float = 0.3  # share of recordings from the canonical renderer (the own suite's), the rest varied
    canonical_vision: float = 0.5  # share of pictures and clips from the canonical renderers
    calibration_examples: int = 1200
    log_every: int = 25
    evaluate: bool = True
    config: ModelConfig = field(default_factory=default_config)


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


# -- inputs, as the runtime makes them ---------------------------------------------------


class Inputs:
    """Batches of preprocessed media and their meanings, drawn from one seeded generator.

    A share ``canonical`` of each modality's items comes from the canonical renderers of
    :mod:`uform.demo.generate`, the rest from :mod:`uform.demo.variety`; every item's label is
    its meaning (its canonical caption's index among the modality's meanings)."""

    def __init__(self, config: ModelConfig, seed: int, video_pool: int, log: Callable[[str], None], *, audio_pool: int = 0,
                 canonical: float = 0.3, canonical_vision: float = 0.5) -> None:  # fmt: skip
        from uform.plugins import image as image_plugin
        from uform.plugins import video as video_plugin

        self.image_plugin, self.video_plugin = image_plugin, video_plugin
        self.image_size = int(config.towers["image"]["image_size"])
        self.window = int(config.towers["audio"]["samples"])
        self.video_tower = video_plugin.read(config.towers["video"], config)
        self.canonical, self.canonical_vision = canonical, canonical_vision
        self.meanings = {m: v.meanings(m) for m in ("image", "video", "audio")}
        self.index = {m: {x.caption: i for i, x in enumerate(ms)} for m, ms in self.meanings.items()}
        self.rng = np.random.default_rng([TRAINING_STREAM, seed])
        started = time.perf_counter()
        clips = [self._clip(i) for i in range(video_pool)]
        self.clip_frames = np.stack([c[0] for c in clips])
        self.clip_labels = np.array([c[1] for c in clips])
        log(f"decoded {video_pool} training clips through the video plugin in {time.perf_counter() - started:.0f} s")
        started = time.perf_counter()
        made = [v.sound(self.rng, self.window) for _ in range(audio_pool)]
        self.sound_windows = np.stack([w for w, _ in made]) if made else np.zeros((0, self.window), np.float32)
        self.sound_labels = np.array([self.index["audio"][m.caption] for _, m in made], np.int64)
        log(f"made {audio_pool} varied training recordings in {time.perf_counter() - started:.0f} s")

    def _clip(self, i: int) -> tuple[np.ndarray, int]:
        from uform.plugins.sources import Source

        fmt = "mp4" if i % 2 == 0 else "webm"
        if self.rng.random() < self.canonical_vision:
            c = g.clip(self.rng, int(self.rng.choice([32, 64])))
            data, caption = video_bytes(c.frames, fmt), c.caption
        else:
            vc = v.clip(self.rng)
            crf = int(self.rng.integers(14, 32)) if fmt == "mp4" else int(self.rng.integers(4, 30))
            gop = int(self.rng.choice([1, 3, 8, 30, 250]))
            data, caption = video_bytes(vc.frames, fmt, fps=vc.fps, gop=gop, crf=crf), vc.meaning.caption
        frames, _ = self.video_plugin.sample(Source(0, None, data=data), self.video_tower)
        return frames, self.index["video"][caption]

    def images(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        from uform.plugins.sources import Source

        out, labels = [], []
        for _ in range(n):
            if self.rng.random() < self.canonical_vision:
                p = g.picture(self.rng, int(self.rng.choice([32, 32, 48, 64, 128])))
                pixels, caption, quality = p.pixels, p.caption, 95
            else:
                pixels, m = v.picture(self.rng, int(self.rng.choice([32, 40, 48, 64, 96, 128])))
                caption, quality = m.caption, int(self.rng.integers(60, 96))
            data = image_bytes(pixels, "jpeg", quality=quality) if self.rng.random() < 0.3 else image_bytes(pixels, "png")
            out.append(self.image_plugin.decode(Source(0, None, data=data), self.image_size)[0])
            labels.append(self.index["image"][caption])
        return np.stack(out), np.array(labels, np.int64)

    def videos(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        pick = self.rng.integers(0, len(self.clip_labels), n)
        return self.clip_frames[pick], self.clip_labels[pick]

    def sounds(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        fresh = int((self.rng.random(n) < self.canonical).sum()) if len(self.sound_labels) else n
        made = [g.sound(self.rng) for _ in range(fresh)]
        windows = [g.samples_float(s) for s in made]
        labels = [self.index["audio"][s.caption] for s in made]
        pick = self.rng.integers(0, len(self.sound_labels), n - fresh) if n > fresh else np.zeros(0, np.int64)
        data = np.concatenate([np.stack(windows) if windows else np.zeros((0, self.window), np.float32), self.sound_windows[pick]])
        return data, np.concatenate([np.array(labels, np.int64), self.sound_labels[pick]])

    def captions(self, modality: str) -> list[str]:
        """One phrasing of every meaning of ``modality`` (canonical or a paraphrase), in meaning order."""
        return [v.phrase(self.rng, m, canonical=0.5) for m in self.meanings[modality]]

    def questions(self, n: int) -> list[g.Question]:
        return [g.question(self.rng) if self.rng.random() < 0.25 else v.question(self.rng) for _ in range(n)]


# -- model -------------------------------------------------------------------------------


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


def text_embeddings(tower: TextTower, captions: list[str]) -> torch.Tensor:
    embeddings, _ = tower.encode([c.encode() for c in captions])
    return embeddings


def contrastive(media: torch.Tensor, texts: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """CLIP-style loss over a closed caption space: ``texts`` holds one phrasing of every
    meaning, ``labels`` each item's meaning. Media → text is a cross-entropy over all the
    meanings; text → media, for each meaning present in the batch, a cross-entropy whose
    target spreads evenly over the items carrying it."""
    logits = scale.exp().clamp(max=100.0) * media @ texts.T  # [items, meanings]
    to_text = F.cross_entropy(logits, labels)
    present: torch.Tensor = torch.unique(labels)
    target = (labels[None, :] == present[:, None]).float()  # [present, items]
    target = target / target.sum(1, keepdim=True)
    to_media: torch.Tensor = -(target * logits.T[present].log_softmax(1)).sum(1).mean()
    return (to_text + to_media) / 2


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
    """Train, save, calibrate and (``settings.evaluate``) evaluate; reproducible from the seed."""
    torch.manual_seed(settings.seed)
    started = time.perf_counter()
    config = settings.config
    model = ReferenceModel(config)
    initialise(model, settings.seed)
    scales = nn.ParameterDict({m: nn.Parameter(torch.tensor(math.log(10.0))) for m in ("image", "video", "audio")})
    params = list(model.parameters()) + list(scales.parameters())
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    optimiser = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}],
                                  lr=settings.lr, betas=(0.9, 0.98))  # fmt: skip

    def rate(step: int) -> float:
        if step < settings.warmup:
            return (step + 1) / settings.warmup
        done = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
        return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, rate)
    # each tower's gradients are clipped on their own, so one loss cannot starve another
    clipped = [list(t.parameters()) for t in model.towers.values()] + [list(scales.parameters())]
    inputs = Inputs(config, settings.seed, settings.video_pool, log, audio_pool=settings.audio_pool, canonical=settings.canonical,
                    canonical_vision=settings.canonical_vision)
    towers = model.towers
    text_tower, decoder_tower = towers["text"], towers["decoder"]
    assert isinstance(text_tower, TextTower) and isinstance(decoder_tower, DecoderTower)
    losses: list[float] = []
    window: list[float] = []
    accuracy: list[float] = []
    b = settings.batch
    step = 0
    model.train()
    for step in range(settings.steps):
        if settings.minutes is not None and time.perf_counter() - started > 60 * settings.minutes:
            log(f"stopping after {settings.minutes} minutes at step {step}")
            break
        total = torch.zeros(())
        for modality, (data, labelled) in (("image", inputs.images(b)), ("video", inputs.videos(b)), ("audio", inputs.sounds(b))):
            labels = torch.from_numpy(labelled)
            texts = text_embeddings(text_tower, inputs.captions(modality))
            tensor = torch.from_numpy(np.ascontiguousarray(data))
            media = towers[modality](tensor)
            total = total + contrastive(media, texts, labels, scales[modality])
        loss, right = decoder_loss(decoder_tower, inputs.questions(settings.decoder_batch))
        total = total + loss
        optimiser.zero_grad(set_to_none=True)
        total.backward()  # type: ignore[no-untyped-call]
        for group in clipped:
            torch.nn.utils.clip_grad_norm_(group, 1.0)
        optimiser.step()
        scheduler.step()
        window.append(float(total.detach()))
        accuracy.append(right)
        if (step + 1) % settings.log_every == 0 or step + 1 == settings.steps:
            losses.append(float(np.mean(window)))
            log(f"step {step + 1}/{settings.steps}  loss {losses[-1]:.4f}  decoder accuracy {np.mean(accuracy):.3f}  "
                f"{time.perf_counter() - started:.0f} s")  # fmt: skip
            window, accuracy = [], []
    if window:
        losses.append(float(np.mean(window)))
    model.eval()
    out = Path(settings.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_name(out.name + ".uncalibrated")
    save(model, config, raw)
    result = Result(str(out), step + 1, 0.0, losses[0], losses[-1], losses)
    try:
        result.temperatures = calibrate(raw, out, settings, log)
    finally:
        raw.unlink(missing_ok=True)
    result.seconds = time.perf_counter() - started
    log(f"trained, saved and calibrated in {result.seconds:.0f} s: {out} ({out.stat().st_size} bytes)")
    if settings.evaluate:
        result.evaluations = evaluate_all(out, settings.seed, log)
    return result


def calibrate(raw: Path, out: Path, settings: Settings, log: Callable[[str], None]) -> tuple[float, ...]:
    """Fit the temperatures of the three question groups through the runtime on fresh questions."""
    from uform.calibrate import Example
    from uform.calibrate import calibrate as fit

    rng = np.random.default_rng([CALIBRATION_STREAM, settings.seed])
    asked = [v.question(rng, calibration=True) for _ in range(settings.calibration_examples)]
    examples = [Example(q.text, q.choices, q.answer, q.group) for q in asked]
    report = fit(raw, examples, out, holdout=0.25, seed=settings.seed, groups=3)
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
