"""Variety for training: augmented renderings, motions and sounds, and paraphrased captions.

The training recipe draws most of its items from here and the rest from the canonical
renderers of :mod:`uform.demo.generate` (which the own suite and ``write_media`` use), so
that the towers learn the shape, the motion and the sound rather than one renderer. Every
item carries its *meaning*: the canonical caption of :mod:`uform.demo.generate`
(``"a red circle"``), which is the class the contrastive losses use; its text is one of
:func:`paraphrases` of that caption.

- pictures: backgrounds from black to white, tinted, two-tone gradients or noise; the colour
  shifted in hue, saturation and value; filled shapes, outlined shapes or outlines alone,
  rotated by any angle, drawn aliased or 2x supersampled; non-square frames;
- clips: no trail; sizes 32-96 pixels, 5-30 fps, 0.5-3 s, H.264 or VP8 at random quality
  and keyframe spacing; constant, easing, late-starting or early-stopping motion, shapes
  entering or leaving the frame; a quarter of the clips move a little across the direction;
- recordings: sine, square, sawtooth, triangle or additive voices, chords of several kinds,
  white, pink, brown or band-limited noise, linear or exponential sweeps, gated, struck or
  swelling pulses at jittered rates; made at 8-48 kHz and brought to the tower's rate by the
  runtime's own resampler, -35 to -1 dBFS, silence before and after, a faint noise floor.
"""

from __future__ import annotations

import colorsys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from . import generate as g

# -- captions ---------------------------------------------------------------------------

COUNT_WORDS = {1: ("a", "one", "a single"), 2: ("two", "2", "a pair of"), 3: ("three", "3")}
SHAPE_WORDS = {"circle": ("circle", "disc", "round shape"), "square": ("square", "box"), "triangle": ("triangle", "triangular shape")}
DIRECTION_WORDS = {"left": ("left", "to the left", "leftwards"), "right": ("right", "to the right", "rightwards"),
                   "up": ("up", "upwards"), "down": ("down", "downwards")}  # fmt: skip
PITCH_WORDS = {"low": ("low", "deep"), "middle": ("middle", "medium"), "high": ("high", "shrill")}
RHYTHM_WORDS = {"steady": ("steady", "constant"), "slowly pulsing": ("slowly pulsing", "pulsing slowly"),
                "quickly pulsing": ("quickly pulsing", "rapidly pulsing", "pulsing quickly")}  # fmt: skip
SOUND_WORDS = {"tone": ("tone", "note"), "chord": ("chord",), "noise": ("noise", "hiss")}
SWEEP_WORDS = {"rising": ("rising", "going up"), "falling": ("falling", "going down")}


def _plural(word: str) -> str:
    return word + ("es" if word.endswith("x") else "s")


def _article(words: str) -> str:
    return f"an {words}" if words[0] in "aeiou" else f"a {words}"


def image_paraphrases(colour: str, shape: str, count: int) -> list[str]:
    """Every training phrasing of a picture's caption (the canonical one first)."""
    out = [g.image_caption(colour, shape, count)]
    for n in COUNT_WORDS[count]:
        for s in SHAPE_WORDS[shape]:
            noun = s if count == 1 else _plural(s)
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


def meanings(modality: str) -> list[Meaning]:
    """Every meaning of a modality, in the canonical caption order of :mod:`uform.demo.generate`."""
    if modality == "image":
        return [Meaning("image", g.image_caption(c, s, n), (c, s, str(n))) for c in g.COLOURS for s in g.SHAPES for n in (1, 2, 3)]
    if modality == "video":
        return [Meaning("video", g.video_caption(c, s, d), (c, s, d)) for c in g.COLOURS for s in g.SHAPES for d in g.DIRECTIONS]
    return [Meaning("audio", c, g._parse_audio(c)) for c in g.audio_captions()]


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
        nouns = [s if count == 1 else _plural(s) for s in SHAPE_WORDS[shape]]
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


# -- pictures ---------------------------------------------------------------------------


