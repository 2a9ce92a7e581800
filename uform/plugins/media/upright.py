"""A decoded picture made upright 8-bit RGB: its EXIF orientation read and applied (whole or a box
at a time), its mode converted as docs/checkpoint.md and docs/media-images.md state.

:mod:`uform.plugins.media.image` turns and converts a decoded picture through these, a strip
of rows at a time where it must; :mod:`uform.plugins.media.png` makes the same RGB of its rows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import frames

if TYPE_CHECKING:
    from PIL import Image

PNG_DEPTH = "uform.png_bit_depth"  # image.info key: the bit depth the PNG header states
AS_STORED = ("1", "P")  # modes Pillow resizes to the nearest pixel: under alpha "drop" fitted whole (fit_as_stored)
WEIGHTED = ("LA", "RGBA")  # modes Pillow resizes weighted by alpha: under "drop" fitted premultiplied a strip at a time
_ORIENTATION = 0x0112


def to_rgb(image: Image.Image, alpha: str = "white") -> Image.Image:
    """8-bit RGB: 16-bit samples cut to their high byte, alpha composited over white, palette,
    grayscale and CMYK converted (CMYK: ``round((255 − c)(255 − k) / 255)``, Pillow's rule).

    ``alpha="drop"`` (a tower's ``alpha: drop``, open_clip's transform) is Pillow's
    ``convert("RGB")``: an alpha channel dropped, a palette's colours and transparent values
    kept as stored; 16-bit grayscale still gives its high byte (Pillow's conversion clips it).

    A PNG's transparent value (tRNS) is alpha 0 where a pixel equals it, so it becomes white
    (``c' = (c·0 + 255·255 + 127) // 255 = 255``), alpha 255 elsewhere: for grayscale at any
    depth it is matched against the stored sample (Pillow scales 2- and 4-bit samples to 8
    bits but not the value, and drops it for 16-bit grayscale, so uform matches itself), for
    8-bit truecolour against ``(r, g, b)``; for 16-bit truecolour Pillow keeps only the high
    bytes, so the colour's high bytes are matched against them.
    """
    mode, depth = image.mode, image.info.get(PNG_DEPTH, 8)
    key = image.info.get("transparency") if alpha == "white" else None
    if alpha != "white" and not mode.startswith("I"):
        if "transparency" in image.info:  # Pillow would warn of a palette's bytes, then drop them as here
            image = image.copy()
            del image.info["transparency"]
        return image if mode == "RGB" else image.convert("RGB")
    if mode.startswith("I"):  # 16-bit (I;16*) or 32-bit integer grayscale
        wide = np.asarray(image).astype(np.int64)
        gray = (np.clip(wide, 0, 65535) >> 8).astype(np.uint8)
        rgb = np.repeat(gray[..., None], 3, axis=2)
        if isinstance(key, int):
            rgb[wide == key] = 255
        return frames.from_array(rgb)
    if mode == "L" and isinstance(key, int) and depth < 8:
        stored = np.asarray(image)
        rgb = np.repeat(stored[..., None], 3, axis=2)
        rgb[stored == key * 255 // ((1 << depth) - 1)] = 255  # the 1-, 2- or 4-bit value as Pillow scales samples
        return frames.from_array(rgb)
    if mode == "RGB" and isinstance(key, tuple) and len(key) == 3:
        rgb = np.array(image)
        colour = np.asarray(key, np.int64) >> (8 if depth == 16 else 0)
        rgb[(rgb == colour).all(axis=2)] = 255
        return frames.from_array(rgb)
    if mode == "RGB":
        return image
    if "A" in mode or "a" in mode or "transparency" in image.info:
        rgba = np.asarray(image.convert("RGBA"))
        a = rgba[..., 3:].astype(np.uint16)  # c·a + 255·(255 − a) + 127 ≤ 65152: 16 bits hold it
        rgb = rgba[..., :3].astype(np.uint16)
        rgb *= a
        rgb += 255 * (255 - a) + 127
        np.floor_divide(rgb, np.uint16(255), out=rgb)
        return frames.from_array(rgb.astype(np.uint8))
    return image.convert("RGB")


def fit_as_stored(image: Image.Image, method: Image.Transpose | None, size: int) -> np.ndarray:
    """A tower's ``alpha: drop`` (open_clip's transform) for a palette or 1-bit picture
    (``AS_STORED``): turned, fitted in its own mode (``frames.fit_image``: Pillow resizes it to
    the nearest pixel), then ``convert("RGB")``, any tRNS dropped. Turned and resized whole, as
    open_clip does (a byte a pixel); RGBA and LA go a strip at a time (:func:`premultiplied`)."""
    fitted = frames.fit_image(image if method is None else image.transpose(method), size)
    if "transparency" in fitted.info:  # Pillow would warn of a palette's bytes, then drop them as here
        del fitted.info["transparency"]
    return np.asarray(fitted if fitted.mode == "RGB" else fitted.convert("RGB"))


def premultiplied(image: Image.Image) -> np.ndarray:
    """An RGBA or LA picture (a strip) as ``uint8 [h, w, 4]`` premultiplied RGBa, as Pillow's
    resize of RGBA and LA makes it first (gray repeated: LA resizes as that RGBA does)."""
    rgba = image if image.mode == "RGBA" else image.convert("RGBA")
    return np.asarray(rgba.convert("RGBa"))


def unpremultiplied_rgb(fitted: np.ndarray) -> np.ndarray:
    """A fitted premultiplied ``[S, S, 4]`` as Pillow's resize answers it (back to RGBA), then
    ``convert("RGB")``: the alpha dropped."""
    from PIL import Image

    h, w = fitted.shape[:2]
    picture = Image.frombuffer("RGBa", (w, h), np.ascontiguousarray(fitted).tobytes(), "raw", "RGBa", 0, 1)
    return np.asarray(picture.convert("RGBA").convert("RGB"))


def orientation(image: Image.Image) -> Image.Transpose | None:
    """The turn that makes the picture upright as its EXIF orientation (2-8) says; None for 1,
    a missing or an unreadable tag."""
    from PIL import Image

    try:
        value = image.getexif().get(_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - broken EXIF: show the pixels as stored
        return None
    return {
        2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_90,
    }.get(value)  # fmt: skip


def orient(image: Image.Image) -> Image.Image:
    """The picture turned upright as its EXIF orientation (1-8) says; an unreadable tag is ignored."""
    method = orientation(image)
    return image if method is None else image.transpose(method)


def _swaps() -> tuple[Image.Transpose, ...]:
    from PIL import Image

    return (Image.Transpose.TRANSPOSE, Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_270, Image.Transpose.TRANSVERSE)


def upright_size(image: Image.Image, method: Image.Transpose | None) -> tuple[int, int]:
    """``(width, height)`` of the picture once turned by ``method``."""
    return image.size[::-1] if method in _swaps() else image.size


def upright_box(image: Image.Image, method: Image.Transpose | None, box: tuple[int, int, int, int]) -> Image.Image:
    """The ``(x0, y0, x1, y1)`` box of the picture turned by ``method``, cut from the stored
    picture (the box it came from) and turned alone."""
    from PIL import Image

    T = Image.Transpose
    w, h = image.size
    x0, y0, x1, y1 = box
    stored = {
        None: box, T.FLIP_LEFT_RIGHT: (w - x1, y0, w - x0, y1), T.FLIP_TOP_BOTTOM: (x0, h - y1, x1, h - y0),
        T.ROTATE_180: (w - x1, h - y1, w - x0, h - y0), T.TRANSPOSE: (y0, x0, y1, x1),
        T.ROTATE_90: (w - y1, x0, w - y0, x1), T.ROTATE_270: (y0, h - x1, y1, h - x0),
        T.TRANSVERSE: (w - y1, h - x1, w - y0, h - x0),
    }[method]  # fmt: skip
    part = image.crop(stored)
    return part if method is None else part.transpose(method)


def displayed(rgb: np.ndarray, matrix: bytes | None) -> np.ndarray:
    """A decoded video frame as its display matrix says to show it, as FFmpeg's autorotation does.

    ``matrix`` is the frame's ``DISPLAYMATRIX`` side data (nine native int32, row-major
    ``[a b u; c d v; x y w]``). Its angle ``θ`` is fftools' ``get_rotation``: ``atan2(b, a)``
    in degrees (``−av_display_rotation_get``) rounded, taken to 0 … 360. Within a degree of 90:
    turned clockwise, or transposed where ``c > 0`` (mirrored); of 270: counterclockwise, or
    anti-transposed where ``c < 0``; of 180: mirrored where ``a < 0``, flipped where ``d < 0``
    (both: turned half way); of 0: flipped where ``d < 0``. Any other angle turns by the nearest
    quarter (FFmpeg rotates by the exact angle, into a larger frame); a singular matrix does nothing.
    """
    if matrix is None or len(matrix) < 36:
        return rgb
    a, b, _, c, d = (int(v) for v in np.frombuffer(matrix[:20], "=i4"))
    if math.hypot(a, c) == 0 or math.hypot(b, d) == 0:
        return rgb
    theta = round(math.degrees(math.atan2(b / math.hypot(b, d), a / math.hypot(a, c))))
    theta -= 360 * math.floor(theta / 360 + 0.9 / 360)
    if abs(theta - 90) < 1:
        return rgb.transpose(1, 0, 2) if c > 0 else np.rot90(rgb, -1)
    if abs(theta - 270) < 1:
        return np.rot90(rgb, 2).transpose(1, 0, 2) if c < 0 else np.rot90(rgb, 1)
    if abs(theta - 180) < 1:
        return rgb[:: -1 if d < 0 else 1, :: -1 if a < 0 else 1]
    if abs(theta) < 1:
        return rgb[::-1] if d < 0 else rgb
    return np.rot90(rgb, round(-theta / 90) % 4)


def display_matrix(frame: Any) -> bytes | None:
    """A decoded PyAV frame's ``DISPLAYMATRIX`` side data, None when it has none."""
    for kind, data in frame.side_data.items():
        if getattr(kind, "name", str(kind)) == "DISPLAYMATRIX":
            return bytes(data)
    return None
