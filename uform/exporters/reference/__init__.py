"""The PyTorch reference of the uform architecture: for parity tests, training and export.

Never imported by the runtime. ``ReferenceModel.from_checkpoint(path)`` builds the towers a
checkpoint holds and loads its tensors strictly (state-dict keys are the tensor names).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from uform.core.config import V2_TOWER_FIELDS, ModelConfig
from uform.core.errors import UnsupportedError

# tower name → "module:Class" of its reference; a new tower adds one line.
TOWERS: dict[str, str] = {
    "audio": "uform.exporters.reference.audio:AudioTower",
    "text": "uform.exporters.reference.text:TextTower",
    "image": "uform.exporters.reference.image:ImageTower",
    "video": "uform.exporters.reference.video:VideoTower",
    "decoder": "uform.exporters.reference.decoder:DecoderTower",
}


def tower_class(name: str) -> type[nn.Module]:
    module, _, cls = TOWERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


class ReferenceModel(nn.Module):
    """Every tower of a checkpoint as PyTorch modules, in ``self.towers[name]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        for name, cfg in config.towers.items():  # the reference is version 1's math: a converted model's options it does not have
            used = sorted(V2_TOWER_FIELDS & set(cfg))
            if used:
                raise UnsupportedError(
                    f"the PyTorch reference implements checkpoint format version 1; tower {name!r} uses version 2's {', '.join(used)} "
                    "(the runtime and `uform export` serve such a file)"
                )
        self.config = config
        self.towers = nn.ModuleDict({name: tower_class(name)(cfg, config) for name, cfg in config.towers.items() if name in TOWERS})

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> ReferenceModel:
        with safe_open(os.fspath(path), framework="pt") as f:
            config = ModelConfig.from_metadata(f.metadata() or {})
            tensors = {k: f.get_tensor(k).to(dtype) for k in f.keys()}
        model = cls(config).to(dtype)
        state = {f"towers.{k}": v for k, v in tensors.items() if k.split(".", 1)[0] in model.towers}
        model.load_state_dict(state, strict=True)
        return model.eval()

    def forward(self, *args: Any) -> Any:  # pragma: no cover - towers are called directly
        raise TypeError("call a tower: model.towers['text'].encode([...])")
