"""The image modality: JPEG, PNG and WebP files, or ``[h, w, 3]`` uint8 pixels, through the ``image`` tower.

Tensors and math are in docs/checkpoint.md ("Image tower"); files are decoded and buffers
checked by :mod:`uform.plugins.media.image` (rules in docs/media-images.md). Each batch is decoded in the
executor's threads on the prefetch thread while ONNX Runtime computes the batch before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from uform.core.arena import Arena, Encoded
from uform.core.config import GEOMETRY_FIELDS, HEAD_FIELDS, Geometry, Head, ModelConfig, only_fields
from uform.core.errors import CheckpointError, InputError
from uform.core.graph import GraphBuilder
from uform.core.hookspecs import hookimpl
from uform.core.pipeline import EncodeOptions, check_batch, check_stats, encode
from uform.core.plugin import Modality, Runner, TensorSpec, Tower, stack_tensors
from uform.core.prepare import ItemBatches
from uform.core.runtime import Call
from uform.core.stats import EncodeStats

from .media import frames, naflex
from .media import image as pictures
from .media.frames import Pixels
from .media.image import PIXEL_INPUTS, as_pixels, decode
from .media.files import sources

if TYPE_CHECKING:
    from typing_extensions import Unpack

MAX_ROWS = 32  # images per batch
# a pixel buffer this large is fitted a strip of rows at a time (media.image.fit_strips), not
# copied whole into a Pillow picture (4 bytes a pixel) first; below it the copy is cheaper
STREAM_PIXELS = 1 << 22


@dataclass
class ImageEncodeStats(EncodeStats):
    """Counters of image calls.

    ``pixels`` counts source pixels decoded (after any JPEG scale-down), ``bytes_read`` the
    encoded bytes of files, ``reduced`` the JPEGs decoded at a reduced scale.
    ``seconds_decode`` is the wall time spent preparing batches (decoding, converting,
    resizing, in the executor's threads); it overlaps ``seconds_compute``, and the part of it
    that did not is ``seconds_preprocess``.
    """

    pixels: int = 0
    bytes_read: int = 0
    reduced: int = 0
    seconds_decode: float = 0.0


@dataclass(frozen=True)
class ImageTower:
    geometry: Geometry
    pixels: Pixels
    head: Head = Head()


FIELDS = GEOMETRY_FIELDS | HEAD_FIELDS | frames.PIXELS_FIELDS


def read(cfg: Mapping[str, Any], model: ModelConfig) -> ImageTower:
    only_fields(cfg, "towers.image", FIELDS, "an image tower")
    geometry, pixels = frames.read_geometry(cfg, "towers.image")
    head = Head.read(cfg, "towers.image", ("class", "attention"), geometry.width, model.dimensions)
    if pixels.resize == "naflex" and (head.class_token or head.ln_pre):
        raise CheckpointError("config field towers.image.resize: 'naflex' (SigLIP 2's) is a tower without a class token or ln_pre")
    return ImageTower(geometry, pixels, head)


def tensors(t: ImageTower, model: ModelConfig) -> dict[str, TensorSpec]:
    w, p = t.geometry.width, t.pixels.patch_size
    out = {"image.patch.weight": TensorSpec((w, 3 * p * p)), "image.patch.bias": TensorSpec((w,))}
    if t.head.class_token:
        out["image.cls"] = TensorSpec((w,))
    out["image.pos.weight"] = TensorSpec((t.head.first + t.pixels.grid**2, w))
    out.update(stack_tensors("image", t.geometry, model.dimensions, t.head))
    return out


def graph(t: ImageTower, model: ModelConfig, b: GraphBuilder) -> None:
    x = _grid_tokens(t, b) if t.pixels.resize == "naflex" else _square_tokens(t, b)
    x = b.stack_input(x, "image", t.geometry, t.head)
    if t.head.pooling == "attention":
        pooled = b.attention_pool(b.transformer(x, "image", t.geometry), "image", t.geometry)
    else:
        pooled = b.transformer(x, "image", t.geometry, pick=b.class_token)
    b.output(b.projected_embedding(pooled, "image", t.head.projection), "embeddings", None, ["batch", model.dimensions])


def _square_tokens(t: ImageTower, b: GraphBuilder) -> str:
    """``pixels`` uint8 ``[N, S, S, 3]`` as ``[N, G², W]`` tokens with positions (and the class token)."""
    s = t.pixels.image_size
    pixels = frames.pixels_input(b, "pixels", ["batch", s, s, 3])
    x = frames.patch_tokens(b, pixels, "image", t.pixels, t.geometry.width)
    if t.head.class_token:
        positions = b.op("Slice", b.weight("image.pos.weight"), b.ints([1]), b.ints([1 + t.pixels.grid**2]))
        return b.prepend_class_token(b.op("Add", x, positions), "image")
    return b.op("Add", x, b.weight("image.pos.weight"))  # type: ignore[no-any-return]


def _grid_tokens(t: ImageTower, b: GraphBuilder) -> str:
    """NaFlex: ``patches`` uint8 ``[N, T, 3P²]`` (one grid of ``T`` patches, each in (channel,
    row, column) order) normalised, through ``image.patch``, plus ``positions`` float ``[T, G0²]``
    (:func:`uform.plugins.media.naflex.positions`) times ``image.pos.weight``."""
    p, g0, w = t.pixels.patch_size, t.pixels.grid, t.geometry.width
    patches = b.input("patches", TensorProto.UINT8, ["batch", "tokens", 3 * p * p])
    x = b.op("Cast", b.op("Reshape", patches, b.ints([-1, 3 * p * p])), to=b.float_type)
    x = b.op("Div", x, b.scalar(255.0))
    x = b.op("Sub", x, b.const(np.repeat(np.asarray(t.pixels.mean, np.float32), p * p), "mean"))
    x = b.op("Div", x, b.const(np.repeat(np.asarray(t.pixels.std, np.float32), p * p), "std"))
    x = b.linear(x, "image.patch")
    x = b.op("Reshape", x, b.op("Concat", b.op("Shape", patches, end=2), b.ints([w]), axis=0))
    grid = b.input("positions", TensorProto.FLOAT, ["tokens", g0 * g0])
    if b.float_type != TensorProto.FLOAT:
        grid = b.op("Cast", grid, to=b.float_type)
    return b.op("Add", x, b.op("MatMul", grid, b.weight("image.pos.weight")))  # type: ignore[no-any-return]


class GridGroups:
    """A NaFlex image tower as a runner: a batch of pictures of any grids (``patches`` uint8
    ``[B, T, 3P²]``, each row's first ``rows·columns`` real, ``grids`` int64 ``[B, 2]``) run as one
    tower run per grid, each at its own token count: no padding computed, nothing masked."""

    def __init__(self, tower: Runner, g0: int) -> None:
        self.tower, self.g0 = tower, g0

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        patches, grids = input_feed["patches"], input_feed["grids"]
        out: np.ndarray | None = None
        for grid in np.unique(grids, axis=0):
            rows = np.flatnonzero((grids == grid).all(axis=1))
            gh, gw = int(grid[0]), int(grid[1])
            feed = {"patches": np.ascontiguousarray(patches[rows, : gh * gw]), "positions": naflex.positions(gh, gw, self.g0)}
            (part,) = self.tower.run(["embeddings"], feed)
            if out is None:
                out = np.empty((len(grids), part.shape[1]), part.dtype)
            out[rows] = part
        assert out is not None
        return [out]


def grid_batch(fitted: list[np.ndarray], patch: int) -> dict[str, np.ndarray]:
    """The feeds :class:`GridGroups` takes for pictures fitted to their grids."""
    cut = [naflex.patches(f, patch) for f in fitted]
    padded = np.zeros((len(cut), max(len(c) for c in cut), cut[0].shape[1]), np.uint8)
    for i, c in enumerate(cut):
        padded[i, : len(c)] = c
    return {"patches": padded, "grids": np.array([naflex.grid_of(f, patch) for f in fitted], np.int64).reshape(-1, 2)}


# -- verbs -----------------------------------------------------------------------------


Prepared = tuple[np.ndarray, int, int, int]  # fitted pixels, source pixels, bytes read, reduced (0/1)


def _run(call: Call, count: int, prepare: Callable[[int, int], Prepared], arena: Arena, stats: ImageEncodeStats | None, options: EncodeOptions) -> Encoded:
    """Encode ``count`` items, ``prepare(i, S)`` giving item ``i`` (called in the executor's threads)."""
    check_stats(stats, ImageEncodeStats)
    size = call.parsed.pixels.fit  # S, and how pictures are fitted to it
    tally = ImageEncodeStats()

    def count_items(prepared: list[Prepared]) -> None:
        tally.pixels += sum(p[1] for p in prepared)
        tally.bytes_read += sum(p[2] for p in prepared)
        tally.reduced += sum(p[3] for p in prepared)

    px = call.parsed.pixels
    if px.resize == "naflex":  # each picture at its own grid, a tower run per grid
        call = replace(call, runner=GridGroups(call.runner, px.grid))
        stack: Callable[[list[Prepared]], dict[str, np.ndarray]] = lambda prepared: grid_batch([p[0] for p in prepared], px.patch_size)  # noqa: E731
    else:
        stack = lambda prepared: {"pixels": np.stack([p[0] for p in prepared])}  # noqa: E731
    items = ItemBatches(call, lambda i: prepare(i, size), stack, count_items, inputs=PIXEL_INPUTS)
    result = encode(call, count, items.thunks(count, call.rows(MAX_ROWS)), arena, stats=stats, **options)
    if stats is not None:
        tally.seconds_decode = items.seconds
        stats.add(tally)
    return result


def image_encode(
    call: Call, files: Iterable[Any], arena: Arena, /, *, stats: ImageEncodeStats | None = None, **options: Unpack[EncodeOptions]
) -> Encoded:
    items = sources(files, "paths, bytes or binary file objects")

    def prepare(i: int, size: int) -> Prepared:
        fitted, read, pixels, reduced = decode(items[i], size)
        return fitted, pixels, read, int(reduced)

    return _run(call, len(items), prepare, arena, stats, options)


def image_encode_pixels(
    call: Call, pixels: Sequence[Any], arena: Arena, /, *, stats: ImageEncodeStats | None = None, **options: Unpack[EncodeOptions]
) -> Encoded:
    if isinstance(pixels, np.ndarray) and pixels.ndim == 3:
        raise TypeError("pixels must be a sequence of [height, width, 3] buffers, got a single array; wrap it in a list")
    check_batch(pixels, "pixels")
    arrays = [_within_limit(i, as_pixels(i, p)) for i, p in enumerate(pixels)]

    def prepare(i: int, size: int) -> Prepared:
        array = arrays[i]
        height, width = array.shape[:2]
        if height * width >= STREAM_PIXELS:  # frames.fit bit for bit, holding a strip at a time
            fitted = pictures.fit_strips(width, height, lambda box: array[box[1] : box[3]], size)
        else:
            fitted = frames.fit(frames.from_array(array), size)
        return fitted, height * width, 0, 0

    return _run(call, len(arrays), prepare, arena, stats, options)


def _within_limit(index: int, array: np.ndarray) -> np.ndarray:
    """``array`` when it holds at most ``MAX_PIXELS`` pixels, the limit files are held to; an
    ``InputError`` naming its size before anything is copied (a view's copy would be whole)."""
    height, width = array.shape[:2]
    if width * height > pictures.MAX_PIXELS:
        raise InputError(
            index,
            f"the image is {width}x{height} = {width * height} pixels, over the limit of {pictures.MAX_PIXELS} "
            "(uform.plugins.media.image.MAX_PIXELS) that files are held to as well; resize it before encoding it",
        )
    return array


@hookimpl
def uform_modalities() -> Iterable[Modality]:
    common = {"mean": frames.MEAN, "std": frames.STD}
    presets = {
        "tiny": {"width": 64, "depth": 2, "heads": 2, "mlp_width": 128, "image_size": 32, "patch_size": 8, **common},
        "small": {"width": 256, "depth": 4, "heads": 4, "mlp_width": 1024, "image_size": 128, "patch_size": 16, **common},
        "base": {"width": 768, "depth": 12, "heads": 12, "mlp_width": 3072, "image_size": 224, "patch_size": 16, **common},
    }
    tower = Tower("image", read, tensors, graph, presets)
    yield Modality("image", tower, {"image_encode": image_encode, "image_encode_pixels": image_encode_pixels})