def _shade(rng: np.random.Generator, colour: str) -> tuple[int, int, int]:
    """The named colour moved in hue (±10°), saturation and value."""
    r, gr, b = (c / 255 for c in g.COLOURS[colour])
    h, s, v = colorsys.rgb_to_hsv(r, gr, b)
    h = (h + float(rng.uniform(-8, 8)) / 360) % 1.0
    s = float(np.clip(s * rng.uniform(0.75, 1.1), 0.45, 1.0))
    v = float(np.clip(v * rng.uniform(0.8, 1.12), 0.5, 1.0))
    out = colorsys.hsv_to_rgb(h, s, v)
    return (int(out[0] * 255), int(out[1] * 255), int(out[2] * 255))


def _ground(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """uint8 [h, w, 3]: light grey at any level, a pale tint, a pale two-tone gradient, mild
    noise, or (one time in eight) dark grey. Never a saturated colour: the caption names the
    shape's colour, and a strongly coloured ground would make it ambiguous."""
    kind = int(rng.choice([0, 0, 1, 2, 3, 4], p=[0.22, 0.22, 0.18, 0.2, 0.06, 0.12]))
    if kind == 0:
        img = np.full((h, w, 3), float(rng.uniform(165, 255))) + rng.uniform(-6, 6, 3)
    elif kind == 1:
        rgb = colorsys.hsv_to_rgb(float(rng.uniform(0, 1)), float(rng.uniform(0.04, 0.18)), float(rng.uniform(0.8, 1.0)))
        img = np.broadcast_to(np.array(rgb) * 255, (h, w, 3)).astype(np.float64)
    elif kind == 2:  # two pale tones
        a = float(rng.uniform(150, 255)) + rng.uniform(-10, 10, 3)
        b = float(rng.uniform(150, 255)) + rng.uniform(-10, 10, 3)
        u = np.linspace(0, 1, w)[None, :, None] if rng.random() < 0.5 else np.linspace(0, 1, h)[:, None, None]
        img = a * (1 - u) + b * u + np.zeros((h, w, 1))
    elif kind == 3:
        img = float(rng.uniform(160, 235)) + rng.normal(0, float(rng.uniform(2, 8)), (h, w, 3))
    else:
        img = np.full((h, w, 3), float(rng.uniform(15, 60))) + rng.uniform(-4, 4, 3)
    return np.clip(img, 0, 255).astype(np.uint8)


def _outline_of(fill: tuple[int, int, int], rng: np.random.Generator) -> tuple[int, int, int]:
    k = float(rng.uniform(0.4, 0.8)) if rng.random() < 0.7 else float(rng.uniform(1.1, 1.4))
    r, gr, b = (int(min(255, c * k)) for c in fill)
    return (r, gr, b)


def _shape(draw: object, shape: str, cx: float, cy: float, r: float, fill: tuple[int, int, int] | None,
           outline: tuple[int, int, int] | None, width: int, angle: float) -> None:  # fmt: skip
    from PIL import ImageDraw

    assert isinstance(draw, ImageDraw.ImageDraw)
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill, outline=outline, width=width)
        return
    corners, radius, start = (4, r * 1.0, 45.0) if shape == "square" else (3, r * 1.1, -90.0)
    points = [(cx + radius * float(np.cos(np.deg2rad(start + angle + 360 * i / corners))),
               cy + radius * float(np.sin(np.deg2rad(start + angle + 360 * i / corners)))) for i in range(corners)]  # fmt: skip
    draw.polygon(points, fill=fill, outline=outline, width=width if outline is not None else 0)


