"""state_hash: one digest of a model's weights, stable across save and load."""

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's elements in row-major order, native byte order (any dtype, bf16 included)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else b""


def state_hash(obj: nn.Module | Mapping[str, Any]) -> str:
    """sha256 over every state dict entry: key, shape, dtype and raw bytes, keys in sorted order.

    Each entry contributes ``f"{key}{tuple(shape)}{dtype}"`` (UTF-8) then its raw bytes.
    A model hashes its ``state_dict()``, so a FasterModel's keys carry the ``net.`` prefix.
    """
    state = obj.state_dict() if isinstance(obj, nn.Module) else obj
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {key!r} is a {type(tensor).__name__}, not a tensor")
        digest.update(f"{key}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(_raw_bytes(tensor))
    return digest.hexdigest()
