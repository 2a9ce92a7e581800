"""Held-out evaluation of a model on generated data, measured through the runtime.

Every item is encoded to file bytes (PNG/JPEG, MP4/WebM, WAV/FLAC) and goes through the
model's own verbs (``image_encode``, ``video_encode``, ``audio_encode``, ``text_encode``,
``text_choose``), so decoding and preprocessing are the runtime's. The data is drawn from
``numpy.random.default_rng([EVALUATION_STREAM, seed])``; training draws from other streams
(:data:`TRAINING_STREAM`, :data:`CALIBRATION_STREAM`), so the media are never the ones trained
on, though their captions come from the same closed caption space.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..verbs import ITEM_VERBS
from . import generate as g
from .media import audio_bytes, image_bytes, video_bytes

if TYPE_CHECKING:
    from uform.model import Model

TRAINING_STREAM, CALIBRATION_STREAM, EVALUATION_STREAM, MEDIA_STREAM = 1, 2, 3, 4
# 5 is the foreign suite's (uform.demo.foreign.FOREIGN_STREAM); 6 a held-out split of the
# training's own generators (read before either suite); 7 the byte decoder's own phase, 8 its
# reading stage
HELDOUT_STREAM, DECODER_STREAM, READING_STREAM = 6, 7, 8
DEFAULT_COUNT = 96


@dataclass(frozen=True)
class Evaluation:
    """Quality figures of one model on held-out generated data (all through the runtime).

    Retrieval (text → image, text → video, text → audio): the gallery of a modality is
    ``items`` generated media; its queries are the distinct captions among them
    (``image_queries``, ``video_queries``, ``audio_queries``). A query is a hit at ``k`` when one
    of the ``k`` gallery items most similar to the query text (cosine of the embeddings) has
    exactly the query's caption — generated captions repeat, so any item carrying that
    caption is a right answer. ``image_recall_at_1``, ``video_recall_at_1``,
    ``audio_recall_at_1`` and ``image_recall_at_5``, ``video_recall_at_5``,
    ``audio_recall_at_5`` are the fractions of queries that are hits at 1 and at 5 (0 … 1).

    Choice (``text_choose``): ``questions`` generated questions about captions of every
    modality (yes/no, how many, lettered options), scored at the checkpoint's temperatures
    by their group. ``choose_accuracy`` is the fraction whose most probable choice is the
    right one; ``choose_ece`` is the expected calibration error of that top choice over 15
    equal-width confidence bins (``uform.calibrate.ece``): 0 means the confidence matches
    the accuracy bin by bin.

    ``video_direction``: the fraction of clips whose embedding is nearest to the caption
    naming their own direction among the four captions of their colour and shape that differ
    in the direction alone (chance 0.25).

    ``seed`` is the evaluation seed; ``quantization`` the weights' scalar as the model
    reports it (``bf16``, ``e4m3``, ``f32``); ``seconds`` the wall time of the evaluation;
    ``suite`` which suite made the data: ``"own"`` (:func:`evaluate`, the training
    generator's renderer) or ``"foreign"`` (:func:`uform.demo.foreign.evaluate`).
    """

    image_recall_at_1: float
    image_recall_at_5: float
    video_recall_at_1: float
    video_recall_at_5: float
    audio_recall_at_1: float
    audio_recall_at_5: float
    choose_accuracy: float
    choose_ece: float
    items: int
    image_queries: int
    video_queries: int
    audio_queries: int
    questions: int
    seed: int
    quantization: str
    seconds: float
    video_direction: float = float("nan")
    suite: str = "own"

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-able values."""
        return asdict(self)


def recall(similarity: np.ndarray, query_captions: Sequence[str], item_captions: Sequence[str], k: int) -> float:
    """Fraction of queries (rows of ``similarity`` [queries, items]) with an item of the same
    caption among their ``k`` most similar items (ties broken by item order)."""
    if not len(query_captions):
        return 0.0
    order = np.argsort(-similarity, axis=1, kind="stable")[:, :k]
    items = np.asarray(item_captions, dtype=object)
    return float(np.mean([bool((items[row] == q).any()) for row, q in zip(order, query_captions)]))


def _retrieval(model: Model, verb: str, files: list[bytes], captions: list[str]) -> tuple[float, float, int, np.ndarray]:
    from uform import Arena

    media = np.array(getattr(model, verb)(files, Arena()).embeddings)
    queries = sorted(set(captions))
    texts = np.array(model.text_encode(queries, Arena()).embeddings)
    s = texts @ media.T
    return recall(s, queries, captions, 1), recall(s, queries, captions, 5), len(queries), media


def clip_direction(model: Model, media: np.ndarray, clips: list[tuple[str, str, str]]) -> float:
    """Fraction of clips nearest to the caption of their own direction among the four of their colour and shape."""
    from uform import Arena

    texts = [g.video_caption(colour, shape, d) for colour, shape, _ in clips for d in g.DIRECTIONS]
    embedded = np.array(model.text_encode(texts, Arena()).embeddings).reshape(len(clips), len(g.DIRECTIONS), -1)
    guessed = np.argmax(np.einsum("cd,cwd->cw", media, embedded), axis=1)
    return float(np.mean([g.DIRECTIONS[int(i)] == d for i, (_, _, d) in zip(guessed, clips)]))


NEEDS = ("text_encode", "image_encode", "video_encode", "audio_encode", "text_choose")  # what both suites measure


def check_verbs(model: Model) -> None:
    """``UnsupportedError`` naming every verb an evaluation needs and ``model`` lacks, before any
    work (a converted CLIP has no audio tower and no byte decoder: it failed at the recordings,
    after the pictures and clips were encoded)."""
    from uform import UnsupportedError

    missing = [verb for verb in NEEDS if verb not in model.served.verbs]
    if missing:
        raise UnsupportedError(
            f"the evaluation measures {', '.join(NEEDS)}; this model lacks {', '.join(missing)} "
            f"(it has the towers {', '.join(model.served.towers)}): it is for models trained by uform's recipe"
        )


def evaluate(
    model: Model,
    *,
    seed: int = 0,
    count: int = DEFAULT_COUNT,
    questions: int | None = None,
    progress: Callable[[int, int], object] | None = None,
) -> Evaluation:
    """Measure ``model`` on ``count`` held-out items per modality and ``questions`` questions
    (``4 × count`` when not given). ``progress(done, total)`` is called after each of the four
    stages (``total`` = 4). Raises ``ValueError`` for ``count < 1`` or ``questions < 1``, and
    ``uform.UnsupportedError`` when the model lacks a tower the evaluation needs."""
    from uform import Arena
    from uform.calibrate import ece

    questions = 4 * count if questions is None else questions
    if count < 1 or questions < 1:
        raise ValueError(f"count and questions must be at least 1, got {count} and {questions}")
    check_verbs(model)
    start = time.perf_counter()
    rng = np.random.default_rng([EVALUATION_STREAM, seed])
    total = 4

    def report(done: int) -> None:
        if progress is not None:
            progress(done, total)

    pictures = [g.picture(rng, int(rng.choice([32, 64, 128]))) for _ in range(count)]
    image = _retrieval(model, ITEM_VERBS["image"], [image_bytes(p.pixels, g_fmt(i, "png", "jpeg")) for i, p in enumerate(pictures)],
                       [p.caption for p in pictures])  # fmt: skip
    report(1)
    clips = [g.clip(rng, int(rng.choice([32, 64]))) for _ in range(count)]
    video = _retrieval(model, ITEM_VERBS["video"], [video_bytes(c.frames, g_fmt(i, "mp4", "webm")) for i, c in enumerate(clips)],
                       [c.caption for c in clips])  # fmt: skip
    direction = clip_direction(model, video[3], [(c.colour, c.shape, c.direction) for c in clips])
    report(2)
    sounds = [g.sound(rng) for _ in range(count)]
    audio = _retrieval(model, ITEM_VERBS["audio"], [audio_bytes(s.samples, g_fmt(i, "wav", "flac")) for i, s in enumerate(sounds)],
                       [s.caption for s in sounds])  # fmt: skip
    report(3)
    asked = [g.question(rng) for _ in range(questions)]
    tape = model.text_choose([q.text for q in asked], [q.choices for q in asked], Arena(), temperature_groups=[group(model, q.group) for q in asked])
    probs, offsets = tape.to_numpy()
    probs, offsets = np.array(probs, np.float64), np.array(offsets, np.int64)
    answers = np.array([q.answer for q in asked], np.int64)
    top = np.array([int(np.argmax(probs[offsets[i] : offsets[i + 1]])) for i in range(len(asked))])
    accuracy = float((top == answers).mean())
    calibration = ece(probs, offsets, answers)
    report(4)
    return Evaluation(
        image[0], image[1], video[0], video[1], audio[0], audio[1], accuracy, calibration, count, image[2], video[2],
        audio[2], questions, seed, model.describe().quantization.value, time.perf_counter() - start, direction, "own",
    )  # fmt: skip


def g_fmt(i: int, even: str, odd: str) -> str:
    """Formats alternate item by item, so both decoders of a modality are exercised."""
    return even if i % 2 == 0 else odd


def group(model: Model, group: int) -> int:
    """The question's temperature group, or 0 when the checkpoint has fewer groups."""
    return group if group < model.describe().choice_temperature_groups else 0
