"""Questions about a paraphrased or jumbled caption: the training phrasings (``TRAIN_*``) and
the calibration's (``CALIBRATION_*``), which training never sees; and the vocabulary training
shows (:func:`all_paraphrases`, :func:`vocabulary`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .. import generate as g
from .captions import Meaning, jumbles, meanings, paraphrases, phrase

# training phrasings of each question; calibration questions use CALIBRATION_ASK, which
# training never sees, so the fitted temperatures reflect answers the model can get wrong
TRAIN_ASK = {
    "colour": ("Is it {v}?", "Is the colour {v}?", "Is it coloured {v}?", "Is this {v}?", "Is that {v}?", "Is the thing {v}?",
               "Can it be described as {v}?", "Is its hue {v}?", "Is {v} the colour?", "Colour {v}?"),
    "shape": ("Is it a {v}?", "Is the shape a {v}?", "Is this a {v}?", "Is it shaped like a {v}?", "Is that a {v}?",
              "Is the thing a {v}?", "Is it some kind of {v}?", "Is {v} the shape?", "Shape {v}?"),
    "count": ("Are there {v}?", "Is the count {v}?", "Do we see {v}?", "Are there {v} shapes?", "Is the total {v}?",
              "Are {v} of them there?", "Is {v} the count?", "Count {v}?", "Do I see {v}?"),
    "direction": ("Is it moving {v}?", "Does it move {v}?", "Is it going {v}?", "Is the movement {v}?", "Is it heading {v}?",
                  "Does it travel {v}?", "Is {v} the way it moves?", "Is it headed {v}?", "Moving {v}?"),
    "sound": ("Is it a {v}?", "Is the sound a {v}?", "Is this a {v}?", "Do you hear a {v}?", "Is that a {v}?",
              "Is what we hear a {v}?", "Is {v} the sound?", "Sound {v}?"),
    "pitch": ("Is the pitch {v}?", "Is it {v} pitched?", "Is the sound {v}?", "Is this pitch {v}?", "Is it pitched {v}?",
              "Is the note {v}?", "Is {v} the pitch?", "Pitch {v}?"),
    "rhythm": ("Is the rhythm {v}?", "Is it {v}?", "Is the pulse {v}?", "Is the beat {v}?", "Is the tempo {v}?",
               "Is the pulsing {v}?", "Is {v} the rhythm?", "Rhythm {v}?"),
}  # fmt: skip
TRAIN_WHICH = ("Which {a}?", "What {a} is it?", "What is the {a}?", "Which {a} is it?", "Choose the {a}.", "Select the {a}:",
               "The {a} is?", "Name the {a}.", "Which one is the {a}?")  # fmt: skip
TRAIN_HOW_MANY = ("How many shapes?", "How many are there?", "How many?", "What is the count?", "How many shapes are there?",
                  "How many of them?", "Number of shapes?", "How many can you see?", "Total count?")  # fmt: skip
TRAIN_LEADS = ("", "", "", "", "Question: ", "Q: ", "Tell me, ", "Now, ", "Say, ")  # before a training question
TRAIN_JOINS = (". ", ". ", ". ", ". ", "; ", "! ", " -- ")  # between the description and a training question
CALIBRATION_ASK = {
    "colour": ("Is its colour {v}?", "Does it look {v}?"), "shape": ("Is its shape a {v}?", "Does it look like a {v}?"),
    "count": ("Is the number {v}?", "Are {v} shown?"), "direction": ("Is the direction {v}?", "Does it go {v}?"),
    "sound": ("Does it sound like a {v}?", "Is this a {v}?"), "pitch": ("Is its pitch {v}?", "Does it sound {v}?"),
    "rhythm": ("Is its rhythm {v}?", "Does it sound {v}?"),
}  # fmt: skip
CALIBRATION_WHICH = ("Pick the {a}:", "Its {a}?")
CALIBRATION_HOW_MANY = ("What is the number of shapes?", "Count them.")
EXTRA = {  # words a description may add about how a medium was made, which the answer does not depend on
    "image": ("drawn with a thick outline", "on a dark background", "on a white background", "slightly blurred", "small"),
    "video": ("at 24 frames a second", "entering the frame", "leaving the frame", "on a dark background", "quickly"),
    "audio": ("recorded at 44.1 kHz", "quiet", "loud", "after a short silence", "with a faint hiss behind it"),
}  # fmt: skip


def asks_of(m: Meaning) -> list[tuple[str, list[str], str]]:
    if m.modality == "image":
        c, s, n = m.attributes
        return [("colour", list(g.COLOURS), c), ("shape", list(g.SHAPES), s), ("count", ["1", "2", "3"], n)]
    if m.modality == "video":
        c, s, d = m.attributes
        return [("colour", list(g.COLOURS), c), ("shape", list(g.SHAPES), s), ("direction", list(g.DIRECTIONS), d)]
    kind, pitch, rhythm = m.attributes
    out = [("sound", list(g.SOUNDS), kind)]
    if kind in ("tone", "chord"):
        out.append(("pitch", list(g.PITCHES), pitch))
    if kind != "sweep":
        out.append(("rhythm", ["steady", "slow", "fast"], {"steady": "steady", "slowly pulsing": "slow", "quickly pulsing": "fast"}[rhythm]))
    return out


def question(rng: np.random.Generator, *, calibration: bool = False, jumbled: float = 0.0, shuffled: float = 0.25) -> g.Question:
    """A question about a paraphrased caption of any modality (a jumble, :func:`jumbles`, with
    probability ``jumbled``). Training phrasings by default, each maybe led by one of
    ``TRAIN_LEADS`` and joined to its description by one of ``TRAIN_JOINS``, lettered options
    in a random order with probability ``shuffled`` (the recipe's 0.25); with ``calibration``,
    phrasings training never uses and descriptions with extra words, options in the canonical order."""
    modality = str(rng.choice(["image", "video", "audio"]))
    pool = meanings(modality)
    m = pool[int(rng.integers(0, len(pool)))]
    caption = phrase(rng, m, canonical=0.3, jumbled=jumbled)
    if not calibration:
        lead, join = str(rng.choice(TRAIN_LEADS)), str(rng.choice(TRAIN_JOINS))
        asked_as = _ask(rng, m, TRAIN_ASK, TRAIN_WHICH, TRAIN_HOW_MANY, shuffle=shuffled)
        text = asked_as.text[0].lower() + asked_as.text[1:] if lead.endswith(", ") else asked_as.text
        return g.Question(f"{caption}{join}{lead}{text}", asked_as.choices, asked_as.answer, asked_as.group)
    if calibration and rng.random() < 0.5:
        caption = f"{caption}, {rng.choice(EXTRA[modality])}"
    asked_as = _ask(rng, m, CALIBRATION_ASK, CALIBRATION_WHICH, CALIBRATION_HOW_MANY, shuffle=0.0)
    return g.Question(f"{caption}. {asked_as.text}", asked_as.choices, asked_as.answer, asked_as.group)


def _ask(rng: np.random.Generator, m: Meaning, ask: Mapping[str, Sequence[str]], which: Sequence[str], how_many: Sequence[str], *,
         shuffle: float) -> g.Question:  # fmt: skip
    """The question part (after the description) about one attribute of ``m``, and its answer;
    lettered options in a random order with probability ``shuffle``, else in the canonical one."""
    asks = asks_of(m)
    attribute, options, value = asks[int(rng.integers(0, len(asks)))]
    form = int(rng.integers(0, 3))
    if attribute == "count" and form == 2:
        return g.Question(f"{rng.choice(how_many)} Answer 1, 2 or 3: ", "123", int(value) - 1, g.DIGITS)
    if form == 1:
        shown = list(options)
        if shuffle and rng.random() < shuffle:
            shown = [shown[i] for i in rng.permutation(len(shown))]
        listed = " ".join(f"{'abcdefgh'[i]}) {o}" for i, o in enumerate(shown))
        return g.Question(f"{str(rng.choice(which)).format(a=attribute)} {listed}. Answer: ", "abcdefgh"[: len(shown)], shown.index(value), g.LETTERS)
    truth = bool(rng.integers(0, 2))
    asked = value if truth else str(rng.choice([o for o in options if o != value]))
    return g.Question(f"{str(rng.choice(ask[attribute])).format(v=asked)} Answer y or n: ", "yn", 0 if truth else 1, g.YES_NO)


def all_paraphrases() -> set[str]:
    """Every caption text training can show, jumbles included (for tests: the foreign suite's captions are none of these)."""
    return {p for modality in ("image", "video", "audio") for m in meanings(modality) for p in paraphrases(m) + jumbles(m)}


def vocabulary(extra: Sequence[str] = ()) -> set[str]:
    words = {w for p in all_paraphrases() for w in p.replace(",", " ").split()}
    return words | set(extra)
