"""The second phase: the byte decoder alone (:func:`train_decoder`), from the first phase's
checkpoint, every other tensor kept byte for byte; :func:`decoder_stage` is its loop, which the
reading stage (:mod:`uform.training.reading`) runs too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from uform.demo import generate as g
from uform.demo.evaluate import DECODER_STREAM
from uform.exporters.reference import ReferenceModel
from uform.exporters.reference.decoder import DecoderTower

from .questions import decoder_accuracy, decoder_questions, heldout_questions, packed_decoder_loss
from .settings import Result, Settings, decoder_draw
from .steps import cosine, deterministic, neutral, optimise, save


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
