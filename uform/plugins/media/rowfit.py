""":func:`uform.plugins.media.frames.fit` made from a picture's rows, given in order a strip at
a time, holding neither the picture nor either pass's whole result.

Pillow's resize is two passes, each rounded to 8 bits: across (each row alone) and down
(each column alone), in the order :func:`uform.plugins.media.image.vertical_first` says.
The pass across runs here through Pillow on each strip, with the whole resize's box, so it
is Pillow's own. The pass down is :func:`down_weights` and :class:`Down`: Pillow's filter
weights (``precompute_coeffs`` and ``normalize_coeffs_8bpc`` in its ``Resample.c``: the
same float64 operations in the same order, the box taken as float32 as Pillow takes it) and
its fixed-point sum, ``clip8((2²¹ + Σ kᵢ·pᵢ) >> 22)``, made in float64, where every partial
sum is an integer below 2⁵³ and so exact. Only the output rows the crop keeps are made, each
from its window of rows (``2 × support × scale + 1`` rows), so what is held is a strip, the
rows the pending output rows still read, and the ``S × S`` result (a NaFlex tower's: its grid's,
the whole picture resized, nothing cropped).
``tests/test_image_streaming.py`` checks it against Pillow's whole resize, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from . import frames

SUPPORT = {"bicubic": 2.0, "bilinear": 1.0}  # Pillow's filters' half-widths
PRECISION_BITS = 22  # Pillow's fixed point for 8-bit resampling: 32 - 8 - 2
CHUNK_VALUES = 1 << 15  # float64 values of a window converted at a time (256 KiB)


def _filter(kind: str, x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    if kind == "bilinear":
        return np.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5
    inner = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    outer = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, inner, np.where(x < 2.0, outer, 0.0))


def down_weights(in_size: int, in0: float, in1: float, out_size: int, kind: str, first: int, last: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pillow's weights of output rows ``first:last`` of a resize of ``in_size`` rows, box
    ``in0:in1``, to ``out_size``: the first input row of each, how many it reads, and the
    fixed-point weights ``[rows, ksize]`` (int64; zeros past each row's count)."""
    lo, hi = np.float32(in0), np.float32(in1)
    scale = float(np.float32(hi - lo)) / out_size  # Pillow subtracts in float32, then divides in float64
    filterscale = max(scale, 1.0)
    support = SUPPORT[kind] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = float(lo) + (np.arange(first, last, dtype=np.float64) + 0.5) * scale
    ss = 1.0 / filterscale
    start = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C's (int): toward zero
    count = np.minimum((center + support + 0.5).astype(np.int64), in_size) - start
    weights = np.zeros((len(center), ksize))
    total = np.zeros(len(center))
    for x in range(ksize):  # summed in Pillow's order, tap by tap
        w = np.where(x < count, _filter(kind, ((x + start).astype(np.float64) - center + 0.5) * ss), 0.0)
        weights[:, x] = w
        total = total + w
    nonzero = total != 0.0
    weights = np.where(nonzero[:, None], weights / np.where(nonzero, total, 1.0)[:, None], weights)
    unit = float(1 << PRECISION_BITS)
    fixed = np.where(weights < 0, -0.5 + weights * unit, 0.5 + weights * unit).astype(np.int64)
    return start, count, fixed


