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
"""

from __future__ import annotations

import colorsys
import io
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..verbs import ITEM_VERBS

if TYPE_CHECKING:
    from uform.model import Model

FOREIGN_STREAM = 5  # numpy.random.default_rng([FOREIGN_STREAM, seed]); training, calibration and the own suite use 1-4
DEFAULT_COUNT = 96

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


# -- pictures ---------------------------------------------------------------------------


def paint(rng: np.random.Generator, colour: str) -> tuple[int, int, int]:
    lo, hi, s_lo, v_lo = HUES[colour]
    h = (float(rng.uniform(lo, hi)) % 360) / 360
    s, v = float(rng.uniform(s_lo, 1.0)), float(rng.uniform(v_lo, 1.0))
    r, g, b = colorsys.hsv_to_rgb(h, s, v)
    return (int(r * 255), int(g * 255), int(b * 255))


def backdrop(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """``float [h, w, 3]``: white, dark, a pale tint, a gradient, or a texture."""
    kind = int(rng.integers(0, 5))
    if kind == 0:
        base = np.full((height, width, 3), float(rng.uniform(236, 255)))
    elif kind == 1:
        base = np.full((height, width, 3), float(rng.uniform(20, 70)))
    elif kind == 2:
        tint = np.array(colorsys.hsv_to_rgb(float(rng.uniform(0, 1)), float(rng.uniform(0.05, 0.18)), float(rng.uniform(0.85, 1.0))))
        base = np.broadcast_to(tint * 255, (height, width, 3)).copy()
    elif kind == 3:
        a, b = (float(x) for x in rng.uniform(150, 255, 2)) if rng.random() < 0.7 else (float(x) for x in rng.uniform(15, 90, 2))
        ramp = np.linspace(a, b, width if rng.random() < 0.5 else height)
        base = np.broadcast_to(ramp[None, :, None] if len(ramp) == width else ramp[:, None, None], (height, width, 3)).copy()
    else:
        level = float(rng.uniform(170, 235))
        base = level + rng.normal(0, float(rng.uniform(4, 12)), (height, width, 1)) + np.zeros((1, 1, 3))
    return base


def _outline(colour: tuple[int, int, int], rng: np.random.Generator) -> tuple[int, int, int]:
    k = float(rng.uniform(0.45, 0.75))
    r, g, b = (int(c * k) for c in colour)
    return (r, g, b)


def _polygon(shape: str, cx: float, cy: float, r: float, turn: float) -> list[tuple[float, float]]:
    if shape == "square":
        angles = [45 + 90 * i for i in range(4)]
        radius = r * 0.95
    else:
        angles = [-90 + 120 * i for i in range(3)]
        radius = r * 1.05
    out = []
    for a in angles:
        t = np.deg2rad(a + turn)
        out.append((cx + radius * float(np.cos(t)), cy + radius * float(np.sin(t))))
    return out


def stamp(draw: Any, shape: str, cx: float, cy: float, r: float, fill: tuple[int, int, int], style: int, line: int,
          edge: tuple[int, int, int], turn: float) -> None:  # fmt: skip
    """Shape ``shape`` at (cx, cy), radius r: style 0 filled, 1 filled with an outline, 2 a ring."""
    inside = None if style == 2 else fill
    outline = fill if style == 2 else edge if style == 1 else None
    width = line if style else 0
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=inside, outline=outline, width=width)
    else:
        points = _polygon(shape, cx, cy, r, turn)
        if style == 0:
            draw.polygon(points, fill=inside)
        else:
            draw.polygon(points, fill=inside, outline=outline, width=width)


@dataclass(frozen=True)
class Item:
    """One foreign medium as file bytes, its caption and meaning (its attributes, as a tuple)."""

    data: bytes
    caption: str
    meaning: tuple[str, ...]


def picture(rng: np.random.Generator) -> Item:
    from PIL import Image, ImageDraw

    colour, shape, count = str(rng.choice(list(HUES))), str(rng.choice(KINDS)), int(rng.integers(1, 4))
    side = int(rng.choice([40, 56, 80, 100, 150, 224]))
    wide = int(side * float(rng.choice([1.0, 1.0, 1.15, 1.3])))
    width, height = (wide, side) if rng.random() < 0.5 else (side, wide)
    zoom = int(rng.choice([1, 2, 4]))  # supersampling: 1 is Pillow's aliased drawing
    lo, hi = {1: (0.14, 0.32), 2: (0.1, 0.2), 3: (0.08, 0.15)}[count]
    ox, oy = (width - side) / 2, (height - side) / 2  # shapes inside the central square (the runtime crops the rest)
    for _ in range(500):
        radii = [float(rng.uniform(lo, hi)) * side for _ in range(count)]
        centres = [(ox + float(rng.uniform(r + 1, side - r - 1)), oy + float(rng.uniform(r + 1, side - r - 1))) for r in radii]
        if all(np.hypot(a[0] - b[0], a[1] - b[1]) > ra + rb + 2 for i, (a, ra) in enumerate(zip(centres, radii))
               for b, rb in zip(centres[i + 1 :], radii[i + 1 :])):  # fmt: skip
            break
    base = backdrop(rng, width * zoom, height * zoom)
    image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    fill = paint(rng, colour)
    style = int(rng.choice([0, 0, 1, 2]))
    line = max(1, int(round(float(rng.uniform(0.06, 0.2)) * min(radii) * (2.2 if style == 2 else 1) * zoom)))
    edge = _outline(fill, rng)
    turn = float(rng.uniform(-30, 30))
    for (x, y), r in zip(centres, radii):
        stamp(draw, shape, x * zoom, y * zoom, r * zoom, fill, style, line, edge, turn)
    if zoom > 1:
        image = image.resize((width, height), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    if rng.random() < 0.5:
        image.save(out, format="PNG", compress_level=int(rng.integers(1, 9)))
    else:
        image.save(out, format="JPEG", quality=int(rng.integers(70, 92)), subsampling=int(rng.integers(0, 3)))
    return Item(out.getvalue(), picture_caption(rng, colour, shape, count), (colour, shape, str(count)))


# -- clips ------------------------------------------------------------------------------

SIZES = ((48, 48), (64, 48), (80, 64), (96, 96), (128, 96), (64, 64))
# HEVC is left out: libx265 in PyAV 18.1.0's wheel corrupts the heap encoding some of these small clips
CODECS = (("mp4", "mpeg4"), ("webm", "libvpx-vp9"), ("mp4", "libx264"))


def _travel(rng: np.random.Generator, length: float, r: float) -> Callable[[float], float]:
    """Position along the axis at time t ∈ [0, 1]: a quarter and three quarters through the clip
    the shape's centre is inside the frame, at least a fifth of it apart; before and after it
    may leave the frame (entering, leaving) or stand still (a motion that starts late or stops early)."""
    span = float(rng.uniform(0.22, 0.5)) * length  # distance covered between t = 1/4 and t = 3/4
    mid = float(rng.uniform(r + span / 2, length - r - span / 2)) if length - 2 * r > span else length / 2
    mode = int(rng.integers(0, 3))
    if mode == 0:  # constant speed from start to end (may enter or leave)
        return lambda t: mid + span * 2 * (t - 0.5)
    if mode == 1:  # still, then moving, then still
        a, b = float(rng.uniform(0.0, 0.22)), float(rng.uniform(0.78, 1.0))

        def eased(t: float) -> float:
            u = min(max((t - a) / (b - a), 0.0), 1.0)
            u = u * u * (3 - 2 * u)
            ua, ub = ((0.25 - a) / (b - a)), ((0.75 - a) / (b - a))
            sa, sb = ua * ua * (3 - 2 * ua), ub * ub * (3 - 2 * ub)
            return mid + span * ((u - sa) / (sb - sa) - 0.5)

        return eased
    power = float(rng.uniform(1.5, 2.5))  # speeding up (or, mirrored, slowing down)
    slows = rng.random() < 0.5

    def curve(t: float) -> float:
        return float(1 - (1 - t) ** power if slows else t**power)

    low, high = curve(0.25), curve(0.75)
    return lambda t: mid + span * ((curve(t) - low) / (high - low) - 0.5)


def clip(rng: np.random.Generator) -> tuple[Item, dict[str, str]]:
    """A clip, and the four captions of its colour and shape that differ in direction alone."""
    import av
    from PIL import Image, ImageDraw

    colour, shape, direction = str(rng.choice(list(HUES))), str(rng.choice(KINDS)), str(rng.choice(WAYS))
    width, height = SIZES[int(rng.integers(0, len(SIZES)))]
    fps = int(rng.choice([10, 12, 15, 24, 25, 30]))
    seconds = float(rng.uniform(0.8, 2.4))
    count = max(4, int(round(fps * seconds)))
    horizontal = direction in ("left", "right")
    length, across_len = (width, height) if horizontal else (height, width)
    r = float(rng.uniform(0.09, 0.2)) * min(width, height)
    path = _travel(rng, length, r)
    across = float(rng.uniform(r + 1, across_len - r - 1))
    sign = 1.0 if direction in ("right", "down") else -1.0
    zoom = int(rng.choice([1, 2, 3]))
    base = np.clip(backdrop(rng, width * zoom, height * zoom), 0, 255).astype(np.uint8)
    fill = paint(rng, colour)
    style = int(rng.choice([0, 0, 1]))
    edge = _outline(fill, rng)
    line = max(1, int(round(r * 0.15 * zoom)))
    turn = float(rng.uniform(-25, 25))
    frames = []
    for i in range(count):
        t = i / (count - 1)
        along = path(t)
        along = along if sign > 0 else length - along
        x, y = (along, across) if horizontal else (across, along)
        image = Image.fromarray(base, "RGB")
        draw = ImageDraw.Draw(image)
        stamp(draw, shape, x * zoom, y * zoom, r * zoom, fill, style, line, edge, turn)
        if zoom > 1:
            image = image.resize((width, height), Image.Resampling.BOX)
        frames.append(np.asarray(image, np.uint8))
    fmt, codec = CODECS[int(rng.integers(0, len(CODECS)))]
    gop = int(rng.choice([1, 4, 12, 300]))
    out = io.BytesIO()
    with av.open(out, mode="w", format=fmt) as container:
        stream: Any = container.add_stream(codec, rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = gop
        stream.codec_context.thread_count = 1
        if codec == "mpeg4":  # MPEG-4 Part 2 (FFmpeg's own encoder)
            stream.codec_context.bit_rate = int(rng.integers(150_000, 600_000))
        elif codec == "libvpx-vp9":
            stream.options = {"crf": str(int(rng.integers(20, 40))), "b": "0", "deadline": "realtime", "cpu-used": "8"}
        else:
            # cpu-independent: without it x264 encoded about 1 clip in 30 differently from draw to draw
            stream.options = {"crf": str(int(rng.integers(20, 30))), "preset": "fast", "tune": "animation", "x264-params": "cpu-independent=1"}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return Item(out.getvalue(), clip_caption(rng, colour, shape, direction), (colour, shape, direction)), \
        clip_direction_captions(colour, shape, rng)  # fmt: skip


# -- recordings -------------------------------------------------------------------------

RATES = (8000, 11025, 22050, 32000, 44100, 48000)


def _wave(rng: np.random.Generator, phase: np.ndarray, rate: int, top: float) -> np.ndarray:
    """One voice of a timbre from ``phase`` (cycles): square, sawtooth, triangle or additive."""
    kind = int(rng.integers(0, 4))
    fundamental = top  # the highest frequency this voice reaches
    harmonics = max(1, int((rate / 2 - 100) // max(fundamental, 1.0)))
    if kind == 3:  # additive: a few harmonics of random strength, band-limited
        out = np.zeros_like(phase)
        for k in range(1, min(harmonics, 6) + 1):
            out += float(rng.uniform(0.2, 1.0)) / k * np.sin(2 * np.pi * k * phase + float(rng.uniform(0, 6.3)))
        return np.asarray(out / np.max(np.abs(out) + 1e-9), np.float64)
    out = np.zeros_like(phase)
    for k in range(1, min(harmonics, 15) + 1):  # band-limited square / sawtooth / triangle
        if kind == 0 and k % 2 == 1:
            out += np.sin(2 * np.pi * k * phase) / k
        elif kind == 1:
            out += np.sin(2 * np.pi * k * phase) / k * (-1) ** (k + 1)
        elif kind == 2 and k % 2 == 1:
            out += np.sin(2 * np.pi * k * phase) / (k * k) * (-1) ** ((k - 1) // 2)
    return np.asarray(out / np.max(np.abs(out) + 1e-9), np.float64)


def _noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Pink or brown noise (spectrum shaped in the frequency domain)."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.maximum(np.fft.rfftfreq(n), 1.0 / n)
    spectrum = spectrum / (np.sqrt(f) if rng.random() < 0.6 else f)
    x = np.fft.irfft(spectrum, n)
    x = x - x.mean()
    return np.asarray(x / (np.max(np.abs(x)) + 1e-9), np.float64)


def _beat(rng: np.random.Generator, t: np.ndarray, rhythm: str) -> np.ndarray:
    lo, hi = BEATS[rhythm]
    if hi == 0:
        return np.ones_like(t)
    rate = float(rng.uniform(lo, hi))
    phase = (t * rate + float(rng.uniform(0, 1))) % 1.0
    shape = int(rng.integers(0, 3))
    if shape == 0:  # a gate with soft edges
        duty = float(rng.uniform(0.3, 0.6))
        edge = 0.08
        return np.clip(np.minimum(phase / edge, (duty - phase) / edge), 0, 1)
    if shape == 1:  # struck: a fast attack, an exponential decay
        return np.minimum(phase / 0.02, 1.0) * np.exp(-phase / float(rng.uniform(0.12, 0.25)))
    return (0.5 - 0.5 * np.cos(2 * np.pi * phase)) ** 2  # a smooth swell


def _wav(x: np.ndarray, rate: int, eight_bit: bool) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setframerate(rate)
        if eight_bit:
            w.setsampwidth(1)
            w.writeframes(np.clip(np.rint(x * 127 + 128), 0, 255).astype(np.uint8).tobytes())
        else:
            w.setsampwidth(2)
            w.writeframes(np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2").tobytes())
    return out.getvalue()


def _flac(x: np.ndarray, rate: int) -> bytes:
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=rate, layout="mono")
        stream.format = "s16"
        frame = av.AudioFrame.from_ndarray(np.clip(np.rint(x * 32767), -32768, 32767).astype(np.int16)[None, :], format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


CHORDS = ((1.0, 1.2, 1.5), (1.0, 1.122, 1.5), (1.0, 1.335, 1.5), (1.0, 1.26, 1.5, 1.888), (1.0, 1.5, 2.0), (1.0, 1.189, 1.498, 1.782))


def sound(rng: np.random.Generator) -> Item:
    kinds = ["tone"] * 9 + ["chord"] * 9 + ["noise"] * 3 + ["rising", "falling"]
    kind = kinds[int(rng.integers(0, len(kinds)))]
    pitch = str(rng.choice(list(BANDS))) if kind in ("tone", "chord") else ""
    rhythm = str(rng.choice(list(BEATS))) if kind in ("tone", "chord", "noise") else ""
    rate = int(rng.choice(RATES))
    lead = float(rng.uniform(0.0, 0.15))
    body = float(rng.uniform(0.85, 2.6))
    tail = float(rng.uniform(0.0, 0.4))
    n = int(body * rate)
    t = np.arange(n) / rate
    if kind in ("tone", "chord"):
        lo, hi = BANDS[pitch]
        root = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        ratios = (1.0,) if kind == "tone" else CHORDS[int(rng.integers(0, len(CHORDS)))]
        vibrato = 1 + float(rng.uniform(0, 0.006)) * np.sin(2 * np.pi * float(rng.uniform(4, 6)) * t)
        x = sum(_wave(rng, np.cumsum(root * q * vibrato) / rate, rate, root * q) for q in ratios) / len(ratios)
        x = x * _beat(rng, t, rhythm)
    elif kind == "noise":
        x = _noise(rng, n) * _beat(rng, t, rhythm)
    else:
        a, b = float(rng.uniform(180, 380)), float(rng.uniform(1300, 2600))
        lo_f, hi_f = (a, b) if kind == "rising" else (b, a)
        linear = rng.random() < 0.5
        freq = lo_f + (hi_f - lo_f) * t / body if linear else lo_f * (hi_f / lo_f) ** (t / body)
        x = _wave(rng, np.cumsum(freq) / rate, rate, max(lo_f, hi_f))
    fade = min(n // 4, int(0.01 * rate))
    x[:fade] *= np.linspace(0, 1, fade)
    x[n - fade :] *= np.linspace(1, 0, fade)
    peak = 10 ** (float(rng.uniform(-30, -1)) / 20)
    x = x / (np.max(np.abs(x)) + 1e-9) * peak
    whole = np.concatenate([np.zeros(int(lead * rate)), x, np.zeros(int(tail * rate))])
    if rng.random() < 0.3:  # a faint room: pink noise 30-45 dB under the sound
        whole = whole + _noise(rng, len(whole)) * peak * 10 ** (float(rng.uniform(-45, -30)) / 20)
    how = int(rng.integers(0, 3))
    data = _flac(whole, rate) if how == 0 else _wav(whole, rate, eight_bit=how == 2 and peak > 0.1)
    return Item(data, sound_caption(rng, kind, pitch, rhythm), (kind, pitch, rhythm))


# -- questions --------------------------------------------------------------------------

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

    from .evaluate import Evaluation, check_verbs, group

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
