"""The video modality: MP4 (H.264, HEVC) and WebM (VP8, VP9, AV1) clips through the ``video`` tower.

Tensors and math are in docs/checkpoint.md ("Video tower"); clips are sampled and decoded by
:mod:`uform.plugins.media.video` (rules in docs/media-video.md). Clips decode in the executor's threads,
one clip per thread, on the prefetch thread while ONNX Runtime computes the batch before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from uform.core.arena import Arena, Encoded
from uform.core.config import GEOMETRY_FIELDS, HEAD_FIELDS, Geometry, Head, ModelConfig, integer, only_fields
from uform.core.errors import CheckpointError
from uform.core.graph import GraphBuilder
from uform.core.hookspecs import hookimpl
from uform.core.pipeline import EncodeOptions, check_stats, encode
from uform.core.plugin import Modality, TensorSpec, Tower, stack_tensors
from uform.core.prepare import ItemBatches
from uform.core.plugin import Runner
from uform.core.runtime import Call
from uform.core.stats import EncodeStats

from .media import frames
from .media.video import Counters, sample
from .media.frames import Pixels
from .media.files import sources
from .media.image import PIXEL_INPUTS
from .image import GridGroups, grid_batch

if TYPE_CHECKING:
    from typing_extensions import Unpack

MAX_ROWS = 8  # clips per batch
MAX_FRAMES = 1024  # bound on a tower's F


@dataclass
class VideoEncodeStats(EncodeStats):
    """Counters of video calls.

    ``frames`` counts frames handed to the tower (``items × F``), ``frames_decoded`` the
    frames the decoders produced (sampled or passed over), ``seconds_media`` the clips'
    summed duration, ``seeks`` the seeks done, ``bytes_read`` the files' sizes,
    ``skipped_packets`` the packets that failed to decode and were left out (their frames not shown).
    ``seconds_decode`` is the wall time spent preparing batches; the part of it not hidden
    behind ``seconds_compute`` is ``seconds_preprocess``.
    """

    frames: int = 0
    frames_decoded: int = 0
    seconds_media: float = 0.0
    seeks: int = 0
    bytes_read: int = 0
    seconds_decode: float = 0.0
    skipped_packets: int = 0


@dataclass(frozen=True)
class VideoTower:
    geometry: Geometry
    pixels: Pixels
    frames: int
    head: Head = Head()
    from_image: bool = False  # version 2: the image tower over the frames, averaged (no tensors of its own)


FIELDS = GEOMETRY_FIELDS | HEAD_FIELDS | frames.PIXELS_FIELDS | {"frames"}  # a video tower of its own


def read(cfg: Mapping[str, Any], model: ModelConfig) -> VideoTower:
    where = "towers.video"
    count = integer(cfg, "frames", where, 1, MAX_FRAMES)
    if "from" in cfg:
        if cfg["from"] != "image":
            raise CheckpointError(f"config field {where}.from: a video tower can be made of 'image' only, got {cfg['from']!r}")
        image = model.towers.get("image")
        if image is None:
            raise CheckpointError(f"config field {where}.from: 'image', but the checkpoint has no image tower")
        unknown = sorted(set(cfg) - {"from", "frames"})
        if unknown:
            raise CheckpointError(f"config field {where}.{unknown[0]}: a video tower made of the image tower takes only 'from' and 'frames'")
        geometry, pixels = frames.read_geometry(image, "towers.image")
        return VideoTower(geometry, pixels, count, from_image=True)
    only_fields(cfg, where, FIELDS, "a video tower")
    geometry, pixels = frames.read_geometry(cfg, where)
    if pixels.resize == "naflex":
        raise CheckpointError(f"config field {where}.resize: 'naflex' is for a video tower made of the image tower ('from': 'image') only")
    head = Head.read(cfg, where, ("class",), geometry.width, model.dimensions)
    if not head.class_token:
        raise CheckpointError(f"config field {where}.class_token: a video tower of its own has a class token")
    return VideoTower(geometry, pixels, count, head)


def tensors(t: VideoTower, model: ModelConfig) -> dict[str, TensorSpec]:
    if t.from_image:
        return {}
    w, p = t.geometry.width, t.pixels.patch_size
    out = {
        "video.patch.weight": TensorSpec((w, 3 * p * p)),
        "video.patch.bias": TensorSpec((w,)),
        "video.cls": TensorSpec((w,)),
        "video.pos.weight": TensorSpec((1 + t.pixels.grid**2, w)),
        "video.time.weight": TensorSpec((t.frames, w)),
    }
    out.update(stack_tensors("video", t.geometry, model.dimensions, t.head))
    return out


def graph(t: VideoTower, model: ModelConfig, b: GraphBuilder) -> None:
    if t.from_image:  # the image tower's embeddings of the F frames, averaged and renormalised
        rows = b.input("frame_embeddings", TensorProto.FLOAT, ["batch", t.frames, model.dimensions])
        b.output(b.l2_normalize(_frame_mean(b, rows, t.frames)), "embeddings", None, ["batch", model.dimensions])
        return
    s, f, w, n = t.pixels.image_size, t.frames, t.geometry.width, t.pixels.grid**2
    clips = frames.pixels_input(b, "frames", ["batch", f, s, s, 3])
    x = frames.patch_tokens(b, b.op("Reshape", clips, b.ints([-1, s, s, 3])), "video", t.pixels, w)
    x = b.op("Reshape", x, b.ints([-1, f, n, w]))
    positions = b.op("Slice", b.weight("video.pos.weight"), b.ints([1]), b.ints([1 + n]))  # [G², W]
    times = b.op("Unsqueeze", b.weight("video.time.weight"), b.ints([1]))  # [F, 1, W]
    x = b.op("Reshape", b.op("Add", b.op("Add", x, positions), times), b.ints([0, f * n, w]))
    x = b.stack_input(b.prepend_class_token(x, "video"), "video", t.geometry, t.head)
    pooled = b.transformer(x, "video", t.geometry, pick=b.class_token)
    b.output(b.projected_embedding(pooled, "video", t.head.projection), "embeddings", None, ["batch", model.dimensions])


def _frame_mean(b: GraphBuilder, rows: str, count: int) -> str:
    """``[B, F, D]`` → ``[B, D]``: ``(((e_0 + e_1) + e_2) + … + e_{F−1}) / F``, frame after frame,
    element by element, so a clip's mean is the same bits whatever the batch. (ONNX Runtime's
    ``ReduceMean`` over axis 1 sums otherwise for ``B > 1`` than for ``B = 1``: up to 1.2e-7
    apart, so a clip's row changed with the clips beside it.)"""

    def frame(i: int) -> str:
        return b.op("Slice", rows, b.ints([i]), b.ints([i + 1]), b.ints([1]))  # type: ignore[no-any-return]

    total = frame(0)
    for i in range(1, count):
        total = b.op("Add", total, frame(i))
    return b.op("Div", b.op("Squeeze", total, b.ints([1])), b.const(np.float32(count), "frames"))  # type: ignore[no-any-return]


