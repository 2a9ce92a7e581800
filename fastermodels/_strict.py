"""All-or-nothing loading: check every key and shape before a single tensor is copied."""

from collections.abc import Mapping
from typing import Any

from torch import nn

from fastermodels._errors import WeightsMismatchError

_SHOWN = 8  # entries listed per kind of mismatch


def _listing(label: str, items: list[str]) -> str:
    more = f", … {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return f"{label} ({len(items)}): {', '.join(items[:_SHOWN])}{more}"


def check_state_dict(module: nn.Module, state_dict: Mapping[str, Any]) -> None:
    """Raise `WeightsMismatchError` unless ``state_dict`` has exactly ``module``'s keys and shapes."""
    own = module.state_dict()
    missing = sorted(own.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - own.keys())
    shapes = [
        f"{k} (weights {tuple(getattr(state_dict[k], 'shape', ()))}, model {tuple(own[k].shape)})"
        for k in sorted(own.keys() & state_dict.keys())
        if tuple(getattr(state_dict[k], "shape", ())) != tuple(own[k].shape)
    ]
    problems = [_listing(label, items) for label, items in
                (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes))
                if items]
    if problems:
        raise WeightsMismatchError(
            "the weights disagree with the model rebuilt from its source and spec, so nothing was "
            "loaded; " + "; ".join(problems) + ". The spec records exactly nn.Conv2d, nn.Linear, "
            "nn.BatchNorm1d and nn.BatchNorm2d leaves: a changed layer of another type cannot be rebuilt")
