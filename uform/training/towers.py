"""The first phase (:func:`train_towers`): every tower at once, from the seed's initialisation,
each against its own targets, their losses summed in one step but sharing no parameters.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from uform.exporters.reference import ReferenceModel
from uform.exporters.reference.decoder import DecoderTower
from uform.exporters.reference.text import TextTower
from uform.exporters.reference.video import VideoTower

from .inputs import Inputs
from .losses import clip_losses, contrastive, prototypes, text_embeddings
from .questions import decoder_loss, packed_decoder_step
from .settings import MODALITIES, Settings, decoder_draw
from .steps import class_tokens_only, cosine, deterministic, initialise, save, towers_in_bf16


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
