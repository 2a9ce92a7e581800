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
"""

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


# -- images -----------------------------------------------------------------------------


def _draw(draw: object, shape: str, cx: float, cy: float, r: float, fill: tuple[int, int, int]) -> None:
    from PIL import ImageDraw

    assert isinstance(draw, ImageDraw.ImageDraw)
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        h = r * 0.86
        draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
    else:  # an upward triangle inscribed in the circle of radius r, nudged down to centre its area
        cy += r * 0.2
        draw.polygon([(cx, cy - 1.1 * r), (cx - 1.05 * r, cy + 0.65 * r), (cx + 1.05 * r, cy + 0.65 * r)], fill=fill)


def _background(rng: np.random.Generator) -> tuple[int, int, int]:
    g = int(rng.integers(200, 250))
    return (g + int(rng.integers(-6, 7)), g + int(rng.integers(-6, 7)), g + int(rng.integers(-6, 7)))


def _jitter(rng: np.random.Generator, colour: tuple[int, int, int]) -> tuple[int, int, int]:
    r, g, b = (int(np.clip(c + rng.integers(-15, 16), 0, 255)) for c in colour)
    return (r, g, b)


def _place(rng: np.random.Generator, size: int, radii: list[float]) -> list[tuple[float, float]] | None:
    centres: list[tuple[float, float]] = []
    for r in radii:
        for _ in range(200):
            x, y = rng.uniform(r + 1, size - r - 1, 2)
            if all((x - a) ** 2 + (y - b) ** 2 >= (r + q + 1.5) ** 2 for (a, b), q in zip(centres, radii)):
                centres.append((float(x), float(y)))
                break
        else:
            return None
    return centres


def picture(rng: np.random.Generator, size: int = 32, *, colour: str | None = None, shape: str | None = None,
            count: int | None = None) -> Picture:  # fmt: skip
    """One picture of ``count`` shapes; unspecified attributes are drawn uniformly."""
    from PIL import Image, ImageDraw

    colour = colour if colour is not None else str(rng.choice(list(COLOURS)))
    shape = shape if shape is not None else str(rng.choice(SHAPES))
    count = count if count is not None else int(rng.integers(1, 4))
    lo, hi = (0.16, 0.3) if count == 1 else (0.12, 0.19) if count == 2 else (0.1, 0.15)
    while True:
        radii = [float(rng.uniform(lo, hi)) * size for _ in range(count)]
        centres = _place(rng, size, radii)
        if centres is not None:
            break
    image = Image.new("RGB", (size, size), _background(rng))
    draw = ImageDraw.Draw(image)
    fill = _jitter(rng, COLOURS[colour])
    for (x, y), r in zip(centres, radii):
        _draw(draw, shape, x, y, r, fill)
    return Picture(np.asarray(image, np.uint8).copy(), image_caption(colour, shape, count), colour, shape, count)


# -- videos -----------------------------------------------------------------------------

TRAIL = ((0.55, 0.8), (0.3, 0.6), (0.15, 0.4))  # ghosts behind a moving shape: (share of its colour, of its size), nearest first
_STEPS = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0), "down": (0.0, 1.0)}


def clip(rng: np.random.Generator, size: int = 32, *, colour: str | None = None, shape: str | None = None,
         direction: str | None = None) -> Clip:  # fmt: skip
    """A clip of ``VIDEO_FRAMES`` frames: one shape crossing about half the frame in ``direction``."""
    from PIL import Image, ImageDraw

    colour = colour if colour is not None else str(rng.choice(list(COLOURS)))
    shape = shape if shape is not None else str(rng.choice(SHAPES))
    direction = direction if direction is not None else str(rng.choice(DIRECTIONS))
    r = float(rng.uniform(0.13, 0.2)) * size
    travel = float(rng.uniform(0.4, 0.55)) * (size - 2 * r - 2)
    dx, dy = _STEPS[direction]
    # start so that the whole path stays inside the frame
    lo, hi = r + 1, size - r - 1
    along = float(rng.uniform(lo, hi - travel))
    across = float(rng.uniform(lo, hi))
    sx = (along if dx > 0 else size - along) if dx else across
    sy = (along if dy > 0 else size - along) if dy else across
    background, fill = _background(rng), _jitter(rng, COLOURS[colour])
    frames = np.empty((VIDEO_FRAMES, size, size, 3), np.uint8)
    for i in range(VIDEO_FRAMES):
        t = i / (VIDEO_FRAMES - 1)
        x, y = sx + dx * travel * t, sy + dy * travel * t
        image = Image.new("RGB", (size, size), background)
        draw = ImageDraw.Draw(image)
        # a fading, tapering trail behind the shape (a motion cue, as in a long exposure):
        # the direction shows within each frame as well as from frame to frame
        for k, (fade, shrink) in reversed(list(enumerate(TRAIL, 1))):
            ghost = tuple(int(round(b + (f - b) * fade)) for f, b in zip(fill, background))
            back = k * 0.7 * r
            _draw(draw, shape, x - dx * back, y - dy * back, r * shrink, (ghost[0], ghost[1], ghost[2]))
        _draw(draw, shape, x, y, r, fill)
        frames[i] = np.asarray(image, np.uint8)
    return Clip(frames, video_caption(colour, shape, direction), colour, shape, direction)


# -- audio ------------------------------------------------------------------------------


def _envelope(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """1 throughout for steady; else ``rate`` pulses a second, each on for about 45 % of its period."""
    t = np.arange(n) / SAMPLE_RATE
    if rate == 0:
        env = np.ones(n)
    else:
        period = 1.0 / (rate * float(rng.uniform(0.9, 1.1)))
        phase = (t + float(rng.uniform(0, period))) % period
        env = (phase < 0.45 * period).astype(np.float64)
    ramp = int(0.004 * SAMPLE_RATE)  # 4 ms fades, no clicks
    kernel = np.ones(ramp) / ramp
    return np.convolve(env, kernel, mode="same")


def sound(rng: np.random.Generator, *, kind: str | None = None, pitch: str | None = None, rhythm: str | None = None) -> Sound:
    """One second of audio at ``SAMPLE_RATE``; unspecified attributes are drawn (captions uniformly)."""
    if kind is None and pitch is None and rhythm is None:
        caption = str(rng.choice(audio_captions()))
        kind, pitch, rhythm = _parse_audio(caption)
    kind = kind if kind is not None else str(rng.choice(SOUNDS))
    if kind == "sweep":
        pitch = pitch if pitch in SWEEPS else str(rng.choice(SWEEPS))
        rhythm = ""
    elif kind == "noise":
        pitch, rhythm = "", rhythm if rhythm is not None else str(rng.choice(list(RHYTHMS)))
    else:
        pitch = pitch if pitch is not None else str(rng.choice(list(PITCHES)))
        rhythm = rhythm if rhythm is not None else str(rng.choice(list(RHYTHMS)))
    n = int(AUDIO_SECONDS * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    if kind == "noise":
        x = rng.standard_normal(n) * 0.3
    elif kind == "sweep":
        f0, f1 = float(rng.uniform(180, 300)), float(rng.uniform(1200, 2000))
        if pitch == "falling":
            f0, f1 = f1, f0
        freq = f0 * (f1 / f0) ** (t / AUDIO_SECONDS)  # exponential sweep
        x = np.sin(2 * np.pi * np.cumsum(freq) / SAMPLE_RATE + float(rng.uniform(0, 2 * np.pi)))
    else:
        lo, hi = PITCHES[pitch]
        f = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        ratios = (1.0, 1.25992, 1.49831) if kind == "chord" else (1.0,)  # a major triad: root, third, fifth
        x = np.mean([np.sin(2 * np.pi * f * q * t + float(rng.uniform(0, 2 * np.pi))) for q in ratios], axis=0)
    if kind != "sweep":
        x = x * _envelope(rng, n, RHYTHMS[rhythm])
    x = x * float(rng.uniform(0.3, 0.8)) + rng.standard_normal(n) * float(rng.uniform(0.0, 0.01))
    samples = np.clip(np.rint(x * 32767), -32768, 32767).astype(np.int16)
    return Sound(samples, audio_caption(kind, pitch, rhythm), kind, pitch, rhythm)


def _parse_audio(caption: str) -> tuple[str, str, str]:
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


def samples_float(s: Sound) -> np.ndarray:
    """The recording as the runtime reads a 16-bit file: ``s16 / 32768``, float32."""
    return (s.samples.astype(np.float32) / np.float32(32768)).astype(np.float32)


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
    if caption in _IMAGE:
        colour, shape, count = _IMAGE[caption]
        asks = [("colour", list(COLOURS), colour), ("shape", list(SHAPES), shape), ("count", ["1", "2", "3"], str(count))]
    elif caption in _VIDEO:
        colour, shape, direction = _VIDEO[caption]
        asks = [("colour", list(COLOURS), colour), ("shape", list(SHAPES), shape), ("direction", list(DIRECTIONS), direction)]
    else:
        kind, pitch, rhythm = _parse_audio(caption)
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


_IMAGE = {image_caption(c, s, n): (c, s, n) for c in COLOURS for s in SHAPES for n in (1, 2, 3)}
_VIDEO = {video_caption(c, s, d): (c, s, d) for c in COLOURS for s in SHAPES for d in DIRECTIONS}
