"""The foreign suite's pictures and clips: Pillow primitives (supersampled or not; filled,
outlined or rings; rotated) on backgrounds of its own, and clips of its own motion, sizes, frame
rates and codecs, each written to file bytes."""

from __future__ import annotations

import colorsys
import io
from collections.abc import Callable
from typing import Any

import numpy as np

from .meanings import HUES, KINDS, WAYS, Item, clip_caption, clip_direction_captions, picture_caption

__all__ = ["CODECS", "SIZES", "backdrop", "clip", "paint", "picture", "stamp"]


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