class FramesThroughImage:
    """A video tower made of the image tower, as a runner: the clips' frames ``[B, F, S, S, 3]``
    through the image tower's runner, then the video tower's own (the mean and the norm).
    A NaFlex image tower's runner is :class:`GridGroups`, fed the ``B·F`` frames' ``patches``
    and ``grids`` (:func:`grid_batch`), clip after clip: frames of one grid run together."""

    def __init__(self, image: Runner, pool: Runner, frames: int) -> None:
        self.image, self.pool, self.frames = image, pool, frames

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if "frames" in input_feed:
            clips = input_feed["frames"]
            (rows,) = self.image.run(["embeddings"], {"pixels": clips.reshape(-1, *clips.shape[2:])})
        else:
            (rows,) = self.image.run(["embeddings"], input_feed)
        return self.pool.run(output_names, {"frame_embeddings": rows.reshape(-1, self.frames, rows.shape[-1])})


# -- verb ------------------------------------------------------------------------------


def video_encode(
    call: Call, files: Iterable[Any], arena: Arena, /, *, stats: VideoEncodeStats | None = None, **options: Unpack[EncodeOptions]
) -> Encoded:
    check_stats(stats, VideoEncodeStats)
    tower: VideoTower = call.parsed
    clips = sources(files, "paths, bytes or binary file objects")
    naflex = tower.pixels.resize == "naflex"  # a clip's frames at the grid of its frame size, a run per grid
    if tower.from_image:
        image = GridGroups(call.peers["image"], tower.pixels.grid) if naflex else call.peers["image"]
        call = replace(call, runner=FramesThroughImage(image, call.runner, tower.frames))
    tally = VideoEncodeStats()

    def count_items(prepared: list[tuple[np.ndarray, Counters]]) -> None:
        tally.frames_decoded += sum(c.decoded for _, c in prepared)
        tally.seconds_media += sum(c.seconds for _, c in prepared)
        tally.seeks += sum(c.seeks for _, c in prepared)
        tally.bytes_read += sum(c.bytes_read for _, c in prepared)
        tally.skipped_packets += sum(c.skipped for _, c in prepared)

    count, size = tower.frames, tower.pixels.fit
    stack: Callable[[list[tuple[np.ndarray, Counters]]], dict[str, np.ndarray]]
    if naflex:
        stack = lambda prepared: grid_batch([frame for f, _ in prepared for frame in f], tower.pixels.patch_size)  # noqa: E731
    else:
        stack = lambda prepared: {"frames": np.stack([f for f, _ in prepared])}  # noqa: E731
    items = ItemBatches(call, lambda i: sample(clips[i], count, size), stack, count_items, inputs=PIXEL_INPUTS)
    result = encode(call, len(clips), items.thunks(len(clips), call.rows(MAX_ROWS)), arena, stats=stats, **options)
    if stats is not None:
        tally.frames, tally.seconds_decode = len(clips) * tower.frames, items.seconds
        stats.add(tally)
    return result


@hookimpl
def uform_modalities() -> Iterable[Modality]:
    common = {"mean": frames.MEAN, "std": frames.STD}
    presets = {
        "tiny": {"width": 64, "depth": 2, "heads": 2, "mlp_width": 128, "frames": 4, "image_size": 32, "patch_size": 8, **common},
        "small": {"width": 256, "depth": 4, "heads": 4, "mlp_width": 1024, "frames": 8, "image_size": 112, "patch_size": 16, **common},
        "base": {"width": 768, "depth": 12, "heads": 12, "mlp_width": 3072, "frames": 8, "image_size": 224, "patch_size": 16, **common},
    }  # fmt: skip
    tower = Tower("video", read, tensors, graph, presets)
    yield Modality("video", tower, {"video_encode": video_encode})
