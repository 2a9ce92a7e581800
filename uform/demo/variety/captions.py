"""Captions for training: every meaning (:class:`Meaning`, a canonical caption of
:mod:`uform.demo.generate` and the attributes it names), its paraphrases (:func:`paraphrases`),
its jumbles (:func:`jumbles`) and :func:`phrase`, which draws one of them."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .. import generate as g

COUNT_WORDS = {1: ("a", "one", "a single"), 2: ("two", "2", "a pair of"), 3: ("three", "3")}
SHAPE_WORDS = {"circle": ("circle", "disc", "round shape"), "square": ("square", "box"), "triangle": ("triangle", "triangular shape")}
DIRECTION_WORDS = {"left": ("left", "to the left", "leftwards"), "right": ("right", "to the right", "rightwards"),
                   "up": ("up", "upwards"), "down": ("down", "downwards")}  # fmt: skip
PITCH_WORDS = {"low": ("low", "deep"), "middle": ("middle", "medium"), "high": ("high", "shrill")}
RHYTHM_WORDS = {"steady": ("steady", "constant"), "slowly pulsing": ("slowly pulsing", "pulsing slowly"),
                "quickly pulsing": ("quickly pulsing", "rapidly pulsing", "pulsing quickly")}  # fmt: skip
SOUND_WORDS = {"tone": ("tone", "note"), "chord": ("chord",), "noise": ("noise", "hiss")}
SWEEP_WORDS = {"rising": ("rising", "going up"), "falling": ("falling", "going down")}


def plural_of(word: str) -> str:
    return word + ("es" if word.endswith("x") else "s")


def _article(words: str) -> str:
    return f"an {words}" if words[0] in "aeiou" else f"a {words}"


def image_paraphrases(colour: str, shape: str, count: int) -> list[str]:
    """Every training phrasing of a picture's caption (the canonical one first)."""
    out = [g.image_caption(colour, shape, count)]
    for n in COUNT_WORDS[count]:
        for s in SHAPE_WORDS[shape]:
            noun = s if count == 1 else plural_of(s)
            lead = _article(f"{colour} {noun}").split()[0] if n == "a" else n  # "an orange circle"
            own = _article(noun).split()[0] if n == "a" else n  # "a circle in orange"
            out += [f"{lead} {colour} {noun}", f"{own} {noun} in {colour}", f"{own} {noun} coloured {colour}",
                    f"a picture of {lead} {colour} {noun}"]  # fmt: skip
            if n in ("one", "two", "2", "three", "3"):
                out.append(f"{colour} {noun}, {n} of them")
    return list(dict.fromkeys(out))


def video_paraphrases(colour: str, shape: str, direction: str) -> list[str]:
    out = [g.video_caption(colour, shape, direction)]
    for s in SHAPE_WORDS[shape]:
        for d in DIRECTION_WORDS[direction]:
            a = _article(f"{colour} {s}").split()[0]
            out += [f"{a} {colour} {s} moving {d}", f"{a} {colour} {s} going {d}", f"{_article(s)} in {colour} moving {d}",
                    f"{a} {colour} {s} that moves {d}", f"{colour} {s}, moving {d}"]  # fmt: skip
    return list(dict.fromkeys(out))


def audio_paraphrases(kind: str, pitch: str, rhythm: str) -> list[str]:
    out = [g.audio_caption(kind, pitch, rhythm)]
    if kind == "sweep":
        for w in SWEEP_WORDS[pitch]:
            out += [f"a {w} tone", f"a tone, {w}", f"a tone {w}" if " " in w else f"a {w} note"]
        return list(dict.fromkeys(out))
    for k in SOUND_WORDS[kind]:
        for r in RHYTHM_WORDS[rhythm]:
            if kind == "noise":
                out += [f"{r} {k}", f"{k}, {r}", f"a recording of {r} {k}"]
                continue
            for p in PITCH_WORDS[pitch]:
                out += [f"a {r} {p} {k}", f"{_article(p)} {k}, {r}", f"a {k} at a {p} pitch, {r}", f"a recording of a {r} {p} {k}"]
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Meaning:
    """A canonical caption and the attributes it names."""

    modality: str
    caption: str
    attributes: tuple[str, ...]


