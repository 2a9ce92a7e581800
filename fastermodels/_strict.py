"""All-or-nothing loading: check every key and shape before a single tensor is copied."""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fastermodels._errors import WeightsMismatchError

_SHOWN = 8  # entries listed per kind of mismatch


def _listing(label: str, items: list[str]) -> str:
    more = f", … {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return f"{label} ({len(items)}): {', '.join(items[:_SHOWN])}{more}"


def _same_kind(weights: torch.dtype, model: torch.dtype) -> bool:
    """Whether an entry of dtype ``weights`` may load into a tensor of dtype ``model``: a floating
    one takes any floating dtype (an fp16 net loads as fp16), any other only its own (an int64
    weight in a Linear, or a float num_batches_tracked, is not a weight of this model)."""
    return weights == model or (weights.is_floating_point and model.is_floating_point)


def check_state_dict(module: nn.Module, state_dict: Mapping[str, Any]) -> None:
    """Raise `WeightsMismatchError` unless ``state_dict`` has exactly ``module``'s keys and shapes,
    and a dtype of the kind of each of its tensors (:func:`_same_kind`)."""
    own = module.state_dict()
    missing = sorted(own.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - own.keys())
    shapes = [
        f"{k} (weights {tuple(getattr(state_dict[k], 'shape', ()))}, model {tuple(own[k].shape)})"
        for k in sorted(own.keys() & state_dict.keys())
        if tuple(getattr(state_dict[k], "shape", ())) != tuple(own[k].shape)
    ]
    dtypes = [
        f"{k} (weights {state_dict[k].dtype}, model {own[k].dtype})"
        for k in sorted(own.keys() & state_dict.keys())
        if isinstance(state_dict[k], torch.Tensor) and not _same_kind(state_dict[k].dtype, own[k].dtype)
    ]
    problems = [_listing(label, items) for label, items in
                (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes),
                 ("dtype mismatch", dtypes))
                if items]
    if problems:
        raise WeightsMismatchError(
            "the weights disagree with the model rebuilt from its source and spec, so nothing was "
            "loaded; " + "; ".join(problems) + ". The spec records exactly nn.Conv2d, nn.Linear, "
            "nn.BatchNorm1d and nn.BatchNorm2d leaves: a changed layer of another type cannot be rebuilt")
