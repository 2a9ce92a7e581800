"""The small frozen records plugins hand to the host: towers, modalities and backends.

A modality plugin's ``uform_modalities`` hook yields :class:`Modality` records; a backend
plugin's ``uform_backends`` hook yields :class:`Backend` records. The host never imports a
plugin by name: it reads these records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import onnx

from .config import Geometry, Head, ModelConfig
from .graph import GraphBuilder
from .types import CPUClass, GPUClass, Scalar

if TYPE_CHECKING:
    from .executor import Executor


@dataclass(frozen=True)
class TensorSpec:
    """A tensor a tower expects: its shape (BF16 as stored) and the normal distribution
    ``uform new`` draws it from (norm weights at mean 1, everything else at mean 0)."""

    shape: tuple[int, ...]
    mean: float = 0.0
    std: float = 0.02


def stack_tensors(prefix: str, g: Geometry, dimensions: int | None = None, head: Head | None = None) -> dict[str, TensorSpec]:
    """The tensors of ``prefix.blocks.*`` and ``prefix.ln_final`` (pre-norm only; see docs/checkpoint.md),
    plus ``prefix.projection.weight`` [dimensions, width] when ``dimensions`` is given, and
    what ``head`` adds or drops (version 2: ``ln_pre``, the projection's bias, none, or the two
    layers of ``mlp``, the attention pooling head; not the class token, which the tower declares)."""
    w, m = g.width, g.mlp_width
    ones, zeros = TensorSpec((w,), mean=1.0), TensorSpec((w,))
    out: dict[str, TensorSpec] = {}
    for i in range(g.depth):
        p = f"{prefix}.blocks.{i}"
        out.update({
            f"{p}.ln1.weight": ones, f"{p}.ln1.bias": zeros,
            f"{p}.attn.qkv.weight": TensorSpec((3 * w, w)), f"{p}.attn.qkv.bias": TensorSpec((3 * w,)),
            f"{p}.attn.out.weight": TensorSpec((w, w)), f"{p}.attn.out.bias": zeros,
            f"{p}.ln2.weight": ones, f"{p}.ln2.bias": zeros,
            f"{p}.mlp.fc1.weight": TensorSpec((m, w)), f"{p}.mlp.fc1.bias": TensorSpec((m,)),
            f"{p}.mlp.fc2.weight": TensorSpec((w, m)), f"{p}.mlp.fc2.bias": zeros,
        })  # fmt: skip
    if g.norm == "pre":  # a post-norm stack ends in its last block's ln2
        out[f"{prefix}.ln_final.weight"], out[f"{prefix}.ln_final.bias"] = ones, zeros
    head = head or Head()
    if head.ln_pre:
        out[f"{prefix}.ln_pre.weight"], out[f"{prefix}.ln_pre.bias"] = ones, zeros
    if head.pooling == "attention":
        p = f"{prefix}.pool"
        out.update({
            f"{p}.probe": TensorSpec((w,)),
            f"{p}.attn.qkv.weight": TensorSpec((3 * w, w)), f"{p}.attn.qkv.bias": TensorSpec((3 * w,)),
            f"{p}.attn.out.weight": TensorSpec((w, w)), f"{p}.attn.out.bias": zeros,
            f"{p}.ln.weight": ones, f"{p}.ln.bias": zeros,
            f"{p}.mlp.fc1.weight": TensorSpec((m, w)), f"{p}.mlp.fc1.bias": TensorSpec((m,)),
            f"{p}.mlp.fc2.weight": TensorSpec((w, m)), f"{p}.mlp.fc2.bias": zeros,
        })  # fmt: skip
    if dimensions is not None:
        out.update(projection_tensors(prefix, w, dimensions, head.projection))
    return out


def projection_tensors(prefix: str, width: int, dimensions: int, projection: str) -> dict[str, TensorSpec]:
    """The tensors of a tower's projection (docs/checkpoint.md) from its ``width`` pooled row to
    ``dimensions``: ``linear`` ``prefix.projection.weight`` [dimensions, width], ``linear_bias``
    that and ``.bias`` [dimensions], ``mlp`` ``prefix.projection.0`` [dimensions, width] and ``.1``
    [dimensions, dimensions] each with a bias (Linear, ReLU, Linear), ``none`` nothing."""
    d = dimensions
    if projection == "mlp":
        return {
            f"{prefix}.projection.0.weight": TensorSpec((d, width)), f"{prefix}.projection.0.bias": TensorSpec((d,)),
            f"{prefix}.projection.1.weight": TensorSpec((d, d)), f"{prefix}.projection.1.bias": TensorSpec((d,)),
        }  # fmt: skip
    out = {f"{prefix}.projection.weight": TensorSpec((d, width))} if projection != "none" else {}
    if projection == "linear_bias":
        out[f"{prefix}.projection.bias"] = TensorSpec((d,))
    return out


@dataclass(frozen=True)
class Tower:
    """One tower of a checkpoint: config key ``name`` under ``towers``, tensors under ``name.``.

    ``read(tower_config, model_config)`` checks the tower's config and answers the plugin's
    own parsed form of it (raise :class:`~uform.CheckpointError` naming the field);
    ``tensors(parsed, model_config)`` the tensors it expects; ``graph(parsed, model_config,
    builder)`` adds its inputs, nodes and outputs to the builder; ``presets`` maps ``tiny``,
    ``small`` and ``base`` to tower configs for ``uform new``.
    """

    name: str
    read: Callable[[Mapping[str, Any], ModelConfig], Any]
    tensors: Callable[[Any, ModelConfig], Mapping[str, TensorSpec]]
    graph: Callable[[Any, ModelConfig, GraphBuilder], None]
    presets: Mapping[str, Mapping[str, Any]]


MODEL_NAMES = frozenset({
    "backend", "close", "compute", "deferred", "describe", "image_labels", "label_probabilities", "labels",
    "load_ram", "load_ram_buffer", "load_vram", "load_vram_buffer", "on", "served", "source",
})  # fmt: skip
"""``uform.Model``'s own names that are not verbs: a verb so named could never be called as
``model.NAME`` (the Model's own attribute answers), so the host refuses it (core does not import
``uform.model``; ``tests/test_plugins.py`` holds this set to the class)."""


@dataclass(frozen=True)
class Modality:
    """A modality: the tower it runs and the verbs it adds to ``Model``.

    Each verb is ``fn(call, *args, **kwargs)`` where ``call`` is the host's
    :class:`~uform.core.runtime.Call` for this tower. ``describe(parsed, model_config)``
    may contribute :class:`~uform.ModelDescription` fields (``token_width``,
    ``choice_temperature_groups``).
    """

    name: str
    tower: Tower
    verbs: Mapping[str, Callable[..., Any]]
    describe: Callable[[Any, ModelConfig], Mapping[str, int]] | None = None


class Runner(Protocol):
    """What a backend answers per tower: ONNX Runtime's ``InferenceSession.run`` shape."""

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class TowerPlan:
    """A tower ready to place: its graph (weights declared, unbound) and the stored weights."""

    graph: onnx.ModelProto
    weights: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class LoadRequest:
    """Everything a backend needs to place a checkpoint's towers."""

    config: ModelConfig
    towers: Mapping[str, TowerPlan]
    executor: Executor
    quantization: Scalar
    cpu_class: CPUClass | None = None
    gpu_class: GPUClass | None = None
    memory_domains: Sequence[int] | None = None
    devices: Sequence[int] | None = None
    advance: Callable[[int], None] = field(default=lambda n: None)


