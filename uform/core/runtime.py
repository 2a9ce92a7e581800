"""Loading a checkpoint onto a backend, and dispatching verbs to the modality that owns them."""

from __future__ import annotations

import errno
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import onnx

from . import safetensors
from .config import ModelConfig
from .errors import CheckpointError, UnsupportedError
from .executor import Executor, check_executor
from .graph import GraphBuilder
from .host import Host, get_host
from .plugin import LoadRequest, Modality, Placement, Runner, TensorSpec, TowerPlan
from .progress import Progress, ProgressHandler
from .scalars import coerce
from .types import CPUClass, GPUClass, ModelDescription, Scalar, gpu_devices
from .weights import Source, Stored, shape_of, stored_bytes

STORED_DTYPE = "BF16"
V2_DTYPES = ("BF16", "F16", "F32")  # what a version-2 file may store


@dataclass(frozen=True)
class LoadedTower:
    """A tower this model serves: its modality, parsed config, graph and placed runner."""

    modality: Modality
    parsed: Any
    graph: onnx.ModelProto


@dataclass(frozen=True)
class Call:
    """What a verb gets: the tower's runner and config, and the executor the call runs with."""

    tower: str
    parsed: Any
    config: ModelConfig
    runner: Runner
    executor: Executor
    output_names: tuple[str, ...]
    batch_scale: int = 1
    # the runners of the load's other towers, by tower name (a tower made of another runs on it)
    peers: Mapping[str, Runner] = field(default_factory=dict)

    def rows(self, cpu_rows: int) -> int:
        """A batch bound sized for the CPU (rows, or a token budget), scaled for the placement."""
        return cpu_rows * self.batch_scale


def plan_towers(container: Source, config: ModelConfig, host: Host) -> dict[str, tuple[Modality, Any, dict[str, TensorSpec]]]:
    """Match the checkpoint's towers with installed modalities and check every tensor."""
    planned: dict[str, tuple[Modality, Any, dict[str, TensorSpec]]] = {}
    skipped: list[str] = []
    for name, tower_cfg in config.towers.items():
        modality = host.tower_owner(name)
        if modality is None:
            skipped.append(name)
            warnings.warn(
                f"checkpoint tower {name!r} has no installed plugin; its verbs are unavailable "
                "(`uform plugins` lists what is installed)",
                RuntimeWarning,
                stacklevel=4,
            )
            continue
        parsed = host.tower_call(modality, "read", tower_cfg, config)  # a plugin's bug: PluginError naming it
        specs: dict[str, TensorSpec] = host.tower_call(modality, "tensors", parsed, config)
        for tensor, spec in specs.items():
            entry = container.entries.get(tensor)
            if entry is None:
                raise CheckpointError(f"tensor {tensor!r} is missing (tower {name!r} expects shape {list(spec.shape)})")
            if entry.dtype != STORED_DTYPE and (config.version < 2 or entry.dtype not in V2_DTYPES):
                stores = STORED_DTYPE if config.version < 2 else ", ".join(V2_DTYPES)
                raise CheckpointError(f"tensor {tensor!r}: dtype {entry.dtype}, the format (version {config.version}) stores {stores}")
            if entry.shape != spec.shape:
                raise CheckpointError(
                    f"tensor {tensor!r}: shape {list(entry.shape)}, but the config of tower {name!r} gives {list(spec.shape)}"
                )
        planned[name] = (modality, parsed, specs)
    expected = {t for _, _, specs in planned.values() for t in specs}
    for tensor in container.entries:
        if tensor not in expected and not any(tensor.startswith(f"{s}.") for s in skipped):
            raise CheckpointError(f"tensor {tensor!r} belongs to no tower of the config")
    if not planned:
        raise UnsupportedError(f"no installed plugin serves any tower of this checkpoint ({', '.join(config.towers)})")
    return planned


def build_graph(name: str, modality: Modality, parsed: Any, config: ModelConfig, specs: Mapping[str, TensorSpec]) -> onnx.ModelProto:
    builder = GraphBuilder(name)
    get_host().tower_call(modality, "graph", parsed, config, builder)
    unknown = [w for w in builder.weights if w not in specs]
    if unknown:
        raise RuntimeError(f"plugin bug: the {name!r} graph uses tensors its tower does not declare: {unknown}")
    return builder.build()


