"""The training recipe of the default model (PyTorch: the ``uform[train]`` extra).

``python -m uform.training --out PATH --seed 0`` generates its data procedurally
(:mod:`uform.demo.generate`), trains every tower, then the byte decoder alone (its own phase;
``--phase decoder --from CHECKPOINT`` runs it alone), fits the choice temperatures and writes a
checkpoint; docs/training.md describes the data, the recipe and the figures it reached.
"""

from __future__ import annotations

from .recipe import train
from .settings import Result, Settings, default_config

__all__ = ["Result", "Settings", "default_config", "train"]
