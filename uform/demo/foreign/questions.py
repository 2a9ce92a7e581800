"""The foreign suite's questions for ``text_choose``, about a foreign caption of any modality,
in this suite's own phrasing (yes/no, how many, lettered options)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .meanings import BANDS, BEATS, HUES, KINDS, WAYS, clip_caption, picture_caption, sound_caption

__all__ = ["ASK", "DIGITS", "LETTERS", "OPTIONS", "WHICH", "YES_NO", "Question", "question"]

YES_NO, DIGITS, LETTERS = 0, 1, 2
OPTIONS = {
    "colour": list(HUES), "shape": list(KINDS), "count": ["1", "2", "3"], "direction": list(WAYS),
    "sound": ["tone", "chord", "noise", "sweep"], "pitch": list(BANDS), "rhythm": ["steady", "slow", "fast"],
}  # fmt: skip
ASK = {  # yes/no questions in this suite's own words
    "colour": "Would you say it is {v}?", "shape": "Would you call it a {v}?", "count": "Do you count {v}?",
    "direction": "Is the motion {v}?", "sound": "Would you call it a {v}?", "pitch": "Is it {v} in pitch?",
    "rhythm": "Would you call the rhythm {v}?",
}  # fmt: skip
WHICH = {
    "colour": "Its colour is which?", "shape": "Its shape is which?", "count": "The number is which?",
    "direction": "It moves which way?", "sound": "The sound is which?", "pitch": "The pitch is which?",
    "rhythm": "The rhythm is which?",
}  # fmt: skip


@dataclass(frozen=True)
class Question:
    text: str
    choices: str
    answer: int
    group: int


def question(rng: np.random.Generator) -> Question:
    """A question about a foreign caption of any modality, in this suite's phrasing."""
    modality = int(rng.integers(0, 3))
    if modality == 0:
        colour, shape, count = str(rng.choice(list(HUES))), str(rng.choice(KINDS)), int(rng.integers(1, 4))
        caption = picture_caption(rng, colour, shape, count)
        asks = {"colour": colour, "shape": shape, "count": str(count)}
    elif modality == 1:
        colour, shape, direction = str(rng.choice(list(HUES))), str(rng.choice(KINDS)), str(rng.choice(WAYS))
        caption = clip_caption(rng, colour, shape, direction)
        asks = {"colour": colour, "shape": shape, "direction": direction}
    else:
        kind = str(rng.choice(["tone", "chord", "noise", "rising", "falling"]))
        pitch = str(rng.choice(list(BANDS))) if kind in ("tone", "chord") else ""
        rhythm = str(rng.choice(list(BEATS))) if kind in ("tone", "chord", "noise") else ""
        caption = sound_caption(rng, kind, pitch, rhythm)
        asks = {"sound": "sweep" if kind in ("rising", "falling") else kind}
        if pitch:
            asks["pitch"] = pitch
        if rhythm:
            asks["rhythm"] = rhythm
    attribute = str(rng.choice(list(asks)))
    value = asks[attribute]
    options = OPTIONS[attribute]
    form = int(rng.integers(0, 3))
    if attribute == "count" and form == 2:
        return Question(f"{caption}. Shapes in all? Answer 1, 2 or 3: ", "123", int(value) - 1, DIGITS)
    if form == 1:
        listed = " ".join(f"{'abcdefgh'[i]}) {o}" for i, o in enumerate(options))
        return Question(f"{caption}. {WHICH[attribute]} {listed}. Answer: ", "abcdefgh"[: len(options)], options.index(value), LETTERS)
    truth = bool(rng.integers(0, 2))
    asked = value if truth else str(rng.choice([o for o in options if o != value]))
    return Question(f"{caption}. {ASK[attribute].format(v=asked)} Answer y or n: ", "yn", 0 if truth else 1, YES_NO)