class Runtime:
    """A loaded checkpoint: placed towers, the verbs they serve, and the description."""

    def __init__(self, config: ModelConfig, towers: dict[str, LoadedTower], placement: Placement, executor: Executor) -> None:
        self.config = config
        self.towers = towers
        self.placement = placement
        self.executor = executor
        self._outputs = {n: tuple(o.name for o in t.graph.graph.output) for n, t in towers.items()}

    @classmethod
    def load(
        cls,
        source: memoryview | Source,
        *,
        placement: str,
        executor: Executor | None,
        quantization: Scalar | str,
        progress: ProgressHandler | None,
        progress_steps: int,
        cpu_class: CPUClass | None = None,
        gpu_class: GPUClass | None = None,
        memory_domains: Sequence[int] | None = None,
        devices: Sequence[int] | None = None,
    ) -> Runtime:
        quantization = coerce(quantization, "quantization")
        if placement == "vram":
            devices = gpu_devices(devices)
        if executor is not None:
            check_executor(executor)
        executor = executor or Executor()
        named = source.named if not isinstance(source, memoryview) else lambda exc: exc
        try:
            container = safetensors.parse(source) if isinstance(source, memoryview) else source
            config = ModelConfig.from_metadata(container.metadata)
            host = get_host()
            planned = plan_towers(container, config, host)
            towers, plans = {}, {}
            for name, (modality, parsed, specs) in planned.items():
                graph = build_graph(name, modality, parsed, config, specs)
                towers[name] = LoadedTower(modality, parsed, graph)
                plans[name] = TowerPlan(graph, Stored(container, specs, as_bf16=quantization != Scalar.F32))
            short = _memory_shortfall(plans, quantization) if placement == "ram" else ""
            if short:
                raise named(UnsupportedError(short))
            total = sum(stored_bytes(p.weights) for p in plans.values())
            tracker = Progress(progress, progress_steps, total)
            request = LoadRequest(
                config, plans, executor, quantization, cpu_class, gpu_class, memory_domains, devices, tracker.advance
            )
            return cls(config, towers, _open(host, placement, request), executor)
        except CheckpointError as exc:  # the config, a tensor, a weight's values: the file's fault, named
            raise named(exc) from None
        except (MemoryError, OSError) as exc:  # an allocation refused after the check (a ulimit, a cgroup): numpy's, or a map's ENOMEM
            if isinstance(exc, OSError) and exc.errno != errno.ENOMEM:
                raise
            raise named(UnsupportedError(f"ran out of memory while placing its weights ({exc}): it cannot be loaded here")) from None

    def describe(self) -> ModelDescription:
        extra: dict[str, int] = {"token_width": 0, "choice_temperature_groups": 0}
        for tower in self.towers.values():  # a plugin's describe that raises or answers wrong: PluginError naming it
            extra.update(get_host().described(tower.modality, tower.parsed, self.config))
        p = self.placement
        return ModelDescription(
            self.config.dimensions, self.config.context, p.quantization, p.memory_usage,
            p.cpu_class, p.gpu_class, extra["token_width"], extra["choice_temperature_groups"],
        )  # fmt: skip

    def call(self, verb: str, executor: Executor | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        for name, tower in self.towers.items():
            fn = tower.modality.verbs.get(verb)
            if fn is not None:
                runner, scale = self.placement.runners[name], self.placement.batch_scale
                peers = {other: r for other, r in self.placement.runners.items() if other != name}
                call = Call(name, tower.parsed, self.config, runner, executor or self.executor, self._outputs[name], scale, peers)
                return fn(call, *args, **kwargs)
        owner = get_host().verb(verb)  # PluginConflictError when contested; UnsupportedError when no plugin has it
        raise UnsupportedError(
            f"{verb} needs the {owner.tower.name!r} tower, which this checkpoint does not have "
            f"(it has: {', '.join(self.config.towers)})"
        )


def machine_memory() -> int | None:
    """This machine's RAM and swap in bytes (``/proc/meminfo``; else the physical pages), None
    where neither tells."""
    try:
        with open("/proc/meminfo", "rb") as f:
            lines = f.read().decode("ascii", "replace").splitlines()
    except OSError:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            return None
    kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in lines) if v.split()[:1] and v.split()[0].isdigit()}
    return (kib.get("MemTotal", 0) + kib.get("SwapTotal", 0)) * 1024 or None


def _memory_shortfall(plans: Mapping[str, TowerPlan], quantization: Scalar) -> str:
    """Why the weights cannot be held here ('' when they may be): their values, at the fewest
    bytes ``quantization`` holds one in (E4M3 1, else 2), outnumber the machine's RAM and swap.
    Judged before anything is read: a file of zeros as large as its header claims (a sparse one
    costs no disk) would else be read until the out-of-memory killer ended the process."""
    values = sum(math.prod(shape_of(p.weights, n)) for p in plans.values() for n in p.weights)
    return memory_shortfall(values, 1 if quantization == Scalar.E4M3 else 2, quantization.name, "loaded")


def memory_shortfall(values: int, width: int, scalar: str, done: str) -> str:
    """Why ``values`` weight values of ``width`` bytes each (at ``scalar``) cannot be held here ('' when
    they may be: they fit the machine's RAM and swap, or it does not say); ``done``: what cannot be
    done with the checkpoint ("loaded", "exported")."""
    need, memory = values * width, machine_memory()
    if memory is None or need <= memory:
        return ""
    return (
        f"its {values:,} weight values take at least {need:,} bytes at {scalar}, more than this "
        f"machine's {memory:,} bytes of RAM and swap: it cannot be {done} here"
    )


def _open(host: Host, placement: str, request: LoadRequest) -> Placement:
    """The placement of the first backend, best first, that runs here and accepts the load."""
    reasons = []
    for backend in host.backends_for(placement):
        reason = host.probe(backend) or host.accepts(backend, request)
        if reason is None:
            return replace(host.open(backend, request), backend=backend.name)
        reasons.append(f"{backend.name}: {reason}")
    detail = "; ".join(reasons) if reasons else host.no_backend(placement)
    raise UnsupportedError(f"cannot place a model in {placement.upper()}: {detail}")


def as_buffer(buffer: Any) -> memoryview:
    """A flat byte view of ``bytes``, ``bytearray``, ``memoryview``, ``mmap`` or a numpy array."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(f"a checkpoint buffer must support the buffer protocol, got {type(buffer).__name__}") from None
    if not view.contiguous:
        raise ValueError("a checkpoint buffer must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


