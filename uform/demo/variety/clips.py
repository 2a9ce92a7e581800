"""Varied clips: no trail; sizes 32-96 pixels, 5-30 fps, 0.5-3 s; constant, easing,
late-starting or early-stopping motion, shapes entering or leaving the frame; a quarter of the
clips move a little across the direction. Frames are drawn as the pictures are (:mod:`.pictures`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import generate as g
from .captions import Meaning
from .pictures import ground_pixels, outline_of, shade_of, draw_shape

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
    ground = ground_pixels(rng, w, h)
    fill = shade_of(rng, colour)
    style = int(rng.choice([0, 1, 2], p=[0.7, 0.2, 0.1]))
    line = max(1, int(round(r * float(rng.uniform(0.1, 0.2) if style == 1 else rng.uniform(0.3, 0.45)))))
    edge = fill if style == 2 else outline_of(fill, rng)
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
        draw_shape(draw, shape, x, y, r, None if style == 2 else fill, edge if style else None, line, angle)
        f = np.asarray(image, np.uint8)
        if noise:
            f = np.clip(f + rng.normal(0, noise, f.shape), 0, 255).astype(np.uint8)
        frames[i] = f
    return VariedClip(frames, fps, Meaning("video", g.video_caption(colour, shape, direction), (colour, shape, direction)))
