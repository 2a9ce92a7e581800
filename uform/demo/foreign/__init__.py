"""The foreign suite: held-out media made by code that shares nothing with the training generator.

:mod:`uform.demo.generate` makes the training data (and the own suite, :func:`uform.demo.evaluate`).
This module is a second, independent evaluation: it imports nothing from ``generate`` or
``media``, and is never used for training, calibration or model selection. It has its own
drawing (Pillow primitives, supersampled for anti-aliasing or not, filled, outlined or
rings, rotated, on white, dark, tinted, gradient or textured backgrounds, non-square
pictures), its own motion (speeds, frame rates, durations, resolutions, codecs — MPEG-4
Part 2, VP9 and H.264 at other settings — and keyframe spacing of its own; motions that start late
or stop early; shapes that enter or leave the frame), its own sound synthesis (square,
sawtooth, triangle and additive timbres, other chords, pink and brown noise, linear sweeps,
other pulse shapes; sample rates from 8 to 48 kHz; loudness from -30 to -1 dBFS; lengths
from 0.8 to 3 s with silence around the sound), and captions and questions phrased in word
orders the training captions never use (synonyms and plurals of the vocabulary
docs/training.md lists).

Every item is written to file bytes and goes through the runtime's verbs. A caption has a
*meaning* (its attributes); a retrieval hit is an item with the query's meaning.
The suite's parts: meanings.py (attributes, items, captions), pictures.py (pictures and clips),
recordings.py, questions.py; this module measures a model on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...verbs import ITEM_VERBS
from .meanings import (BANDS, BEATS, HEADING, HEIGHT, HUES, KINDS, NOUN, NUMBER, PULSE, SOURCE, SWEEP, WAYS, Item, clip_caption,
                       clip_direction_captions, picture_caption, sound_caption)  # fmt: skip
from .pictures import CODECS, SIZES, backdrop, clip, paint, picture, stamp
from .questions import ASK, DIGITS, LETTERS, OPTIONS, WHICH, YES_NO, Question, question
from .recordings import CHORDS, RATES, sound

if TYPE_CHECKING:
    from uform.model import Model

__all__ = ["ASK", "BANDS", "BEATS", "CHORDS", "CODECS", "DEFAULT_COUNT", "DIGITS", "FOREIGN_STREAM", "HEADING", "HEIGHT", "HUES", "KINDS",
           "LETTERS", "NOUN", "NUMBER", "OPTIONS", "PULSE", "RATES", "SIZES", "SOURCE", "SWEEP", "WAYS", "WHICH", "YES_NO", "Item",
           "Question", "backdrop", "clip", "clip_caption", "clip_direction_captions", "evaluate", "paint", "picture", "picture_caption",
           "question", "sound", "sound_caption", "stamp"]  # fmt: skip

FOREIGN_STREAM = 5  # numpy.random.default_rng([FOREIGN_STREAM, seed]); training, calibration and the own suite use 1-4
DEFAULT_COUNT = 96


# -- the evaluation ---------------------------------------------------------------------


def _hits(similarity: np.ndarray, queries: list[tuple[str, ...]], items: list[tuple[str, ...]], k: int) -> float:
    order = np.argsort(-similarity, axis=1, kind="stable")[:, :k]
    return float(np.mean([any(items[j] == q for j in row) for row, q in zip(order, queries)]))


def _retrieve(model: Model, verb: str, made: list[Item], rng: np.random.Generator, phrase: Callable[[tuple[str, ...]], str]) -> tuple[float, float, int, np.ndarray]:
    from uform import Arena

    media = np.array(getattr(model, verb)([m.data for m in made], Arena()).embeddings)
    meanings = sorted({m.meaning for m in made})
    texts = np.array(model.text_encode([phrase(q) for q in meanings], Arena()).embeddings)
    s = texts @ media.T
    items = [m.meaning for m in made]
    return _hits(s, meanings, items, 1), _hits(s, meanings, items, 5), len(meanings), media


def evaluate(
    model: Model,
    *,
    seed: int = 0,
    count: int = DEFAULT_COUNT,
    questions: int | None = None,
    progress: Callable[[int, int], object] | None = None,
) -> Any:
    """Measure ``model`` on the foreign suite: ``count`` items per modality, ``questions``
    questions (``4 × count`` when not given); answers a :class:`uform.demo.Evaluation` with
    ``suite`` ``"foreign"``. Queries are the distinct meanings among a modality's items, each
    in one of this suite's phrasings; a hit is an item of the same meaning. ``video_direction``
    is the fraction of clips whose embedding is nearest to the caption naming their own
    direction among the four that differ in direction alone."""
    from uform import Arena
    from uform.calibrate import ece

    from ..evaluate import Evaluation, check_verbs, group

    questions = 4 * count if questions is None else questions
    if count < 1 or questions < 1:
        raise ValueError(f"count and questions must be at least 1, got {count} and {questions}")
    check_verbs(model)
    start = time.perf_counter()
    rng = np.random.default_rng([FOREIGN_STREAM, seed])

    def report(done: int) -> None:
        if progress is not None:
            progress(done, 4)

    pictures = [picture(rng) for _ in range(count)]
    image = _retrieve(model, ITEM_VERBS["image"], pictures, rng, lambda m: picture_caption(rng, m[0], m[1], int(m[2])))
    report(1)
    made = [clip(rng) for _ in range(count)]
    clips = [c for c, _ in made]
    video = _retrieve(model, ITEM_VERBS["video"], clips, rng, lambda m: clip_caption(rng, m[0], m[1], m[2]))
    four = [[d[w] for w in WAYS] for _, d in made]
    texts = np.array(model.text_encode([t for row in four for t in row], Arena()).embeddings).reshape(count, 4, -1)
    guessed = np.argmax(np.einsum("cd,cwd->cw", video[3], texts), axis=1)
    direction = float(np.mean([WAYS[int(i)] == c.meaning[2] for i, c in zip(guessed, clips)]))
    report(2)
    sounds = [sound(rng) for _ in range(count)]
    audio = _retrieve(model, ITEM_VERBS["audio"], sounds, rng, lambda m: sound_caption(rng, m[0], m[1], m[2]))
    report(3)
    asked = [question(rng) for _ in range(questions)]
    tape = model.text_choose([q.text for q in asked], [q.choices for q in asked], Arena(), temperature_groups=[group(model, q.group) for q in asked])
    probs, offsets = tape.to_numpy()
    probs, offsets = np.array(probs, np.float64), np.array(offsets, np.int64)
    answers = np.array([q.answer for q in asked], np.int64)
    top = np.array([int(np.argmax(probs[offsets[i] : offsets[i + 1]])) for i in range(len(asked))])
    report(4)
    return Evaluation(
        image_recall_at_1=image[0], image_recall_at_5=image[1], video_recall_at_1=video[0], video_recall_at_5=video[1],
        audio_recall_at_1=audio[0], audio_recall_at_5=audio[1], choose_accuracy=float((top == answers).mean()),
        choose_ece=ece(probs, offsets, answers), items=count, image_queries=image[2], video_queries=video[2],
        audio_queries=audio[2], questions=questions, seed=seed, quantization=model.describe().quantization.value,
        seconds=time.perf_counter() - start, video_direction=direction, suite="foreign",
    )  # fmt: skip
