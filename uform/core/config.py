"""The checkpoint's config (JSON in ``__metadata__["uform"]``) and the checks every field gets.

The core checks the fields every checkpoint has; each tower's own fields are checked by the
plugin that owns the tower, with the helpers here, so every error names the field's path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import jsontext
from .errors import CheckpointError
from .safetensors import CONVERT

FORMAT = "uform"
FORMAT_VERSION = 2  # the newest version this uform reads
WRITTEN_VERSION = 1  # what make_config writes unless told: a file using no version-2 field stays version 1
METADATA_KEY = "uform"
LAYER_NORM_EPS = 1e-5
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu")
POOLINGS = ("class", "first_token", "last_token", "final_position", "attention")
NORMS = ("pre", "post")  # where a block's LayerNorms sit: before each sublayer, or after each residual add
PROJECTIONS = ("linear", "linear_bias", "mlp", "none")
# Fields a version-1 file may not carry: each has a default meaning what version 1 means.
V2_FIELDS = frozenset({"source", "labels"})
V1_FIELDS = frozenset({"format", "format_version", "dimensions", "context", "towers", "choice_temperatures"})
V2_TOWER_FIELDS = frozenset({
    "activation", "layer_norm_eps", "norm", "class_token", "ln_pre", "pooling", "projection", "pooler",
    "tokenizer", "vocab_size", "context", "mask", "pad_to_context", "pad_id",
    "resize", "interpolation", "resize_rounding", "alpha", "crop_rounding", "from", "patch_remainder", "max_patches",
    "front", "positions",
})  # fmt: skip

# Bounds that keep a hostile config from asking for absurd allocations.
MAX_WIDTH = 16384
MAX_DEPTH = 256
MAX_HEADS = 256
MAX_CONTEXT = 65536
MAX_DIMENSIONS = 65536
MAX_LABEL_SCALE = 1e6  # labels.scale: what multiplies a cosine before the softmax or sigmoid


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def integer(cfg: Mapping[str, Any], key: str, where: str, lo: int, hi: int) -> int:
    """The integer field ``key`` of ``cfg``, within ``[lo, hi]``; ``where`` prefixes its path."""
    value = cfg.get(key)
    path = _path(where, key)
    if value is None:
        raise CheckpointError(f"config field {path} is missing")
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise CheckpointError(f"config field {path}: expected an integer in [{lo}, {hi}], got {value!r}")
    return value


def number(cfg: Mapping[str, Any], key: str, where: str, lo: float, hi: float) -> float:
    """The finite number field ``key`` of ``cfg``, within ``[lo, hi]``."""
    value = cfg.get(key)
    path = _path(where, key)
    if value is None:
        raise CheckpointError(f"config field {path} is missing")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise CheckpointError(f"config field {path}: expected a number in [{lo}, {hi}], got {value!r}")
    return float(value)


def numbers(cfg: Mapping[str, Any], key: str, where: str, count: int, lo: float, hi: float) -> tuple[float, ...]:
    """A list field of exactly ``count`` finite numbers within ``[lo, hi]``."""
    value = cfg.get(key)
    path = _path(where, key)
    if not isinstance(value, list) or len(value) != count:
        raise CheckpointError(f"config field {path}: expected a list of {count} numbers, got {value!r}")
    for v in value:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not (lo <= v <= hi and math.isfinite(v)):
            raise CheckpointError(f"config field {path}: {v!r} is not a number in [{lo}, {hi}]")
    return tuple(float(v) for v in value)


def choice(cfg: Mapping[str, Any], key: str, where: str, options: Sequence[str], default: str) -> str:
    """The string field ``key``, one of ``options``; ``default`` when absent."""
    value = cfg.get(key, default)
    if value not in options or not isinstance(value, str):
        raise CheckpointError(f"config field {_path(where, key)}: expected one of {', '.join(map(repr, options))}, got {value!r}")
    return value


def flag(cfg: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    """The boolean field ``key``; ``default`` when absent."""
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise CheckpointError(f"config field {_path(where, key)}: expected true or false, got {value!r}")
    return value


def refuse_fields(cfg: Mapping[str, Any], where: str, fields: frozenset[str], why: str) -> None:
    """CheckpointError naming the first of ``fields`` that ``cfg`` carries, and ``why`` it may not."""
    for key in sorted(fields & set(cfg)):
        raise CheckpointError(f"config field {_path(where, key)}: {why}")


def only_fields(cfg: Mapping[str, Any], where: str, fields: frozenset[str], tower: str) -> None:
    """CheckpointError naming the first field of the tower config ``cfg`` that is not among
    ``fields`` (the fields a ``tower`` has): a misspelt field would else be left at its default."""
    for key in sorted(set(cfg) - fields):
        raise CheckpointError(f"config field {_path(where, key)}: not a field of {tower} (it has {', '.join(sorted(fields))})")


GEOMETRY_FIELDS = frozenset({"width", "depth", "heads", "mlp_width", "activation", "layer_norm_eps"})  # Geometry.read's
HEAD_FIELDS = frozenset({"class_token", "ln_pre", "pooling", "projection"})  # Head.read's
STACK_ONLY = V2_TOWER_FIELDS - {"activation", "layer_norm_eps"}  # what a tower of the stack's fields alone refuses


def optional_integer(cfg: Mapping[str, Any], key: str, where: str, lo: int, hi: int, default: int) -> int:
    return integer(cfg, key, where, lo, hi) if key in cfg else default


@dataclass(frozen=True)
class Geometry:
    """A transformer stack: residual width, blocks, attention heads, MLP hidden width, the MLP's
    activation, the layer norms' epsilon and where they sit (``norm``: ``pre``, each block's
    sublayers read a LayerNorm of the stream and ``ln_final`` ends the stack; ``post``, BERT's
    and RoBERTa's, each residual add is followed by a LayerNorm and nothing ends the stack; a
    tower that takes the field says so) (version 2; the defaults are version 1's)."""

    width: int
    depth: int
    heads: int
    mlp_width: int
    activation: str = "gelu"
    layer_norm_eps: float = LAYER_NORM_EPS
    norm: str = "pre"

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @classmethod
    def read(cls, cfg: Mapping[str, Any], where: str) -> Geometry:
        width = integer(cfg, "width", where, 1, MAX_WIDTH)
        geometry = cls(
            width=width,
            depth=integer(cfg, "depth", where, 1, MAX_DEPTH),
            heads=integer(cfg, "heads", where, 1, MAX_HEADS),
            mlp_width=integer(cfg, "mlp_width", where, 1, 8 * MAX_WIDTH),
            activation=choice(cfg, "activation", where, ACTIVATIONS, "gelu"),
            layer_norm_eps=number(cfg, "layer_norm_eps", where, 1e-12, 1e-2) if "layer_norm_eps" in cfg else LAYER_NORM_EPS,
            norm=choice(cfg, "norm", where, NORMS, "pre"),
        )
        if width % geometry.heads:
            raise CheckpointError(f"config field {where}.heads: {geometry.heads} does not divide width {width}")
        return geometry

    def as_dict(self) -> dict[str, int]:
        return {"width": self.width, "depth": self.depth, "heads": self.heads, "mlp_width": self.mlp_width}


@dataclass(frozen=True)
class Head:
    """How a tower's stack starts and ends (version 2; the defaults are version 1's): a class
    token first or not, a LayerNorm (``ln_pre``) before the first block or not, how the
    stack's output is pooled into one row, and how that row is projected to ``dimensions``."""

    class_token: bool = True
    ln_pre: bool = False
    pooling: str = "class"
    projection: str = "linear"

    @classmethod
    def read(cls, cfg: Mapping[str, Any], where: str, poolings: Sequence[str], width: int, dimensions: int) -> Head:
        """The head of the tower config ``cfg``; ``poolings`` are those this tower can run."""
        head = cls(
            class_token=flag(cfg, "class_token", where, True),
            ln_pre=flag(cfg, "ln_pre", where, False),
            pooling=choice(cfg, "pooling", where, poolings, "class"),
            projection=choice(cfg, "projection", where, PROJECTIONS, "linear"),
        )
        if head.pooling == "class" and not head.class_token:
            raise CheckpointError(f"config field {where}.pooling: 'class' needs a class token, but class_token is false")
        if head.projection == "none" and width != dimensions:
            raise CheckpointError(f"config field {where}.projection: 'none' needs width {width} to equal dimensions {dimensions}")
        return head

    @property
    def first(self) -> int:
        """Positions before the tower's own tokens: 1 with a class token, else 0."""
        return int(self.class_token)


@dataclass(frozen=True)
class ModelConfig:
    """The fields every checkpoint has, plus each tower's raw config for its plugin."""

    dimensions: int
    context: int
    towers: Mapping[str, Mapping[str, Any]]
    choice_temperatures: tuple[float, ...]
    raw: Mapping[str, Any]
    version: int = 1
    # the checkpoint's other ``__metadata__`` entries (e.g. a tokenizer a tower reads), by key
    extras: Mapping[str, str] = field(default_factory=dict)

    @property
    def source(self) -> Mapping[str, Any] | None:
        """Where a converted model came from (version 2's ``source``), or None."""
        value = self.raw.get("source")
        return value if isinstance(value, dict) else None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> ModelConfig:
        text = metadata.get(METADATA_KEY)
        if text is None:
            raise CheckpointError(
                f'checkpoint has no config: __metadata__["{METADATA_KEY}"] is missing; a safetensors file of another '
                f"library (a Hugging Face model's, or one shard of it) is not a uform checkpoint: {CONVERT}"
            )
        try:
            raw = jsontext.loads(text, unique_keys=True)
        except jsontext.NotJSON as exc:
            raise CheckpointError(f'config in __metadata__["{METADATA_KEY}"] is not JSON ({exc})') from None
        if not isinstance(raw, dict):
            raise CheckpointError("config is not a JSON object")
        return cls.from_dict(raw, {k: v for k, v in metadata.items() if k != METADATA_KEY})

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], extras: Mapping[str, str] | None = None) -> ModelConfig:
        if raw.get("format") != FORMAT:
            raise CheckpointError(f"config field format: expected {FORMAT!r}, got {raw.get('format')!r}")
        version = integer(raw, "format_version", "", 1, 1 << 30)
        if version > FORMAT_VERSION:
            raise CheckpointError(
                f"config field format_version: {version} is newer than this uform reads "
                f"({FORMAT_VERSION}); upgrade uform"
            )
        for key in sorted(set(raw) - V1_FIELDS - V2_FIELDS):  # a misspelt field would else be left at its default
            known = ", ".join(sorted(V1_FIELDS | (V2_FIELDS if version >= 2 else set())))
            raise CheckpointError(f"config field {key}: not a field of the format (version {version}: {known})")
        towers = raw.get("towers")
        if not isinstance(towers, dict) or not towers or not all(isinstance(t, dict) for t in towers.values()):
            raise CheckpointError("config field towers: expected an object of tower configs, one at least")
        if version < 2:
            for key in sorted(V2_FIELDS & set(raw)):
                raise CheckpointError(f"config field {key}: needs format_version 2 (the file says {version})")
            for name, tower in towers.items():
                for key in sorted(V2_TOWER_FIELDS & set(tower)):
                    raise CheckpointError(f"config field towers.{name}.{key}: needs format_version 2 (the file says {version})")
        _check_source(raw.get("source"))
        _check_labels(raw.get("labels"))
        temps = raw.get("choice_temperatures", [1.0])
        if not isinstance(temps, list) or not temps:
            raise CheckpointError(f"config field choice_temperatures: expected a non-empty list, got {temps!r}")
        return cls(
            dimensions=integer(raw, "dimensions", "", 1, MAX_DIMENSIONS),
            context=integer(raw, "context", "", 1, MAX_CONTEXT),
            towers=towers,
            choice_temperatures=numbers(raw, "choice_temperatures", "", len(temps), 1e-3, 1e3)
            if "choice_temperatures" in raw
            else (1.0,),
            raw=raw,
            version=version,
            extras=dict(extras or {}),
        )

    def to_metadata(self) -> dict[str, str]:
        return {**self.extras, METADATA_KEY: json.dumps(self.raw, sort_keys=True, separators=(",", ":"))}


