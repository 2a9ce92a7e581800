"""Generated pictures and clips: shapes of a colour drawn with Pillow (no anti-aliasing, so a seed
gives the same pixels on every machine), each drawn from the :class:`numpy.random.Generator`
given alone."""

from __future__ import annotations

import numpy as np

from .spaces import COLOURS, DIRECTIONS, SHAPES, VIDEO_FRAMES, Clip, Picture, image_caption, video_caption

__all__ = ["TRAIL", "clip", "picture"]

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