@functools.cache
def meanings(modality: str) -> tuple[Meaning, ...]:
    """Every meaning of a modality, in the canonical caption order of :mod:`uform.demo.generate`
    (made once a process: every question drawn picks from it)."""
    if modality == "image":
        return tuple(Meaning("image", g.image_caption(c, s, n), (c, s, str(n))) for c in g.COLOURS for s in g.SHAPES for n in (1, 2, 3))
    if modality == "video":
        return tuple(Meaning("video", g.video_caption(c, s, d), (c, s, d)) for c in g.COLOURS for s in g.SHAPES for d in g.DIRECTIONS)
    return tuple(Meaning("audio", c, g.parse_audio(c)) for c in g.audio_captions())


def paraphrases(m: Meaning) -> list[str]:
    if m.modality == "image":
        return image_paraphrases(m.attributes[0], m.attributes[1], int(m.attributes[2]))
    if m.modality == "video":
        return video_paraphrases(*m.attributes)
    return audio_paraphrases(*m.attributes)


# Jumbled captions: the words of a meaning in any order, between separators. The separators
# are never a comma, a colon or brackets (the foreign suite's punctuation), so a foreign
# caption is never a training phrasing, and what a model makes of those is generalisation.
SEPARATORS = (" ", "; ", " - ", " / ", " | ")


def _parts(m: Meaning) -> list[list[str]]:
    """The meaning's parts, each a list of the ways to say it (a jumble orders the parts)."""
    if m.modality == "image":
        colour, shape, count = m.attributes[0], m.attributes[1], int(m.attributes[2])
        nouns = [s if count == 1 else plural_of(s) for s in SHAPE_WORDS[shape]]
        numbers = {1: ["one", "a single"], 2: ["two", "2"], 3: ["three", "3"]}[count]
        return [numbers, [colour, f"in {colour}"], nouns]
    if m.modality == "video":
        colour, shape, direction = m.attributes
        nouns = [w for s in SHAPE_WORDS[shape] for w in (s, _article(s))]
        ways = [f"{verb}{d}" for d in DIRECTION_WORDS[direction] for verb in ("moving ", "going ", "")]
        return [[colour], nouns, ways]
    kind, pitch, rhythm = m.attributes
    if kind == "sweep":
        return [["tone", "a tone", "note"], list(SWEEP_WORDS[pitch])]
    sources = [w for k in SOUND_WORDS[kind] for w in (k, _article(k))]
    if kind == "noise":
        return [sources, list(RHYTHM_WORDS[rhythm])]
    return [sources, [w for p in PITCH_WORDS[pitch] for w in (p, f"{p} pitch")], list(RHYTHM_WORDS[rhythm])]


def jumbles(m: Meaning) -> list[str]:
    """Every jumbled caption of a meaning: each order of its parts, each way of saying each, each separator."""
    from itertools import permutations, product

    out = []
    for order in permutations(_parts(m)):
        for words in product(*order):
            out += [sep.join(words) for sep in SEPARATORS]
    return list(dict.fromkeys(out))


_PHRASES: dict[str, list[str]] = {}
_JUMBLES: dict[str, list[str]] = {}


def phrase(rng: np.random.Generator, m: Meaning, canonical: float = 0.4, jumbled: float = 0.0) -> str:
    """The canonical caption with probability ``canonical``, else a jumble (:func:`jumbles`) with
    probability ``jumbled``, else a paraphrase drawn uniformly."""
    if rng.random() < canonical:
        return m.caption
    if jumbled and rng.random() < jumbled:
        if m.caption not in _JUMBLES:
            _JUMBLES[m.caption] = jumbles(m)
        options = _JUMBLES[m.caption]
    else:
        if m.caption not in _PHRASES:
            _PHRASES[m.caption] = paraphrases(m)
        options = _PHRASES[m.caption]
    return options[int(rng.integers(0, len(options)))]