def picture(rng: np.random.Generator, size: int) -> tuple[np.ndarray, Meaning]:
    """A varied picture about ``size`` pixels on its shorter side, and its meaning."""
    from PIL import Image, ImageDraw

    colour, shape, count = str(rng.choice(list(g.COLOURS))), str(rng.choice(g.SHAPES)), int(rng.integers(1, 4))
    long = int(size * float(rng.choice([1.0, 1.0, 1.2, 1.4])))
    w, h = (long, size) if rng.random() < 0.5 else (size, long)
    scale = 2 if rng.random() < 0.5 else 1
    lo, hi = (0.13, 0.34) if count == 1 else (0.1, 0.21) if count == 2 else (0.08, 0.16)
    ox, oy = (w - size) / 2, (h - size) / 2
    centres: list[tuple[float, float]] = []
    radii: list[float] = []
    while len(centres) < count:
        centres, radii = [], []
        for _ in range(count):
            r = float(rng.uniform(lo, hi)) * size
            for _ in range(100):
                x, y = ox + float(rng.uniform(r + 1, size - r - 1)), oy + float(rng.uniform(r + 1, size - r - 1))
                if all((x - a) ** 2 + (y - b) ** 2 > (r + q + 2) ** 2 for (a, b), q in zip(centres, radii)):
                    centres.append((x, y))
                    radii.append(r)
                    break
    image = Image.fromarray(_ground(rng, w * scale, h * scale), "RGB")
    draw = ImageDraw.Draw(image)
    fill = _shade(rng, colour)
    style = int(rng.choice([0, 1, 2], p=[0.7, 0.2, 0.1]))  # filled, filled with an outline, a thick outline alone
    width = max(1, int(round(min(radii) * scale * float(rng.uniform(0.25, 0.4) if style == 2 else rng.uniform(0.05, 0.15)))))
    edge = fill if style == 2 else _outline_of(fill, rng)
    angle = float(rng.uniform(-35, 35))
    for (x, y), r in zip(centres, radii):
        _shape(draw, shape, x * scale, y * scale, r * scale, None if style == 2 else fill, edge if style else None, width, angle)
    if scale > 1:
        image = image.resize((w, h), Image.Resampling.BILINEAR, reducing_gap=None)
    pixels = np.asarray(image, np.uint8).copy()
    return pixels, Meaning("image", g.image_caption(colour, shape, count), (colour, shape, str(count)))


# -- clips ------------------------------------------------------------------------------

CLIP_SIZES = ((32, 32), (48, 48), (64, 64), (64, 48), (48, 64), (80, 64), (96, 96), (40, 32))


@dataclass(frozen=True)
class VariedClip:
    frames: np.ndarray  # uint8 [F, h, w, 3]
    fps: int
    meaning: Meaning


def _position(rng: np.random.Generator, length: float, r: float) -> list[float]:
    """Positions along the axis of motion at 1/4 and 3/4 of the clip and a curve through them:
    answers [a, b, kind, p] with the centre at 1/4 and 3/4, the kind of motion and its parameter."""
    span = float(rng.uniform(0.18, 0.6)) * length
    free = max(length - 2 * r - span, 0.0)
    a = r + float(rng.uniform(0, free)) if free else (length - span) / 2
    return [a, a + span, float(rng.integers(0, 4)), float(rng.uniform(0, 1))]


def _along(t: float, a: float, b: float, kind: float, p: float) -> float:
    def curve(u: float) -> float:
        if kind == 0:  # constant speed
            return u
        if kind == 1:  # starts late and/or stops early, eased
            lo, hi = 0.2 * p, 1 - 0.2 * (1 - p)
            v = min(max((u - lo) / (hi - lo), 0.0), 1.0)
            return v * v * (3 - 2 * v)
        if kind == 2:  # speeding up
            return float(u ** (1.4 + p))
        return float(1 - (1 - u) ** (1.4 + p))  # slowing down

    c0, c1 = curve(0.25), curve(0.75)
    return a + (b - a) * (curve(t) - c0) / (c1 - c0)


