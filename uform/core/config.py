"""The checkpoint's config (JSON in ``__metadata__["uform"]``) and the checks every field gets.

The core checks the fields every checkpoint has; each tower's own fields are checked by the
plugin that owns the tower, with the helpers here, so every error names the field's path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError

FORMAT = "uform"
FORMAT_VERSION = 1
METADATA_KEY = "uform"
LAYER_NORM_EPS = 1e-5

# Bounds that keep a hostile config from asking for absurd allocations.
MAX_WIDTH = 16384
MAX_DEPTH = 256
MAX_HEADS = 256
MAX_CONTEXT = 65536
MAX_DIMENSIONS = 65536


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


@dataclass(frozen=True)
class Geometry:
    """A transformer stack: residual width, blocks, attention heads, MLP hidden width."""

    width: int
    depth: int
    heads: int
    mlp_width: int

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
        )
        if width % geometry.heads:
            raise CheckpointError(f"config field {where}.heads: {geometry.heads} does not divide width {width}")
        return geometry

    def as_dict(self) -> dict[str, int]:
        return {"width": self.width, "depth": self.depth, "heads": self.heads, "mlp_width": self.mlp_width}


@dataclass(frozen=True)
class ModelConfig:
    """The fields every checkpoint has, plus each tower's raw config for its plugin."""

    dimensions: int
    context: int
    towers: Mapping[str, Mapping[str, Any]]
    choice_temperatures: tuple[float, ...]
    raw: Mapping[str, Any]

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> ModelConfig:
        text = metadata.get(METADATA_KEY)
        if text is None:
            raise CheckpointError(f'checkpoint has no config: __metadata__["{METADATA_KEY}"] is missing')
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f'config in __metadata__["{METADATA_KEY}"] is not JSON ({exc})') from None
        except RecursionError:
            raise CheckpointError(f'config in __metadata__["{METADATA_KEY}"] is nested too deeply') from None
        if not isinstance(raw, dict):
            raise CheckpointError("config is not a JSON object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ModelConfig:
        if raw.get("format") != FORMAT:
            raise CheckpointError(f"config field format: expected {FORMAT!r}, got {raw.get('format')!r}")
        version = integer(raw, "format_version", "", 1, 1 << 30)
        if version > FORMAT_VERSION:
            raise CheckpointError(
                f"config field format_version: {version} is newer than this uform reads "
                f"({FORMAT_VERSION}); upgrade uform"
            )
        towers = raw.get("towers")
        if not isinstance(towers, dict) or not towers or not all(isinstance(t, dict) for t in towers.values()):
            raise CheckpointError("config field towers: expected an object of tower configs, one at least")
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
        )

    def to_metadata(self) -> dict[str, str]:
        return {METADATA_KEY: json.dumps(self.raw, sort_keys=True, separators=(",", ":"))}


def make_config(
    dimensions: int,
    context: int,
    towers: Mapping[str, Mapping[str, Any]],
    choice_temperatures: Sequence[float] = (1.0,),
) -> ModelConfig:
    """Build and check a config the way a checkpoint would carry it."""
    raw = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dimensions": dimensions,
        "context": context,
        "towers": {name: dict(cfg) for name, cfg in towers.items()},
        "choice_temperatures": [float(t) for t in choice_temperatures],
    }
    return ModelConfig.from_dict(raw)
