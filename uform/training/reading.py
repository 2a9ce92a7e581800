"""The byte decoder's reading stage (``reading_steps``; ``--phase reading``): lettered options
found by their words, not their place.

After its own phase the decoder answers lettered questions whose options come in the order
training mostly showed them, and little else: the foreign suite lists colours in another order
(red, orange, yellow, …) and the seventh run's decoder read 0.14 of those (chance 0.17), and
0.47 of the held-out ``options in any order``. It had learnt where each value sits, not how to
find it. This stage goes on from the decoder phase's checkpoint with every lettered list in a
random order (some of them only a few of the options) and a larger share of lettered questions
(``reading_letters``), with a fresh optimiser, warm-up and cosine decay; every other tensor is
kept byte for byte. docs/training.md has what it changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from uform.demo import generate as g
from uform.demo import variety as v
from uform.demo.evaluate import READING_STREAM
from uform.exporters.reference import ReferenceModel
from uform.exporters.reference.decoder import DecoderTower

from .recipe import Result, Settings, cosine, decoder_accuracy, heldout_questions, neutral, optimise, packed_decoder_loss, save

WARMUP = 50  # steps of warm-up of the stage's fresh optimiser


def _lettered(make: Callable[[], g.Question]) -> g.Question:
    while (q := make()).group != g.LETTERS:
        pass
    return q


def reading_questions(rng: np.random.Generator, n: int, context: int, letters: float) -> list[g.Question]:
    """``n`` questions for the reading stage: with probability ``letters`` a lettered one
    (``variety.decoder_question`` 0.6, ``variety.question`` 0.4), else the decoder phase's mix
    (``generate.question`` 0.2, ``variety.question`` 0.2, ``variety.decoder_question`` 0.6);
    every lettered list of the two ``variety`` kinds in a random order. A question whose text would
    not fit the decoder's context is drawn again."""
    out: list[g.Question] = []
    while len(out) < n:
        if rng.random() < letters:
            if rng.random() < 0.6:
                q = _lettered(lambda: v.decoder_question(rng, shuffled=1.0))
            else:
                q = _lettered(lambda: v.question(rng, jumbled=0.35, shuffled=1.0))
        else:
            u = rng.random()
            if u < 0.2:
                q = g.question(rng)
            elif u < 0.4:
                q = v.question(rng, jumbled=0.35, shuffled=1.0)
            else:
                q = v.decoder_question(rng, shuffled=1.0)
        if len(q.text.encode()) < context:
            out.append(q)
    return out


def train_reading(source: Path, target: Path, settings: Settings, log: Callable[[str], None], result: Result | None = None) -> None:
    """``settings.reading_steps`` steps of the decoder of checkpoint ``source`` on
    :func:`reading_questions` (stream ``[READING_STREAM, seed]``, ``decoder_phase_batch`` a step,
    packed into rows of ``decoder_row`` bytes), AdamW as the decoder phase's at ``decoder_lr``
    after :data:`WARMUP` steps, cosine decay to 2 %. Writes ``target`` as the decoder phase
    does (temperatures 1.0, every other tensor byte for byte) and records the stage in
    ``result``. Deterministic for a checkpoint, seed and thread count."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        _train(source, target, settings, log, result)
    finally:
        torch.use_deterministic_algorithms(deterministic)


def _train(source: Path, target: Path, settings: Settings, log: Callable[[str], None], result: Result | None) -> None:
    started = time.perf_counter()
    torch.manual_seed(settings.seed)
    model = ReferenceModel.from_checkpoint(source)
    tower = model.towers["decoder"]
    assert isinstance(tower, DecoderTower)
    rng = np.random.default_rng([READING_STREAM, settings.seed])
    params = list(tower.parameters())
    optimiser = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.05},
                                   {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                                  lr=settings.decoder_lr, betas=(0.9, 0.98))  # fmt: skip
    steps = settings.reading_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: cosine(step, WARMUP, steps))
    losses, window = [], []
    tower.train()
    for step in range(steps):
        asked = reading_questions(rng, settings.decoder_phase_batch, tower.context, settings.reading_letters)
        total, answer = packed_decoder_loss(tower, asked, settings.decoder_row or 256)
        optimise(total, optimiser, scheduler, params)
        window.append(float(answer.detach()))
        if (step + 1) % settings.log_every == 0 or step + 1 == steps:
            losses.append(float(np.mean(window)))
            window = []
            if (step + 1) % (4 * settings.log_every) == 0 or step + 1 == steps:
                log(f"reading step {step + 1}/{steps}  answer loss {losses[-1]:.4f}  {time.perf_counter() - started:.0f} s")
    tower.eval()
    save(model, neutral(model.config), target)
    seconds = time.perf_counter() - started
    heldout = {name: decoder_accuracy(tower, qs) for name, qs in heldout_questions(settings.seed).items()}
    log(f"reading stage: {steps} steps in {seconds:.0f} s; held-out accuracy " + ", ".join(f"{k} {x:.3f}" for k, x in heldout.items()))
    if result is not None:
        result.reading_steps, result.reading_seconds, result.reading_losses, result.heldout = steps, seconds, losses, heldout