def clip(rng: np.random.Generator) -> VariedClip:
    from PIL import Image, ImageDraw

    colour, shape, direction = str(rng.choice(list(g.COLOURS))), str(rng.choice(g.SHAPES)), str(rng.choice(g.DIRECTIONS))
    w, h = CLIP_SIZES[int(rng.integers(0, len(CLIP_SIZES)))]
    fps = int(rng.choice([5, 6, 8, 10, 12, 15, 20, 24, 30]))
    frames_n = int(np.clip(round(fps * float(rng.uniform(0.5, 3.0))), 4, 48))
    dx, dy = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}[direction]
    length, width = (w, h) if dx else (h, w)
    r = float(rng.uniform(0.08, 0.22)) * min(w, h)
    a, b, kind, p = _position(rng, length, r)
    across = float(rng.uniform(r + 1, width - r - 1))
    drift = float(rng.uniform(-0.12, 0.12)) * width if rng.random() < 0.25 else 0.0
    ground = _ground(rng, w, h)
    fill = _shade(rng, colour)
    style = int(rng.choice([0, 1, 2], p=[0.7, 0.2, 0.1]))
    line = max(1, int(round(r * float(rng.uniform(0.1, 0.2) if style == 1 else rng.uniform(0.3, 0.45)))))
    edge = fill if style == 2 else _outline_of(fill, rng)
    angle = float(rng.uniform(-35, 35))
    noise = float(rng.uniform(0, 6)) if rng.random() < 0.3 else 0.0
    frames = np.empty((frames_n, h, w, 3), np.uint8)
    for i in range(frames_n):
        t = i / (frames_n - 1)
        pos = _along(t, a, b, kind, p)
        pos = pos if (dx > 0 or dy > 0) else length - pos
        side = across + drift * (t - 0.5)
        x, y = (pos, side) if dx else (side, pos)
        image = Image.fromarray(ground, "RGB")
        draw = ImageDraw.Draw(image)
        _shape(draw, shape, x, y, r, None if style == 2 else fill, edge if style else None, line, angle)
        f = np.asarray(image, np.uint8)
        if noise:
            f = np.clip(f + rng.normal(0, noise, f.shape), 0, 255).astype(np.uint8)
        frames[i] = f
    return VariedClip(frames, fps, Meaning("video", g.video_caption(colour, shape, direction), (colour, shape, direction)))


# -- recordings -------------------------------------------------------------------------

RATES = (8000, 11025, 16000, 16000, 22050, 24000, 44100, 48000)
CHORDS = ((1.0, 1.26, 1.498), (1.0, 1.189, 1.498), (1.0, 1.335, 1.498), (1.0, 1.122, 1.498), (1.0, 1.498, 2.0),
          (1.0, 1.26, 1.498, 1.782), (1.0, 1.26, 1.498, 2.0))  # fmt: skip


PARTIALS = 12  # the most partials a harmonic voice has, as the recipe made its recordings until 2026-12-04


