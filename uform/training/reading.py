"""The byte decoder's reading stage (``reading_steps``; ``--phase reading``): lettered options
found by their words, not their place.

After its own phase the decoder answers lettered questions whose options come in the order
training mostly showed them, and little else: the foreign suite lists colours in another order
(red, orange, yellow, …) and the seventh run's decoder read 0.17 of those (chance 0.17), and
0.48 of the held-out ``options in any order``. It had learnt where each value sits, not how to
find it. This stage goes on from the decoder phase's checkpoint with every lettered list in a
random order (some of them only a few of the options) and a larger share of lettered questions
(``reading_letters``), with a fresh optimiser, warm-up and cosine decay; every other tensor is
kept byte for byte. docs/training.md has what it changed; docs/notes/training-history.md,
"Reading stage", the run that added it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from uform.demo import generate as g
from uform.demo.variety.decoder import decoder_question
from uform.demo.variety.questions import question as varied_question
from uform.demo.evaluate import READING_STREAM

from .decoder import decoder_stage
from .settings import Result, Settings

WARMUP = 50  # steps of warm-up of the stage's fresh optimiser


def _lettered(make: Callable[[], g.Question]) -> g.Question:
    while (q := make()).group != g.LETTERS:
        pass
    return q


def reading_questions(rng: np.random.Generator, n: int, context: int, letters: float) -> list[g.Question]:
    """``n`` questions for the reading stage: with probability ``letters`` a lettered one
    (``variety.decoder.decoder_question`` 0.6, ``variety.questions.question`` 0.4), else the decoder phase's mix
    (``generate.question`` 0.2, ``variety.questions.question`` 0.2, ``variety.decoder.decoder_question`` 0.6);
    every lettered list of the two ``variety`` kinds in a random order. A question whose text would
    not fit the decoder's context is drawn again."""
    out: list[g.Question] = []
    while len(out) < n:
        if rng.random() < letters:
            if rng.random() < 0.6:
                q = _lettered(lambda: decoder_question(rng, shuffled=1.0))
            else:
                q = _lettered(lambda: varied_question(rng, jumbled=0.35, shuffled=1.0))
        else:
            u = rng.random()
            if u < 0.2:
                q = g.question(rng)
            elif u < 0.4:
                q = varied_question(rng, jumbled=0.35, shuffled=1.0)
            else:
                q = decoder_question(rng, shuffled=1.0)
        if len(q.text.encode()) < context:
            out.append(q)
    return out


def train_reading(source: Path, target: Path, settings: Settings, log: Callable[[str], None], result: Result | None = None) -> None:
    """``settings.reading_steps`` steps of the decoder of checkpoint ``source`` on
    :func:`reading_questions` (stream ``[READING_STREAM, seed]``, ``decoder_phase_batch`` a
    step), as the decoder phase trains (:func:`~uform.training.decoder.decoder_stage`: a fresh
    AdamW at ``decoder_lr``, here after :data:`WARMUP` steps of warm-up); writes ``target`` as
    the decoder phase does and records the stage in ``result``. Deterministic for a checkpoint,
    seed and thread count."""

    def draw(rng: np.random.Generator, context: int) -> list[g.Question]:
        return reading_questions(rng, settings.decoder_phase_batch, context, settings.reading_letters)

    steps = settings.reading_steps
    seconds, losses, heldout = decoder_stage(source, target, settings, log, READING_STREAM, steps, WARMUP, draw,
                                             ("reading step", "reading stage"))  # fmt: skip
    if result is not None:
        result.reading_steps, result.reading_seconds, result.reading_losses, result.heldout = steps, seconds, losses, heldout
