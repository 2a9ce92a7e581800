"""The caption spaces of the generated data (generate.py's docstring lists them): the colours,
shapes, directions, sounds, pitches and rhythms, the media's rates and sizes, what a generated
item holds (:class:`Picture`, :class:`Clip`, :class:`Sound`, :class:`Question`), and each
caption made from its attributes, or read back into them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 225),
    "yellow": (235, 205, 20),
    "purple": (140, 45, 185),
    "orange": (245, 130, 15),
}
SHAPES = ("circle", "square", "triangle")
COUNTS = ("a", "two", "three")  # the caption's word for 1, 2, 3 ("an" before a vowel)
DIRECTIONS = ("left", "right", "up", "down")
PITCHES: dict[str, tuple[float, float]] = {"low": (140.0, 260.0), "middle": (420.0, 700.0), "high": (1100.0, 1900.0)}
RHYTHMS: dict[str, float] = {"steady": 0.0, "slowly pulsing": 2.0, "quickly pulsing": 6.0}  # pulses a second
SOUNDS = ("tone", "chord", "noise", "sweep")
SWEEPS = ("rising", "falling")

SAMPLE_RATE = 16000  # the audio generator's rate: the default model's, so no resampling happens
AUDIO_SECONDS = 1.0
VIDEO_FRAMES = 8  # frames a generated clip holds
VIDEO_FPS = 8

YES_NO, DIGITS, LETTERS = 0, 1, 2  # question groups (choice temperature groups)


@dataclass(frozen=True)
class Picture:
    """A generated image: ``pixels`` uint8 ``[size, size, 3]``, its caption and attributes."""

    pixels: np.ndarray
    caption: str
    colour: str
    shape: str
    count: int


@dataclass(frozen=True)
class Clip:
    """A generated video: ``frames`` uint8 ``[VIDEO_FRAMES, size, size, 3]`` at ``VIDEO_FPS``."""

    frames: np.ndarray
    caption: str
    colour: str
    shape: str
    direction: str


@dataclass(frozen=True)
class Sound:
    """A generated recording: ``samples`` int16 at ``SAMPLE_RATE`` (one second), caption, attributes."""

    samples: np.ndarray
    caption: str
    sound: str  # tone, chord, noise or sweep
    pitch: str  # low, middle, high ("" for noise and sweeps)
    rhythm: str  # steady, slowly pulsing, quickly pulsing ("" for sweeps)


@dataclass(frozen=True)
class Question:
    """A question about a caption: the prompt, its single-byte choices, the right one's index, its group."""

    text: str
    choices: str
    answer: int
    group: int


# -- captions ---------------------------------------------------------------------------


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def image_caption(colour: str, shape: str, count: int) -> str:
    return _a(f"{colour} {shape}") if count == 1 else f"{COUNTS[count - 1]} {colour} {shape}s"


def video_caption(colour: str, shape: str, direction: str) -> str:
    return _a(f"{colour} {shape} moving {direction}")


def audio_caption(sound: str, pitch: str, rhythm: str) -> str:
    if sound == "sweep":
        return f"a {pitch} tone"  # pitch holds "rising" or "falling"
    if sound == "noise":
        return f"{rhythm} noise"
    return f"a {rhythm} {pitch} {sound}"


def image_captions() -> list[str]:
    """Every image caption, in a fixed order."""
    return [image_caption(c, s, n) for c in COLOURS for s in SHAPES for n in (1, 2, 3)]


def video_captions() -> list[str]:
    return [video_caption(c, s, d) for c in COLOURS for s in SHAPES for d in DIRECTIONS]


def audio_captions() -> list[str]:
    out = [audio_caption(k, p, r) for k in ("tone", "chord") for p in PITCHES for r in RHYTHMS]
    return out + [audio_caption("noise", "", r) for r in RHYTHMS] + [audio_caption("sweep", s, "") for s in SWEEPS]


def parse_audio(caption: str) -> tuple[str, str, str]:
    """(sound, pitch, rhythm) of an audio caption; ValueError for another."""
    for kind in ("tone", "chord"):
        for p in PITCHES:
            for r in RHYTHMS:
                if caption == audio_caption(kind, p, r):
                    return kind, p, r
    for r in RHYTHMS:
        if caption == audio_caption("noise", "", r):
            return "noise", "", r
    for s in SWEEPS:
        if caption == audio_caption("sweep", s, ""):
            return "sweep", s, ""
    raise ValueError(f"not an audio caption: {caption!r}")


IMAGE = {image_caption(c, s, n): (c, s, n) for c in COLOURS for s in SHAPES for n in (1, 2, 3)}  # caption -> attributes
VIDEO = {video_caption(c, s, d): (c, s, d) for c in COLOURS for s in SHAPES for d in DIRECTIONS}