class Down:
    """Pillow's pass down, output rows ``first:last`` of ``out_size``, made as the input rows
    arrive in order (:meth:`feed`); ``rows`` is the input rows they read."""

    def __init__(self, in_size: int, in0: float, in1: float, out_size: int, kind: str, first: int, last: int) -> None:
        self.start, self.count, fixed = down_weights(in_size, in0, in1, out_size, kind, first, last)
        self.weights = fixed.astype(np.float64)  # integers below 2**23: exact
        del fixed
        self.rows = (int(self.start.min()), int((self.start + self.count).max()))
        self.band: np.ndarray | None = None  # input rows from self.base on
        self.base = self.rows[0]
        self.done = 0  # output rows made

    def feed(self, y: int, rows: np.ndarray) -> np.ndarray:
        """Input rows ``y:y + len(rows)`` (``[n, width, 3]`` uint8; the next ones of ``self.rows``
        in order); answers the output rows they complete (``[m, width, 3]``, maybe none)."""
        band = rows if self.band is None else np.concatenate([self.band, rows])
        if self.band is None:
            self.base = y
        end = self.base + len(band)
        made = []
        while self.done < len(self.start) and self.start[self.done] + self.count[self.done] <= end:
            j = self.done
            a = int(self.start[j]) - self.base
            made.append(self._row(band[a : a + int(self.count[j])], self.weights[j, : int(self.count[j])]))
            self.done += 1
        keep = int(self.start[self.done]) - self.base if self.done < len(self.start) else len(band)
        self.band, self.base = np.array(band[keep:]), self.base + keep  # a copy: the caller may reuse its buffer
        return np.stack(made) if made else np.empty((0, *rows.shape[1:]), np.uint8)

    @staticmethod
    def _row(window: np.ndarray, weights: np.ndarray) -> np.ndarray:
        flat = window.reshape(len(window), -1)
        out = np.empty(flat.shape[1], np.uint8)
        step = max(64, CHUNK_VALUES // len(window))
        for c in range(0, flat.shape[1], step):
            total = weights @ flat[:, c : c + step].astype(np.float64) + float(1 << (PRECISION_BITS - 1))
            out[c : c + step] = np.clip(np.floor(total / float(1 << PRECISION_BITS)), 0, 255)
        return out.reshape(window.shape[1:])


class RowFit:
    """``frames.fit`` of a ``width × height`` 8-bit RGB picture whose rows ``self.rows`` are
    given in order (:meth:`feed`, rows outside them are not needed); :meth:`result` answers
    the ``uint8 [S, S, 3]`` ``frames.fit`` answers for the whole picture, bit for bit
    (version 2's square resize, bilinear filter and rounding down too, and the region rule
    past ``FULL_RESIZE_AREA``); for a NaFlex tower the ``uint8 [gh·P, gw·P, 3]`` of the
    picture's grid (:func:`uform.plugins.media.naflex.fit_image`: a whole resize, no crop)."""

    def __init__(self, width: int, height: int, size: int, channels: int = 3) -> None:
        from PIL import Image

        how = size if isinstance(size, frames.Fit) else frames.Fit(size)
        s = self.size = int(size)
        self.kind = "bilinear" if how.interpolation == "bilinear" else "bicubic"
        self.resample = Image.Resampling.BILINEAR if self.kind == "bilinear" else Image.Resampling.BICUBIC
        if how.resize == "naflex":  # the whole picture resized to its grid, nothing cropped
            from .naflex import grid_for

            gh, gw = grid_for(height, width, how.patch, how.max_patches)
            tw, th = gw * how.patch, gh * how.patch
        else:
            tw, th = (s, s) if how.resize == "square" else frames.resized_size(width, height, s, how.rounding)
        self.shape = (th, tw) if how.resize == "naflex" else (s, s)  # the result's rows and columns
        # across: (out columns, x0, x1); down: (input rows, y0, y1, output rows, the picture's row of input row 0);
        # keep: the output rows the crop keeps; left: the first column it keeps
        if how.resize not in ("square", "naflex") and tw * th > frames.FULL_RESIZE_AREA * s * s:  # frames.fit_region's two calls
            x0, x1, y0, y1, r0, r1 = frames.region(width, height, s, (tw, th), how.crop)
            across = (s, x0, x1)
            down = (r1 - r0, y0 - r0, y1 - r0, s, r0)
            self.down_first, keep, self.left = False, (0, s), 0
        else:
            across = (tw, 0.0, float(width))
            down = (height, 0.0, float(height), th, 0)
            self.down_first = tw != width and th != height and vertical_first(width, height, (tw, th))
            top, self.left = frames.crop_offset(th - self.shape[0], how.crop), frames.crop_offset(tw - self.shape[1], how.crop)
            keep = (top, top + self.shape[0])
        self.across = None if _identity(width, *across) else across
        rows, lo, hi, out, origin = down
        self.down: Down | None = None
        if _identity(rows, out, lo, hi):  # no pass down: output row j is input row j
            self.rows = (origin + keep[0], origin + keep[1])
        else:
            self.down = Down(rows, lo, hi, out, self.kind, *keep)
            self.rows = (origin + self.down.rows[0], origin + self.down.rows[1])
        self.origin = origin
        self.out = np.empty((*self.shape, channels), np.uint8)  # 4: premultiplied RGBa, resized as Pillow resizes RGBA
        self.made = 0

    def feed(self, y: int, rows: np.ndarray) -> None:
        """Rows ``y:y + len(rows)`` of the picture (``uint8 [n, width, 3]``), the next of ``self.rows``."""
        if self.down is None:
            self._put(self._across(rows))
        elif self.down_first:
            self._put(self._across(self.down.feed(y - self.origin, rows)))
        else:
            self._put(self.down.feed(y - self.origin, self._across(rows)))

    def result(self) -> np.ndarray:
        """The fitted ``uint8 [S, S, 3]`` (a NaFlex grid's ``[gh·P, gw·P, 3]``); ValueError if rows are missing."""
        if self.made != self.shape[0]:
            raise ValueError(f"the fit made {self.made} of {self.shape[0]} rows: rows {self.rows[0]}:{self.rows[1]} were not all given")
        return self.out

    def _across(self, rows: np.ndarray) -> np.ndarray:
        if self.across is None or not len(rows):
            return rows
        from PIL import Image

        out, x0, x1 = self.across
        n, w = rows.shape[:2]
        if rows.shape[2] == 4:
            picture = Image.frombuffer("RGBa", (w, n), np.ascontiguousarray(rows).tobytes(), "raw", "RGBa", 0, 1)
        else:
            picture = Image.fromarray(np.ascontiguousarray(rows), "RGB")
        return np.asarray(picture.resize((out, n), self.resample, box=(x0, 0, x1, n)))

    def _put(self, rows: np.ndarray) -> None:
        n = min(len(rows), self.shape[0] - self.made)
        if n > 0:
            self.out[self.made : self.made + n] = rows[:n, self.left : self.left + self.shape[1]]
            self.made += n


def vertical_first(width: int, height: int, target: tuple[int, int]) -> bool:
    """Whether Pillow's resize of ``width × height`` to ``target`` (both axes resized) makes its
    vertical pass first: when it shrinks the height by more than twice what it takes off the
    width, ``h − h' > 2 (w − w')`` (Pillow 13's choice, read from its results: exact on 1,500
    random shapes with both filters; ``tests/test_image_memory.py`` checks it)."""
    tw, th = target
    return th < height and height - th > 2 * (width - tw)


def _identity(size: int, out: int, lo: float, hi: float) -> bool:
    """Whether Pillow's resize of ``size`` to ``out`` over the box ``lo:hi`` skips the pass
    (``need_horizontal`` / ``need_vertical`` in its ``Resample.c``: the box in float32)."""
    return out == size and float(np.float32(lo)) == 0.0 and float(np.float32(hi)) == out