SOURCE_KEYS = ("family", "name", "architecture", "converter")


def _check_source(source: Any) -> None:
    """``source``: absent, or an object of strings (family, name, architecture, converter)."""
    if source is None:
        return
    if not isinstance(source, dict) or not all(isinstance(source.get(k, ""), str) for k in SOURCE_KEYS):
        raise CheckpointError(f"config field source: expected an object of strings ({', '.join(SOURCE_KEYS)}), got {source!r}")


def _check_labels(labels: Any) -> None:
    """``labels``: absent, or ``{"kind": "softmax" | "sigmoid", "scale": number, "bias": number}``."""
    if labels is None:
        return
    if not isinstance(labels, dict):
        raise CheckpointError(f"config field labels: expected an object, got {labels!r}")
    choice(labels, "kind", "labels", ("softmax", "sigmoid"), "")
    number(labels, "scale", "labels", 0.0, MAX_LABEL_SCALE)
    if "bias" in labels:
        number(labels, "bias", "labels", -1e6, 1e6)


def make_config(
    dimensions: int,
    context: int,
    towers: Mapping[str, Mapping[str, Any]],
    choice_temperatures: Sequence[float] = (1.0,),
    format_version: int = WRITTEN_VERSION,
    extra: Mapping[str, Any] | None = None,
    extras: Mapping[str, str] | None = None,
) -> ModelConfig:
    """Build and check a config the way a checkpoint would carry it: ``extra`` adds top-level
    fields (version 2's ``source``, ``labels``), ``extras`` other ``__metadata__`` entries
    (version 2's ``tokenizer``)."""
    raw = {
        "format": FORMAT,
        "format_version": format_version,
        "dimensions": dimensions,
        "context": context,
        "towers": {name: dict(cfg) for name, cfg in towers.items()},
        "choice_temperatures": [float(t) for t in choice_temperatures],
        **(extra or {}),
    }
    return ModelConfig.from_dict(raw, extras)