def _voice(rng: np.random.Generator, cycles: np.ndarray, top: float, rate: int, partials: int = PARTIALS) -> np.ndarray:
    """A periodic voice of ``cycles`` (phase in cycles): sine, or harmonics below Nyquist.

    A harmonic voice has at most ``partials`` partials. At :data:`PARTIALS` (12) every such voice
    has 12, or fewer where Nyquist comes first. With more, each draws how many it has, from 4 up
    to ``partials`` and to the band the tower hears (under 0.45 × the lower of ``rate`` and the
    tower's 16 kHz): bright and dull voices alike, so that a low tone's upper partials are no
    sign of a chord (12 alone taught that partials past the twelfth come from a chord's upper
    voices only: a low sawtooth of 15 or more was heard as a chord)."""
    kind = int(rng.choice([0, 0, 1, 2, 3, 4]))
    if kind == 0:
        return np.asarray(np.sin(2 * np.pi * cycles), np.float64)
    limit = max(1, int((rate * 0.45) // max(top, 1.0)))
    if partials != PARTIALS:
        heard = max(1, int((min(rate, g.SAMPLE_RATE) * 0.45) // max(top, 1.0)))
        most = min(limit, heard, partials)
        limit = int(rng.integers(min(4, most), most + 1))
    x = np.zeros_like(cycles)
    for k in range(1, min(limit, partials) + 1):
        if kind == 1 and k % 2:  # square
            x += np.sin(2 * np.pi * k * cycles) / k
        elif kind == 2:  # sawtooth
            x += np.sin(2 * np.pi * k * cycles) / k
        elif kind == 3 and k % 2:  # triangle
            x += np.sin(2 * np.pi * k * cycles) * (-1) ** (k // 2) / (k * k)
        elif kind == 4:  # random harmonic weights, decaying
            x += float(rng.uniform(0, 1)) * 0.7 ** (k - 1) * np.sin(2 * np.pi * k * cycles + float(rng.uniform(0, 6.28)))
    return np.asarray(x / (np.abs(x).max() + 1e-9), np.float64)


def _coloured_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    kind = int(rng.integers(0, 4))
    x = rng.standard_normal(n)
    if kind:
        spec = np.fft.rfft(x)
        f = np.maximum(np.fft.rfftfreq(n), 1.0 / n)
        if kind == 1:
            spec /= np.sqrt(f)  # pink
        elif kind == 2:
            spec /= f  # brown
        else:  # a band
            lo = float(rng.uniform(0.01, 0.15))
            spec *= (f > lo) & (f < lo * float(rng.uniform(2, 6)))
        x = np.fft.irfft(spec, n)
    return np.asarray(x / (np.abs(x).max() + 1e-9), np.float64)


def _pulses(rng: np.random.Generator, t: np.ndarray, rhythm: str) -> np.ndarray:
    if rhythm == "steady":
        return np.ones_like(t)
    rate = float(rng.uniform(1.4, 2.8) if rhythm == "slowly pulsing" else rng.uniform(4.5, 8.5))
    phase = (t * rate + float(rng.uniform(0, 1))) % 1.0
    kind = int(rng.integers(0, 3))
    if kind == 0:  # gated
        duty = float(rng.uniform(0.25, 0.7))
        env = (phase < duty).astype(np.float64)
        ramp = max(1, int(len(t) / (t[-1] + 1e-9) * 0.005))
        return np.convolve(env, np.ones(ramp) / ramp, mode="same")
    if kind == 1:  # struck
        return np.minimum(phase / 0.015, 1.0) * np.exp(-phase / float(rng.uniform(0.08, 0.3)))
    return np.asarray(np.sin(np.pi * phase) ** float(rng.uniform(1, 3)), np.float64)  # swelling


def sound(rng: np.random.Generator, window: int = g.SAMPLE_RATE, partials: int = PARTIALS) -> tuple[np.ndarray, Meaning]:
    """A varied recording as the tower's window (float32, ``window`` samples at the tower's rate),
    brought there by the runtime's resampler, and its meaning; its voices have at most
    ``partials`` partials (:func:`_voice`)."""
    from uform.plugins import recordings

    caption = str(rng.choice(g.audio_captions()))
    kind, pitch, rhythm = g._parse_audio(caption)
    rate = int(rng.choice(RATES))
    lead = float(rng.uniform(0, 0.25)) if rng.random() < 0.6 else 0.0
    body = float(rng.uniform(0.6, 1.6))
    n = int(body * rate)
    t = np.arange(n) / rate
    if kind in ("tone", "chord"):
        lo, hi = g.PITCHES[pitch]
        root = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        ratios = (1.0,) if kind == "tone" else CHORDS[int(rng.integers(0, len(CHORDS)))]
        x = sum(_voice(rng, root * q * t + float(rng.uniform(0, 1)), root * q, rate, partials) for q in ratios) / len(ratios)
        x = x * _pulses(rng, t, rhythm)
    elif kind == "noise":
        x = _coloured_noise(rng, n) * _pulses(rng, t, rhythm)
    else:
        f0, f1 = float(rng.uniform(130, 450)), float(rng.uniform(1000, 3000))
        if pitch == "falling":
            f0, f1 = f1, f0
        freq = f0 + (f1 - f0) * t / body if rng.random() < 0.5 else f0 * (f1 / f0) ** (t / body)
        x = _voice(rng, np.cumsum(freq) / rate, max(f0, f1), rate, partials)
    fade = max(1, min(n // 5, int(rate * float(rng.uniform(0.003, 0.03)))))
    x[:fade] *= np.linspace(0, 1, fade)
    x[-fade:] *= np.linspace(1, 0, fade)
    level = 10 ** (float(rng.uniform(-35, -1)) / 20)
    x = x / (np.abs(x).max() + 1e-9) * level
    x = np.concatenate([np.zeros(int(lead * rate)), x, np.zeros(int(rate * float(rng.uniform(0, 0.3))))])
    if rng.random() < 0.4:
        x = x + _coloured_noise(rng, len(x)) * level * 10 ** (float(rng.uniform(-50, -25)) / 20)
    x16 = np.clip(np.rint(x * 32767), -32768, 32767) / 32768  # 16-bit, as files mostly are
    made = recordings.resample(0, x16.astype(np.float32), rate, g.SAMPLE_RATE, window).samples
    return np.asarray(made, np.float32), Meaning("audio", caption, (kind, pitch, rhythm))


# -- questions --------------------------------------------------------------------------

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


def _asks(m: Meaning) -> list[tuple[str, list[str], str]]:
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
    asks = _asks(m)
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


# -- the byte decoder's own phase: more phrasings, synonyms of the asked values, near misses --
#
# The recipe's second phase (``uform.training.decoder.train_decoder``) trains the byte decoder
# alone on these, mixed with ``question`` and ``generate.question``. None of them is a
# calibration phrasing (``CALIBRATION_ASK`` / ``_WHICH`` / ``_HOW_MANY``, tested), nor uses
# the calibration's distinctive words ("look", "number", "shown", "sound like", "pick"), so
# the calibration questions stay phrasings the decoder never saw. ``{v}`` is a word for the
# asked value, ``{n}`` the description's own noun for its subject ("box", "discs", "hiss").

VALUE_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "colour": {c: (c,) for c in g.COLOURS},
    "shape": SHAPE_WORDS,
    "count": {"1": ("1", "one"), "2": ("2", "two"), "3": ("3", "three")},
    "direction": DIRECTION_WORDS,
    "sound": {"tone": ("tone", "note"), "chord": ("chord",), "noise": ("noise", "hiss"), "sweep": ("sweep",)},
    "pitch": {k: tuple(w) for k, w in PITCH_WORDS.items()},
    "rhythm": {"steady": ("steady", "constant"), "slow": ("slow", "slowly pulsing", "pulsing slowly"),
               "fast": ("fast", "quickly pulsing", "rapidly pulsing", "pulsing quickly")},  # fmt: skip
}
ATTRIBUTE_WORDS = {"colour": ("colour", "color", "hue"), "shape": ("shape", "form"), "count": ("count", "amount"),
                   "direction": ("direction", "motion", "movement"), "sound": ("sound", "kind of sound"), "pitch": ("pitch",),
                   "rhythm": ("rhythm", "pulse", "tempo")}  # fmt: skip
DECODER_ASK = {
    "colour": ("Is it {v}?", "Is the {n} {v}?", "Is it {v} in colour?", "Is the colour {v}?", "Is it a {v} one?", "Is it {v} or not?",
               "Is it true that it is {v}?", "Colour: {v}?", "Is the {n} coloured {v}?", "Is it painted {v}?", "Is it {v}, yes or no?",
               "Are they {v}?", "{v}?", "Is {v} its colour?", "Has it the colour {v}?"),
    "shape": ("Is it a {v}?", "Is the shape a {v}?", "Is it shaped as a {v}?", "Is it a {v} or not?", "Is it true that it is a {v}?",
              "Are they {v}s?", "Is that thing a {v}?", "Is it a {v}, yes or no?", "Is the form a {v}?", "A {v}?", "Is it drawn as a {v}?",
              "Is it in the shape of a {v}?"),
    "count": ("Are there {v}?", "Are there {v} of them?", "Are {v} drawn?", "Is it {v} shapes?", "Are there {v} {n}?", "Do you count {v}?",
              "Is the amount {v}?", "Are there exactly {v}?", "Is the count {v}, yes or no?", "{v} of them?", "Are there {v} in all?",
              "Do we have {v}?", "Can you see {v}?"),
    "direction": ("Is it moving {v}?", "Is the {n} moving {v}?", "Does the {n} move {v}?", "Is it travelling {v}?", "Is the motion {v}?",
                  "Is it heading {v}?", "Does it head {v}?", "Is the movement {v}?", "Is it moving {v} or not?", "Moving {v}, yes or no?",
                  "Is the direction of motion {v}?", "Does it slide {v}?", "Is it on its way {v}?", "{v}?"),
    "sound": ("Is it a {v}?", "Is the sound a {v}?", "Is it a {v} we hear?", "Do we hear a {v}?", "Is the recording a {v}?",
              "Is there a {v}?", "Is what plays a {v}?", "Is it a {v}, yes or no?", "Is it a {v} or not?", "Is the kind of sound a {v}?",
              "A {v}?", "Can you hear a {v}?"),
    "pitch": ("Is the pitch {v}?", "Is it a {v} {n}?", "Is the {n} {v}?", "Is it {v}?", "Is it pitched {v}?", "Is the pitch {v} or not?",
              "Is its pitch a {v} one?", "Is it at a {v} pitch?", "Is the {n} at a {v} pitch?", "Is it {v} in pitch?", "{v} pitch?"),
    "rhythm": ("Is the rhythm {v}?", "Is it {v}?", "Is the {n} {v}?", "Is the pulse {v}?", "Is the beat {v}?", "Is it {v} or not?",
               "Is the rhythm {v}, yes or no?", "Does it pulse {v}?", "Is the tempo {v}?", "Is the {n} a {v} one?", "{v}?"),
}  # fmt: skip
DECODER_WHICH = ("Which {a}?", "What {a} is it?", "What {a} does it have?", "Which {a} fits?", "Which of these is the {a}?",
                 "Which {a} does the {n} have?", "Which {a} best describes it?", "Choose the {a} it has.", "{A}?", "What {a}?",
                 "Which {a} is correct?", "Which is its {a}?", "Tell me the {a}.", "Which {a}, then?", "Give the {a}.")  # fmt: skip
DECODER_HOW_MANY = ("How many shapes?", "How many are there?", "How many {n}?", "How many {n} are there?", "How many are drawn?",
                    "How many can be seen?", "How many things are there?", "How many in all?", "Count of shapes?",
                    "How many {n} do you see?", "What is the amount?", "How many, exactly?")  # fmt: skip
DECODER_LEADS = ("", "", "", "", "", "Question: ", "Q: ", "Tell me, ", "Now, ", "Say, ", "Please answer: ", "One question: ", "Then, ")
DECODER_JOINS = (". ", ". ", ". ", ". ", "; ", "! ", " -- ", " ", ".\n", ". Then ", " - ")
DECODER_WRAPS = {
    "image": ("there is {c}", "it is {c}", "this is {c}", "we see {c}", "here is {c}", "an image of {c}", "a drawing of {c}"),
    "video": ("there is {c}", "it is {c}", "this is {c}", "we see {c}", "a video of {c}", "a clip of {c}", "here is {c}"),
    "audio": ("there is {c}", "it is {c}", "this is {c}", "we hear {c}", "a sound of {c}", "a clip of {c}", "here is {c}"),
}  # fmt: skip
DECODER_AFTER = {  # words about how it was made, which the answer does not depend on (not the calibration's EXTRA)
    "image": ("on grey", "drawn small", "with soft edges", "in the middle", "near a corner", "drawn large"),
    "video": ("for two seconds", "across the frame", "on grey", "drawn small", "at 10 frames a second"),
    "audio": ("for one second", "faintly", "with silence after it", "at 22 kHz", "then silence"),
}  # fmt: skip
OPTION_FORMS = ("{l}) {o}", "{l}) {o}", "{l}) {o}", "({l}) {o}", "{l}. {o}", "{l} - {o}")
OPTION_JOINS = (" ", " ", " ", ", ", "; ", " / ")


def _noun(m: Meaning, caption: str) -> str:
    """The description's own word for its subject: the shape word it uses (plural for two or three), or the sound's."""
    if m.modality == "audio":
        kind = m.attributes[0]
        words = ("tone", "note") if kind == "sweep" else SOUND_WORDS[kind]
        return next((w for w in words if w in caption), words[0])
    plural = m.modality == "image" and m.attributes[2] != "1"
    for w in sorted(SHAPE_WORDS[m.attributes[1]], key=len, reverse=True):
        said = _plural(w) if plural else w
        if said in caption:
            return said
    return _plural(m.attributes[1]) if plural else m.attributes[1]


def _capital(s: str) -> str:
    return s[:1].upper() + s[1:]


def decoder_question(rng: np.random.Generator, jumbled: float = 0.35, shuffled: float = 0.5) -> g.Question:
    """A question for the decoder's own phase: a paraphrased or jumbled description, sometimes
    wrapped (``there is …``), capitalised or followed by words about the medium that the answer
    does not depend on; asked in one of ``DECODER_ASK`` / ``DECODER_WHICH`` / ``DECODER_HOW_MANY``
    with the asked value in any of its words (``disc`` for a circle, ``deep`` for low), yes/no
    answers balanced and their wrong values drawn from the near misses too (another value of the
    same attribute); lettered options in several forms, in a random order with probability
    ``shuffled`` (the decoder phase's 0.5, the reading stage's 1.0), sometimes only some of them
    (the right one among them) or in other words."""
    modality = str(rng.choice(["image", "video", "audio"]))
    pool = meanings(modality)
    m = pool[int(rng.integers(0, len(pool)))]
    caption = phrase(rng, m, canonical=0.25, jumbled=jumbled)
    noun = _noun(m, caption)
    if rng.random() < 0.25:
        caption = str(rng.choice(DECODER_WRAPS[modality])).format(c=caption)
    if rng.random() < 0.15:
        caption = f"{caption} {rng.choice(DECODER_AFTER[modality])}"
    if rng.random() < 0.3:
        caption = _capital(caption)
    lead, join = str(rng.choice(DECODER_LEADS)), str(rng.choice(DECODER_JOINS))
    asks = _asks(m)
    attribute, options, value = asks[int(rng.integers(0, len(asks)))]
    words = VALUE_WORDS[attribute]
    name = str(rng.choice(ATTRIBUTE_WORDS[attribute]))
    form = int(rng.integers(0, 3))
    if attribute == "count" and form == 2:
        asked = str(rng.choice(DECODER_HOW_MANY)).format(n=noun if m.attributes[2] != "1" else _plural(noun))
        text, choices, answer, group = f"{asked} Answer 1, 2 or 3: ", "123", int(value) - 1, g.DIGITS
    elif form == 1:
        shown = list(options)
        if rng.random() < 0.3:  # only some of them, the right one among them
            others = [o for o in shown if o != value]
            keep = int(rng.integers(1, len(others) + 1))
            chosen = {value, *(others[int(i)] for i in rng.permutation(len(others))[:keep])}
            shown = [o for o in shown if o in chosen]
        if shuffled and rng.random() < shuffled:
            shown = [shown[int(i)] for i in rng.permutation(len(shown))]
        said = [str(rng.choice(words[o])) if rng.random() < 0.3 else o for o in shown]
        option, between = str(rng.choice(OPTION_FORMS)), str(rng.choice(OPTION_JOINS))
        listed = between.join(option.format(l="abcdefgh"[i], o=o) for i, o in enumerate(said))
        asked = str(rng.choice(DECODER_WHICH)).format(a=name, A=_capital(name), n=noun)
        text, choices, answer, group = f"{asked} {listed}. Answer: ", "abcdefgh"[: len(shown)], shown.index(value), g.LETTERS
    else:
        truth = bool(rng.integers(0, 2))
        asked_value = value if truth else str(rng.choice([o for o in options if o != value]))
        template = str(rng.choice(DECODER_ASK[attribute]))
        v = str(rng.choice(words[asked_value]))
        if "{v}s" in template and v.endswith("x"):
            template = template.replace("{v}s", "{v}es")
        if template.startswith("{v}"):
            v = _capital(v)
        if attribute == "count" and "{n}" in template:
            template = template.replace("{n}", _plural(noun) if m.attributes[2] == "1" else noun)
        if m.modality == "image" and m.attributes[2] != "1":  # "are the boxes …", not "is the boxes …"
            template = template.replace("Is the {n}", "Are the {n}")
        text = template.format(v=v, n=noun).replace(" a a", " an a").replace(" a o", " an o")
        text, choices, answer, group = f"{text} Answer y or n: ", "yn", 0 if truth else 1, g.YES_NO
    text = text[0].lower() + text[1:] if lead.endswith(", ") else text
    return g.Question(f"{caption}{join}{lead}{text}", choices, answer, group)