@dataclass(frozen=True)
class Placement:
    """Placed towers: a runner per tower, the bytes held, and the classes they run as.

    ``quantization`` is the scalar the transformer blocks' weights are held in; ``compute``
    says in words what their products run in (``"bf16 products, float32 sums (avx512-bf16
    kernels)"``). ``batch_scale`` multiplies the verbs' batch bounds, which are sized for one
    CPU session (a GPU amortises launches and transfers over more rows; replicas split a
    batch between them). ``backend`` is filled in by the host with the backend's name.
    """

    runners: Mapping[str, Runner]
    memory_usage: int
    quantization: Scalar
    cpu_class: CPUClass | None = None
    gpu_class: GPUClass | None = None
    batch_scale: int = 1
    compute: str = ""
    backend: str = ""


def accepts_all(request: LoadRequest) -> str | None:
    """The default of :attr:`Backend.accepts`: every request this backend can run."""
    return None


@dataclass(frozen=True)
class Backend:
    """Where towers run. ``placement`` is ``"ram"`` (``load_ram``) or ``"vram"`` (``load_vram``).

    ``probe()`` answers None when the backend can run here, else the reason it cannot;
    ``accepts(request)`` answers None when it serves this load (its quantization, its pinned
    class), else the reason it leaves the load to the next backend; ``open(request)`` places
    the towers or raises :class:`~uform.UnsupportedError`. Backends of a placement are tried
    from the highest ``priority`` down; the first that probes and accepts opens the load.
    """

    name: str
    placement: Literal["ram", "vram"]
    probe: Callable[[], str | None]
    open: Callable[[LoadRequest], Placement]
    priority: int = 0
    accepts: Callable[[LoadRequest], str | None] = accepts_all
    detail: Callable[[], str] | None = None  # what it runs here, in words, for `uform plugins`
