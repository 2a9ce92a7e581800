"""Batch encoding on Ray Data: one :class:`~uform.Model` per actor, loaded once.

``pip install 'uform[ray]'``. This package is the only part of uform that imports ``ray``;
``import uform`` never does. Guide and reference: docs/scale.md. Every row keeps the columns it came
with (an id column ties a result to its input; ``preserve_order=True`` keeps the order too)
and gains an embedding, or — for an item the model refuses, a corrupt file among millions —
an error ``"Type: message"`` and no embedding: one bad row never fails the batch, nor the job.
:func:`index_rows` turns the result into rows of an index's Parquet schema (docs/index.md).
The actor is encoder.py; a dataset at once (plan, encode_dataset, count_errors) dataset.py.
"""

from __future__ import annotations

try:
    import ray  # the one package of uform that imports ray (the optional extra uform[ray])
except ModuleNotFoundError as exc:  # Python's words name no way out: say the extra that installs it
    if exc.name != "ray":
        raise
    raise ModuleNotFoundError("uform.ray needs Ray Data, which is not installed: pip install 'uform[ray]' (ray[data] >= 2.51)",
                              name="ray") from None  # fmt: skip

from ..index.parquet import index_rows  # encode_dataset's output as rows of an index's Parquet schema
from .dataset import Plan, RowCounts, count_errors, encode_dataset, plan
from .encoder import MODALITIES, CheckpointSource, Encoder

__all__ = ["MODALITIES", "Encoder", "Plan", "RowCounts", "count_errors", "encode_dataset", "index_rows", "plan"]
