"""A Swin stack's config fields, checked, and the tensors it holds (docs/checkpoint.md, "Swin
stack").

The stack reads a square image ``[B, channels, image_size, image_size]``: non-overlapping
``patch_size`` patches, each a token of ``embed_dim`` (a linear map of its
``channels · patch_size²`` values, then a LayerNorm with ``patch_norm``); then stage ``s``
(``len(depths)`` of them) runs ``depths[s]`` blocks of windowed attention over its
``resolution(s)²`` tokens of width ``dim(s) = embed_dim · 2ˢ`` with ``heads[s]`` heads, every
second block over windows shifted by half a window, and (but the last) merges each 2×2 tokens
into one of twice the width. The pooled row is the mean of the last stage's tokens after
``ln_final``: ``width = dim(last)`` values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from uform.core.config import ACTIVATIONS, LAYER_NORM_EPS, MAX_DEPTH, MAX_HEADS, MAX_WIDTH, choice, flag, integer, number
from uform.core.errors import CheckpointError
from uform.core.plugin import TensorSpec

SWIN_FIELDS = frozenset({
    "image_size", "channels", "patch_size", "embed_dim", "depths", "heads", "window_size", "mlp_ratio", "patch_norm",
    "activation", "layer_norm_eps",
})  # fmt: skip
MAX_STAGES = 8
MAX_IMAGE = 4096
MAX_WINDOW = 64
# the window orders, shift masks and position biases of a stack's graph, in values (index
# constants are int64: at most 128 MiB); laion/clap-htsat-unfused's stack takes 1.1 million, an
# HTSAT-base (width 128, depths 2, 2, 12, 2) 1.5 million
MAX_GRAPH_VALUES = 1 << 24


@dataclass(frozen=True)
class SwinTower:
    """The stack's geometry: see the module's docstring. ``layer_norm_eps`` is the blocks'
    LayerNorms' epsilon; the patch, merge and final LayerNorms take 1e-5 (as transformers' Swin
    builds them whatever its config says)."""

    image_size: int
    channels: int
    patch_size: int
    embed_dim: int
    depths: tuple[int, ...]
    heads: tuple[int, ...]
    window_size: int
    mlp_ratio: float
    patch_norm: bool = True
    activation: str = "gelu"
    layer_norm_eps: float = LAYER_NORM_EPS

    @property
    def grid(self) -> int:
        """Patches a side."""
        return self.image_size // self.patch_size

    @property
    def stages(self) -> int:
        return len(self.depths)

    def dim(self, stage: int) -> int:
        return self.embed_dim << stage

    def resolution(self, stage: int) -> int:
        """Tokens a side in ``stage``."""
        return self.grid >> stage

    def mlp_width(self, stage: int) -> int:
        return int(self.mlp_ratio * self.dim(stage))

    def shift(self, stage: int, block: int) -> int:
        """The window shift of ``block`` of ``stage``: half a window for odd blocks, none where
        one window covers the stage's tokens (transformers' ``set_shift_and_window_size``)."""
        return self.window_size // 2 if block % 2 and self.resolution(stage) > self.window_size else 0

    @property
    def width(self) -> int:
        """The pooled row's width: the last stage's."""
        return self.dim(self.stages - 1)

    @property
    def graph_values(self) -> int:
        """Values the graph's window constants and biases take: the relative position index
        (``w⁴``), each stage's token orders (padded² + tokens, one a shift) and shift mask
        (padded² · w²), and each block's position bias (``heads · w⁴``, gathered from its table)."""
        w = self.window_size
        total = w**4
        for s in range(self.stages):
            res = self.resolution(s)
            padded = -(-res // w) * w
            for shift in {self.shift(s, i) for i in range(self.depths[s])}:
                total += padded * padded + res * res + (padded * padded * w * w if shift else 0)
            total += self.depths[s] * self.heads[s] * w**4
        return total


def _integers(cfg: Mapping[str, Any], key: str, where: str, lo: int, hi: int) -> tuple[int, ...]:
    value = cfg.get(key)
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_STAGES:
        raise CheckpointError(f"config field {where}.{key}: expected a list of 1 to {MAX_STAGES} integers (one a stage), got {value!r}")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise CheckpointError(f"config field {where}.{key}: {v!r} is not an integer in [{lo}, {hi}]")
    return tuple(value)


def read(cfg: Mapping[str, Any], where: str) -> SwinTower:
    """The Swin fields of the tower config ``cfg`` (its path ``where``), refused by name where
    the stack cannot run, or where its graph's constants would pass :data:`MAX_GRAPH_VALUES`."""
    size = integer(cfg, "image_size", where, 1, MAX_IMAGE)
    t = SwinTower(
        size, integer(cfg, "channels", where, 1, 16), integer(cfg, "patch_size", where, 1, size),
        integer(cfg, "embed_dim", where, 1, MAX_WIDTH), _integers(cfg, "depths", where, 1, MAX_DEPTH),
        _integers(cfg, "heads", where, 1, MAX_HEADS), integer(cfg, "window_size", where, 1, MAX_WINDOW),
        number(cfg, "mlp_ratio", where, 1e-3, 64.0), flag(cfg, "patch_norm", where, True),
        choice(cfg, "activation", where, ACTIVATIONS, "gelu"),
        number(cfg, "layer_norm_eps", where, 1e-12, 1e-2) if "layer_norm_eps" in cfg else LAYER_NORM_EPS,
    )  # fmt: skip
    if len(t.heads) != t.stages:
        raise CheckpointError(f"config field {where}.heads: {len(t.heads)} values for the {t.stages} stages of depths {list(t.depths)}")
    if size % t.patch_size:
        raise CheckpointError(f"config field {where}.patch_size: {t.patch_size} does not divide image_size {size}")
    if t.width > MAX_WIDTH:
        raise CheckpointError(f"config field {where}.embed_dim: {t.embed_dim} doubled at each of {t.stages - 1} merges is {t.width}, over {MAX_WIDTH}")
    if t.grid % (1 << (t.stages - 1)):
        raise CheckpointError(f"config field {where}.patch_size: the {t.grid} patches a side do not halve {t.stages - 1} times (one a merge)")
    for s in range(t.stages):
        if t.dim(s) % t.heads[s]:
            raise CheckpointError(f"config field {where}.heads: {t.heads[s]} heads do not divide stage {s}'s width {t.dim(s)}")
        if t.mlp_width(s) < 1:
            raise CheckpointError(f"config field {where}.mlp_ratio: {t.mlp_ratio} leaves stage {s}'s MLP no width")
        if t.resolution(s) < t.window_size:
            raise CheckpointError(
                f"config field {where}.window_size: {t.window_size} is more than the {t.resolution(s)} tokens a side of stage {s} "
                f"(a window must fit in every stage)"
            )
    if t.graph_values > MAX_GRAPH_VALUES:
        raise CheckpointError(
            f"config field {where}.image_size: {size} (patch_size {t.patch_size}, window_size {t.window_size}, depths {list(t.depths)}, "
            f"heads {list(t.heads)}) would make {t.graph_values} values of window orders, masks and position biases, over {MAX_GRAPH_VALUES}"
        )
    return t


def tensors(t: SwinTower, prefix: str) -> dict[str, TensorSpec]:
    """The stack's tensors under ``prefix`` (docs/checkpoint.md, "Swin stack")."""
    e, w = t.embed_dim, t.window_size

    def norm(name: str, width: int) -> dict[str, TensorSpec]:
        return {f"{name}.weight": TensorSpec((width,), mean=1.0), f"{name}.bias": TensorSpec((width,))}

    out = {f"{prefix}.patch.weight": TensorSpec((e, t.channels * t.patch_size**2)), f"{prefix}.patch.bias": TensorSpec((e,))}
    if t.patch_norm:
        out.update(norm(f"{prefix}.patch_norm", e))
    for s in range(t.stages):
        c, m = t.dim(s), t.mlp_width(s)
        for i in range(t.depths[s]):
            p = f"{prefix}.stages.{s}.blocks.{i}"
            out.update(norm(f"{p}.ln1", c) | norm(f"{p}.ln2", c))
            out.update({
                f"{p}.attn.qkv.weight": TensorSpec((3 * c, c)), f"{p}.attn.qkv.bias": TensorSpec((3 * c,)),
                f"{p}.attn.bias_table": TensorSpec(((2 * w - 1) ** 2, t.heads[s])),
                f"{p}.attn.out.weight": TensorSpec((c, c)), f"{p}.attn.out.bias": TensorSpec((c,)),
                f"{p}.mlp.fc1.weight": TensorSpec((m, c)), f"{p}.mlp.fc1.bias": TensorSpec((m,)),
                f"{p}.mlp.fc2.weight": TensorSpec((c, m)), f"{p}.mlp.fc2.bias": TensorSpec((c,)),
            })  # fmt: skip
        if s < t.stages - 1:
            p = f"{prefix}.stages.{s}.merge"
            out.update(norm(f"{p}.norm", 4 * c))
            out[f"{p}.reduction.weight"] = TensorSpec((2 * c, 4 * c))
    out.update(norm(f"{prefix}.ln_final", t.width))
    return out
