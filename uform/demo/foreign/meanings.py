"""What the foreign suite's items mean, and how it says it: the attributes it draws (colours as
hue ranges of its own, shapes, directions, pitch bands, beats), :class:`Item` (a medium's file
bytes, caption and meaning), and captions in word orders the training captions never use."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


# colour names and the hue ranges (degrees), saturation and value this module paints them with
HUES: dict[str, tuple[float, float, float, float]] = {
    "red": (-7.0, 5.0, 0.62, 0.92),
    "orange": (21.0, 31.0, 0.75, 0.98),
    "yellow": (49.0, 57.0, 0.85, 1.0),
    "green": (108.0, 142.0, 0.5, 0.8),
    "blue": (212.0, 232.0, 0.6, 0.95),
    "purple": (272.0, 292.0, 0.5, 0.8),
}
KINDS = ("circle", "square", "triangle")
WAYS = ("left", "right", "up", "down")
BANDS = {"low": (150.0, 250.0), "middle": (440.0, 680.0), "high": (1150.0, 1800.0)}
BEATS = {"steady": (0.0, 0.0), "slow": (1.6, 2.5), "fast": (5.0, 7.5)}  # pulses a second

# -- words ------------------------------------------------------------------------------

NUMBER = {1: ("one",), 2: ("two", "2"), 3: ("three", "3")}
NOUN = {"circle": ("circle", "disc", "round shape"), "square": ("square", "box"), "triangle": ("triangle", "triangular shape")}
HEADING = {"left": ("left", "to the left", "leftwards"), "right": ("right", "to the right", "rightwards"),
           "up": ("up", "upwards"), "down": ("down", "downwards")}  # fmt: skip
HEIGHT = {"low": ("low", "deep"), "middle": ("middle", "medium"), "high": ("high", "shrill")}
PULSE = {"steady": ("steady", "constant"), "slow": ("slowly pulsing", "pulsing slowly"),
         "fast": ("quickly pulsing", "pulsing quickly", "rapidly pulsing")}  # fmt: skip
SOURCE = {"tone": ("tone", "note"), "chord": ("chord",), "noise": ("noise", "hiss")}
SWEEP = {"rising": ("rising", "going up"), "falling": ("falling", "going down")}


def _plural(word: str) -> str:
    return word + ("es" if word.endswith("x") else "s")


def _pick(rng: np.random.Generator, words: tuple[str, ...]) -> str:
    return words[int(rng.integers(0, len(words)))]


def picture_caption(rng: np.random.Generator, colour: str, shape: str, count: int, form: int | None = None) -> str:
    """A caption of ``count`` shapes in one of this suite's word orders (never the training ones)."""
    noun = _pick(rng, NOUN[shape])
    nouns = noun if count == 1 else _plural(noun)
    number = _pick(rng, NUMBER[count])
    form = int(rng.integers(0, 4)) if form is None else form
    if form == 0:
        return f"{nouns}, {colour}, {number}"
    if form == 1:
        return f"{colour} {nouns} ({number})"
    if form == 2:
        return f"{colour}: {number} {nouns}"
    return f"{number} {nouns} ({colour})"


def clip_caption(rng: np.random.Generator, colour: str, shape: str, direction: str, form: int | None = None, noun: str | None = None,
                 heading: str | None = None) -> str:  # fmt: skip
    noun = _pick(rng, NOUN[shape]) if noun is None else noun
    heading = _pick(rng, HEADING[direction]) if heading is None else heading
    form = int(rng.integers(0, 4)) if form is None else form
    if form == 0:
        return f"moving {heading}: one {colour} {noun}"
    if form == 1:
        return f"one {noun}, {colour}, going {heading}"
    if form == 2:
        return f"{colour} {noun} ({heading})"
    return f"going {heading}, a {noun} ({colour})"


def clip_direction_captions(colour: str, shape: str, seed_rng: np.random.Generator) -> dict[str, str]:
    """The four captions a clip's direction is read from: one word order and noun, each direction."""
    form, noun = int(seed_rng.integers(0, 4)), _pick(seed_rng, NOUN[shape])
    pick = int(seed_rng.integers(0, 2))
    return {d: clip_caption(seed_rng, colour, shape, d, form, noun, HEADING[d][min(pick, len(HEADING[d]) - 1)]) for d in WAYS}


def sound_caption(rng: np.random.Generator, kind: str, pitch: str, rhythm: str, form: int | None = None) -> str:
    form = int(rng.integers(0, 3)) if form is None else form
    if kind in ("rising", "falling"):
        way = _pick(rng, SWEEP[kind])
        return [f"tone, {way}", f"{way}: a tone", f"a tone ({way})"][form]
    source = _pick(rng, SOURCE[kind])
    beat = _pick(rng, PULSE[rhythm])
    if kind == "noise":
        return [f"{source}: {beat}", f"{beat}: {source}", f"{source} ({beat})"][form]
    height = _pick(rng, HEIGHT[pitch])
    return [f"{source}, {height}, {beat}", f"{beat}: a {height} {source}", f"{height} {source} ({beat})"][form]


@dataclass(frozen=True)
class Item:
    """One foreign medium as file bytes, its caption and meaning (its attributes, as a tuple)."""

    data: bytes
    caption: str
    meaning: tuple[str, ...]
