"""Procedural paired data: shapes in pictures and clips, tones in recordings, questions.

Every generator takes a :class:`numpy.random.Generator` and draws from it alone, so a seed
gives the same media, captions and questions on every machine (Pillow draws without
anti-aliasing; the audio is plain float64 arithmetic rounded to 16-bit samples).

The caption spaces (docs/training.md lists them):

- images: ``{count} {colour} {shape}`` — one to three shapes of one colour and kind, at
  random sizes and positions on a light grey background: "a red circle", "two blue squares",
  "three yellow triangles" (6 colours x 3 shapes x 3 counts = 54 captions);
- videos: one shape moving in a direction: "a green square moving left"
  (6 colours x 3 shapes x 4 directions = 72 captions);
- audio: "a steady low tone", "a quickly pulsing high chord", "slowly pulsing noise",
  "a rising tone" (tones and chords x 3 pitches x 3 rhythms, noise x 3 rhythms, two sweeps:
  23 captions);
- questions about a caption for ``text_choose``: yes/no (choices ``"yn"``, group 0), how many
  (``"123"``, group 1), and lettered options (``"abc..."``, group 2).

Each is a module of its own: the caption spaces spaces.py, pictures and clips shapes.py,
recordings tones.py; this module asks the questions, and names them all.
"""

from __future__ import annotations

import numpy as np

from .shapes import TRAIL, clip, picture
from .spaces import (AUDIO_SECONDS, COLOURS, COUNTS, DIGITS, DIRECTIONS, IMAGE, LETTERS, PITCHES, RHYTHMS, SAMPLE_RATE, SHAPES, SOUNDS,
                     SWEEPS, VIDEO, VIDEO_FPS, VIDEO_FRAMES, YES_NO, Clip, Picture, Question, Sound, audio_caption, audio_captions,
                     image_caption, image_captions, parse_audio, video_caption, video_captions)  # fmt: skip
from .tones import samples_float, sound

__all__ = ["AUDIO_SECONDS", "COLOURS", "COUNTS", "DIGITS", "DIRECTIONS", "LETTERS", "PITCHES", "RHYTHMS", "SAMPLE_RATE", "SHAPES",
           "SOUNDS", "SWEEPS", "TRAIL", "VIDEO_FPS", "VIDEO_FRAMES", "YES_NO", "Clip", "Picture", "Question", "Sound", "audio_caption",
           "audio_captions", "clip", "image_caption", "image_captions", "parse_audio", "picture", "question", "samples_float", "sound",
           "video_caption", "video_captions"]  # fmt: skip


# -- questions --------------------------------------------------------------------------

_LETTERS = "abcdefgh"


def _yes_no(rng: np.random.Generator, caption: str, asked: str, truth: bool) -> Question:
    return Question(f"{caption}. {asked} Answer y or n: ", "yn", 0 if truth else 1, YES_NO)


def _options(caption: str, asked: str, options: list[str], right: str) -> Question:
    listed = " ".join(f"{_LETTERS[i]}) {o}" for i, o in enumerate(options))
    return Question(f"{caption}. {asked} {listed}. Answer: ", _LETTERS[: len(options)], options.index(right), LETTERS)


def question(rng: np.random.Generator, caption: str | None = None) -> Question:
    """A question about a caption (drawn from every modality's captions when not given); the
    kinds of question a caption allows are drawn uniformly, and yes/no answers are balanced."""
    if caption is None:
        pool = [image_captions, video_captions, audio_captions][int(rng.integers(0, 3))]()
        caption = str(rng.choice(pool))
    asks: list[tuple[str, list[str], str]] = []  # (attribute, options, value)
    if caption in IMAGE:
        colour, shape, count = IMAGE[caption]
        asks = [("colour", list(COLOURS), colour), ("shape", list(SHAPES), shape), ("count", ["1", "2", "3"], str(count))]
    elif caption in VIDEO:
        colour, shape, direction = VIDEO[caption]
        asks = [("colour", list(COLOURS), colour), ("shape", list(SHAPES), shape), ("direction", list(DIRECTIONS), direction)]
    else:
        kind, pitch, rhythm = parse_audio(caption)
        sound_name = "sweep" if kind == "sweep" else kind
        asks = [("sound", list(SOUNDS), sound_name)]
        if kind in ("tone", "chord"):
            asks.append(("pitch", list(PITCHES), pitch))
        if kind != "sweep":
            asks.append(("rhythm", ["steady", "slow", "fast"], {"steady": "steady", "slowly pulsing": "slow", "quickly pulsing": "fast"}[rhythm]))
    attribute, options, value = asks[int(rng.integers(0, len(asks)))]
    form = int(rng.integers(0, 3))
    if attribute == "count" and form == 2:
        return Question(f"{caption}. How many shapes? Answer 1, 2 or 3: ", "123", int(value) - 1, DIGITS)
    if form == 1:
        return _options(caption, f"Which {attribute}?", options, value)
    truth = bool(rng.integers(0, 2))
    asked = value if truth else str(rng.choice([o for o in options if o != value]))
    phrasing = {
        "colour": f"Is it {asked}?", "shape": f"Is it a {asked}?", "count": f"Are there {asked}?",
        "direction": f"Is it moving {asked}?", "sound": f"Is it a {asked}?", "pitch": f"Is the pitch {asked}?",
        "rhythm": f"Is the rhythm {asked}?",
    }[attribute]  # fmt: skip
    return _yes_no(rng, caption, phrasing, truth)

