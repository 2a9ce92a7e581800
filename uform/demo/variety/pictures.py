"""Varied pictures: backgrounds from black to white, tinted, two-tone gradients or noise; the
colour shifted in hue, saturation and value; filled shapes, outlined shapes or outlines alone,
rotated by any angle, drawn aliased or 2x supersampled; non-square frames. The clips draw
their frames with the same helpers (:mod:`.clips`)."""

from __future__ import annotations

import colorsys

import numpy as np

from .. import generate as g
from .captions import Meaning


def shade_of(rng: np.random.Generator, colour: str) -> tuple[int, int, int]:
    """The named colour moved in hue (±10°), saturation and value."""
    r, gr, b = (c / 255 for c in g.COLOURS[colour])
    h, s, v = colorsys.rgb_to_hsv(r, gr, b)
    h = (h + float(rng.uniform(-8, 8)) / 360) % 1.0
    s = float(np.clip(s * rng.uniform(0.75, 1.1), 0.45, 1.0))
    v = float(np.clip(v * rng.uniform(0.8, 1.12), 0.5, 1.0))
    out = colorsys.hsv_to_rgb(h, s, v)
    return (int(out[0] * 255), int(out[1] * 255), int(out[2] * 255))


def ground_pixels(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
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


def outline_of(fill: tuple[int, int, int], rng: np.random.Generator) -> tuple[int, int, int]:
    k = float(rng.uniform(0.4, 0.8)) if rng.random() < 0.7 else float(rng.uniform(1.1, 1.4))
    r, gr, b = (int(min(255, c * k)) for c in fill)
    return (r, gr, b)


def draw_shape(draw: object, shape: str, cx: float, cy: float, r: float, fill: tuple[int, int, int] | None,
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
    image = Image.fromarray(ground_pixels(rng, w * scale, h * scale), "RGB")
    draw = ImageDraw.Draw(image)
    fill = shade_of(rng, colour)
    style = int(rng.choice([0, 1, 2], p=[0.7, 0.2, 0.1]))  # filled, filled with an outline, a thick outline alone
    width = max(1, int(round(min(radii) * scale * float(rng.uniform(0.25, 0.4) if style == 2 else rng.uniform(0.05, 0.15)))))
    edge = fill if style == 2 else outline_of(fill, rng)
    angle = float(rng.uniform(-35, 35))
    for (x, y), r in zip(centres, radii):
        draw_shape(draw, shape, x * scale, y * scale, r * scale, None if style == 2 else fill, edge if style else None, width, angle)
    if scale > 1:
        image = image.resize((w, h), Image.Resampling.BILINEAR, reducing_gap=None)
    pixels = np.asarray(image, np.uint8).copy()
    return pixels, Meaning("image", g.image_caption(colour, shape, count), (colour, shape, str(count)))
