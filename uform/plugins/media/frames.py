"""What the image and video plugins share: pixel geometry, preprocessing, inputs, patch tokens.

Preprocessing (docs/checkpoint.md, "Image tower"): an 8-bit RGB picture is resized with
Pillow's bicubic filter so that its shorter side is ``S`` (the longer side rounded half up),
then its central ``S x S`` square is cut out. Both image verbs and every video frame go
through :func:`fit`, so equal RGB pixels always give equal tower inputs, byte for byte.
Past ``FULL_RESIZE_AREA`` (aspect ratios over about 16:1) only the region that maps onto
the central square is resampled (:func:`fit_region`), so the work is bounded by the output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from uform.core.config import Geometry, choice, integer, numbers
from uform.core.errors import CheckpointError
from uform.core.graph import GraphBuilder

if TYPE_CHECKING:
    from PIL import Image

MAX_IMAGE_SIZE = 4096  # bound on a tower's S, so a hostile config cannot ask for absurd inputs
FULL_RESIZE_AREA = 16  # resized pictures up to this many S² are resized whole, then cropped (see fit)
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
RESIZES = ("shorter_side_crop", "square", "naflex")  # naflex: SigLIP 2's grid of its aspect ratio (media/naflex.py)
MAX_PATCHES = 65536  # bound on a NaFlex tower's max_patches
INTERPOLATIONS = ("bicubic", "bilinear")
ROUNDINGS = ("half_up", "floor")
CROPS = ("floor", "half_even")  # the centre crop's offset: (T − S) // 2, or torchvision's int(round((T − S) / 2))
ALPHAS = ("white", "drop")  # transparency over white, or open_clip's order (resized in the picture's mode, then alpha dropped)
REMAINDERS = ("exact", "drop")  # S a multiple of P, or the last S % P rows and columns left out (a stride-P convolution's)


class Fit(int):
    """A tower's side ``S`` (an ``int``, as the decoders take it) that also says how a picture
    is fitted to ``S x S`` (version 2's ``resize``, ``interpolation`` and ``resize_rounding``;
    the defaults are version 1's): :func:`fit` reads them. ``alpha`` (version 2) says what the
    decoders make of transparency: ``white`` composites it over white before the fit, ``drop``
    fits the picture in its own mode and then takes Pillow's ``convert("RGB")``, which keeps the
    colour under the alpha (open_clip's transform; ``upright.fit_as_stored``)."""

    resize: str
    interpolation: str
    rounding: str
    alpha: str
    crop: str
    patch: int  # resize "naflex": P and the most patches a picture's grid holds
    max_patches: int

    def __new__(
        cls, size: int, resize: str = "shorter_side_crop", interpolation: str = "bicubic", rounding: str = "half_up",
        alpha: str = "white", crop: str = "floor", patch: int = 0, max_patches: int = 0,
    ) -> Fit:  # fmt: skip
        out = super().__new__(cls, size)
        out.resize, out.interpolation, out.rounding, out.alpha, out.crop = resize, interpolation, rounding, alpha, crop
        out.patch, out.max_patches = patch, max_patches
        return out


def crop_offset(extra: int, crop: str = "floor") -> int:
    """Where the centre crop starts in a side ``extra`` pixels longer than ``S``: ``extra // 2``,
    or torchvision's ``CenterCrop`` (``crop="half_even"``: ``int(round(extra / 2.0))``, Python's
    rounding, so 1.5 → 2 and 2.5 → 2)."""
    return int(round(extra / 2.0)) if crop == "half_even" else extra // 2


def alpha_rule(size: int) -> str:
    """The alpha rule of a tower's side (``white`` for a plain ``int``, version 1's)."""
    return size.alpha if isinstance(size, Fit) else "white"


@dataclass(frozen=True)
class Pixels:
    """A tower's pixel geometry: ``S``, ``P`` and the per-channel normalisation."""

    image_size: int
    patch_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: str = "shorter_side_crop"
    interpolation: str = "bicubic"
    rounding: str = "half_up"
    alpha: str = "white"
    crop: str = "floor"
    remainder: str = "exact"
    max_patches: int = 0  # resize "naflex": the most patches a picture's grid holds

    @property
    def fit(self) -> Fit:
        """``S`` with the way pictures are fitted to it, for :func:`fit` and the decoders."""
        return Fit(self.image_size, self.resize, self.interpolation, self.rounding, self.alpha, self.crop, self.patch_size, self.max_patches)

    @property
    def grid(self) -> int:
        """``G``: patches per side (``S // P``: with ``patch_remainder: drop`` the last ``S % P``
        rows and columns are in no patch)."""
        return self.image_size // self.patch_size

    @classmethod
    def read(cls, cfg: Mapping[str, Any], where: str) -> Pixels:
        size = integer(cfg, "image_size", where, 1, MAX_IMAGE_SIZE)
        patch = integer(cfg, "patch_size", where, 1, size)
        remainder = choice(cfg, "patch_remainder", where, REMAINDERS, REMAINDERS[0])
        if size % patch and remainder == "exact":
            raise CheckpointError(
                f"config field {where}.patch_size: {patch} does not divide image_size {size} "
                f"(patch_remainder 'drop' leaves the last {size % patch} rows and columns out)"
            )
        mean = numbers(cfg, "mean", where, 3, -1000.0, 1000.0)
        std = numbers(cfg, "std", where, 3, 1e-6, 1000.0)
        resize = choice(cfg, "resize", where, RESIZES, RESIZES[0])
        interpolation = choice(cfg, "interpolation", where, INTERPOLATIONS, INTERPOLATIONS[0])
        rounding = choice(cfg, "resize_rounding", where, ROUNDINGS, ROUNDINGS[0])
        alpha, crop = choice(cfg, "alpha", where, ALPHAS, ALPHAS[0]), choice(cfg, "crop_rounding", where, CROPS, CROPS[0])
        most = integer(cfg, "max_patches", where, 1, MAX_PATCHES) if resize == "naflex" or "max_patches" in cfg else 0
        if "max_patches" in cfg and resize != "naflex":
            raise CheckpointError(f"config field {where}.max_patches: only a tower with resize 'naflex' has it (this one's is {resize!r})")
        if resize == "naflex" and (alpha != "white" or size % patch):
            raise CheckpointError(f"config field {where}.resize: 'naflex' takes alpha 'white' and an image_size (the position grid's, G0·P) that patch_size divides")
        return cls(size, patch, mean, std, resize, interpolation, rounding, alpha, crop, remainder, most)


# Pixels.read's fields
PIXELS_FIELDS = frozenset(
    {"image_size", "patch_size", "mean", "std", "resize", "interpolation", "resize_rounding", "alpha", "crop_rounding", "patch_remainder", "max_patches"}
)


def read_geometry(cfg: Mapping[str, Any], where: str) -> tuple[Geometry, Pixels]:
    return Geometry.read(cfg, where), Pixels.read(cfg, where)


def patch_tokens(b: GraphBuilder, pixels: str, prefix: str, px: Pixels, width: int) -> str:
    """``uint8 [N, S, S, 3]`` → ``[N, G², W]``: cut into patches flattened in (channel, row,
    column) order, normalised, each through ``prefix.patch`` (one Gemm).

    The patches are cut from the bytes, before the cast, in two transposes: rows of patches
    apart (runs of ``3p`` bytes), then each patch's channels apart. The normalisation after them,
    element by element with each channel's mean and std repeated over its ``p²`` places, gives
    the same bits as before them. (32 pictures of 224², patches of 16, Zen 5, two threads: one
    transpose of float32 and the normalisation before it, 29-32 ms; these, 6 ms.)

    With ``patch_remainder: drop`` the picture's first ``G·P`` rows and columns are cut into
    patches and the rest left out, as a stride-``P`` convolution without padding does
    (SigLIP so400m-patch14-384: 27 patches of 14 over 378 of the 384 pixels)."""
    p, g = px.patch_size, px.grid
    if g * p != px.image_size:
        pixels = b.op("Slice", pixels, b.ints([0, 0]), b.ints([g * p, g * p]), b.ints([1, 2]))
    x = b.op("Reshape", pixels, b.ints([-1, p, g, 3 * p]))  # [N gy, py, gx, (px, c)]
    x = b.op("Transpose", x, perm=[0, 2, 1, 3])  # [N gy, gx, py, (px, c)]
    x = b.op("Transpose", b.op("Reshape", x, b.ints([-1, p * p, 3])), perm=[0, 2, 1])  # [N G², c, (py, px)]
    x = b.op("Cast", b.op("Reshape", x, b.ints([-1, 3 * p * p])), to=b.float_type)
    x = b.op("Div", x, b.scalar(255.0))
    x = b.op("Sub", x, b.const(np.repeat(np.asarray(px.mean, np.float32), p * p), "mean"))
    x = b.op("Div", x, b.const(np.repeat(np.asarray(px.std, np.float32), p * p), "std"))
    x = b.linear(x, f"{prefix}.patch")
    return b.op("Reshape", x, b.ints([-1, g * g, width]))  # type: ignore[no-any-return]


def pixels_input(b: GraphBuilder, name: str, dims: list[int | str]) -> str:
    return b.input(name, TensorProto.UINT8, dims)


# -- preprocessing ---------------------------------------------------------------------


def resized_size(width: int, height: int, size: int, rounding: str = "half_up") -> tuple[int, int]:
    """The size after the resize: shorter side ``size``, longer side ``round_half_up(side * size / shorter)``
    (``rounding="floor"``: ``int(size * side / shorter)`` in float64, as transformers and torchvision compute it)."""
    if rounding == "floor":
        if width <= height:
            return size, max(1, int(size * height / width))
        return max(1, int(size * width / height)), size
    if width <= height:
        return size, max(1, (2 * height * size + width) // (2 * width))
    return max(1, (2 * width * size + height) // (2 * height)), size


def fit(image: Image.Image, size: int) -> np.ndarray:
    """An RGB picture as the tower's ``uint8 [size, size, 3]``: bicubic resize, central crop
    (version 2: ``size`` a :class:`Fit` may say ``square``, a resize to ``size x size``, a
    bilinear filter, and the longer side rounded down).

    The work is bounded by the output: when the resized picture would exceed
    ``FULL_RESIZE_AREA × size²`` pixels (an aspect ratio over about 16:1), only the source
    region that maps onto the central square is resampled (:func:`fit_region`), instead of
    resizing a 1×1,000,000 strip to 32×32,000,000 and cropping 32×32 out of it.
    """
    return np.ascontiguousarray(fit_image(image, size))


def fit_image(image: Image.Image, size: int) -> Image.Image:
    """:func:`fit` as a picture, in the picture's own mode (Pillow's resize rules for it:
    an alpha channel weighted, a palette or 1-bit picture resized to the nearest pixel)."""
    from PIL import Image

    how = size if isinstance(size, Fit) else Fit(size)
    size = int(size)
    if how.resize == "naflex":  # to the grid its aspect ratio gives, no crop
        from .naflex import fit_image as to_grid

        return to_grid(image, how.patch, how.max_patches, how.interpolation == "bicubic")
    bilinear = how.interpolation == "bilinear"
    resample = Image.Resampling.BILINEAR if bilinear else Image.Resampling.BICUBIC
    if how.resize == "square":
        return image if image.size == (size, size) else image.resize((size, size), resample)
    target = resized_size(image.width, image.height, size, how.rounding)
    if target[0] * target[1] > FULL_RESIZE_AREA * size * size:
        return fit_region_image(image, size, target, resample, how.crop)
    if target != image.size:
        image = image.resize(target, resample)
    top, left = crop_offset(target[1] - size, how.crop), crop_offset(target[0] - size, how.crop)
    return image.crop((left, top, left + size, top + size))


def region(width: int, height: int, size: int, target: tuple[int, int], crop: str = "floor") -> tuple[float, float, float, float, int, int]:
    """Where the central ``size × size`` of a ``width × height`` picture resized to ``target``
    lies in the picture: its columns ``[x0, x1)`` and rows ``[y0, y1)`` (Pillow's boxes), and the
    source rows ``[r0, r1)`` the vertical pass reads (its taps: 2 source pixels, times the scale
    when shrinking, plus one)."""
    tw, th = target
    left, top = crop_offset(tw - size, crop), crop_offset(th - size, crop)
    sx, sy = width / tw, height / th
    x0, x1 = (0.0, float(width)) if tw == size else (left * sx, (left + size) * sx)
    y0, y1 = (0.0, float(height)) if th == size else (top * sy, (top + size) * sy)
    reach = 2 * max(sy, 1.0) + 1
    return x0, x1, y0, y1, max(0, math.floor(y0 - reach)), min(height, math.ceil(y1 + reach))


def fit_region(image: Image.Image, size: int, target: tuple[int, int], resample: int | None = None) -> np.ndarray:
    """The central ``size × size`` of ``image`` resized to ``target``, resampling only what it needs.

    Two one-axis resizes, each with a ``box`` on its own axis: the horizontal pass makes the
    ``size`` central columns of only the rows the vertical pass reads (its taps: 2 source
    pixels, times the scale when shrinking, plus one), then the vertical pass the ``size``
    central rows. Work and memory are those of the output. The filter positions are the
    whole resize's up to float rounding of the box (Pillow takes it in float32), but the
    8-bit intermediate can be rounded in another pass order than Pillow's whole resize
    chooses, so a pixel may differ from a whole resize and crop by a level or two on
    natural pictures (more on noise).
    """
    return np.asarray(fit_region_image(image, size, target, resample))


def fit_region_image(image: Image.Image, size: int, target: tuple[int, int], resample: int | None = None, crop: str = "floor") -> Image.Image:
    """:func:`fit_region` as a picture, in the picture's own mode (``crop``: :func:`crop_offset`'s rule)."""
    from PIL import Image

    w, h = image.size
    bicubic = Image.Resampling.BICUBIC if resample is None else resample
    x0, x1, y0, y1, r0, r1 = region(w, h, size, target, crop)
    rows = image.crop((0, r0, w, r1)).resize((size, r1 - r0), bicubic, box=(x0, 0, x1, r1 - r0))
    return rows.resize((size, size), bicubic, box=(0, y0 - r0, size, y1 - r0))


def from_rgba(array: np.ndarray) -> Image.Image:
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(array), mode="RGBA")


def from_array(array: np.ndarray) -> Image.Image:
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(array), mode="RGB")


# A decoded video frame as 8-bit RGB (docs/checkpoint.md, "Video tower"). libswscale, through
# PyAV, converts a frame by its tags, an untagged range taken as limited, except a grey (4:0:0)
# frame, which it takes as full range whatever its tag: a limited-range HEVC 4:0:0 clip's black
# (Y = 16) came out 16 and its white (235) 235, where the same picture from H.264 (whose decoder
# gives 4:0:0 as 4:2:0 with neutral chroma) came out 0 and 255. So a grey frame is given neutral
# chroma first and converted as H.264's is (docs/media-reading.md).
FULL_RANGE = 2  # AVCOL_RANGE_JPEG: samples 0 … 2^bits − 1


def frame_rgb(frame: Any) -> np.ndarray:
    """``uint8 [height, width, 3]`` of a decoded frame, as libswscale converts it by its tags; a
    grey frame not tagged full range is converted as 4:2:0 with neutral chroma (:func:`with_chroma`)."""
    if frame.format.name.startswith("gray") and frame.color_range != FULL_RANGE:
        frame = with_chroma(frame)
    out: np.ndarray = frame.to_ndarray(format="rgb24")
    return out


def with_chroma(frame: Any) -> Any:
    """A grey frame (``gray``, ``gray10le``, …) as the 4:2:0 frame of the same depth whose chroma
    is neutral (``2^(bits − 1)``), its luma, range and matrix tags as they are; a grey format with
    no such 4:2:0 format (floating point) is returned as it is."""
    import av

    name = frame.format.name
    try:
        out = av.VideoFrame(frame.width, frame.height, "yuv420p" + name[len("gray") :])
    except ValueError:
        return frame
    bits = frame.format.components[0].bits
    dtype = np.dtype(np.uint8 if bits <= 8 else "<u2" if name.endswith("le") else ">u2")
    width, height = frame.width, frame.height
    luma = np.frombuffer(frame.planes[0], dtype).reshape(height, -1)[:, :width]
    target = out.planes[0]
    plane = np.zeros((height, target.line_size // dtype.itemsize), dtype)
    plane[:, :width] = luma
    target.update(plane.tobytes())
    for chroma in out.planes[1:]:
        chroma.update(np.full(chroma.buffer_size // dtype.itemsize, 1 << (bits - 1), dtype).tobytes())
    out.colorspace, out.color_range = frame.colorspace, frame.color_range
    return out
