"""A dataset at once: :func:`plan` spreads the work over a cluster's resources (actors, threads,
GPUs, batch size), :func:`encode_dataset` maps a column through :class:`Encoder` actors, and
:func:`count_errors` counts what came back (docs/scale.md)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

import ray  # uform/ray/__init__.py imported it first, or said what installs it

from ..core.types import Outputs, Scalar
from .encoder import CheckpointSource, Encoder, refuse_modality

if TYPE_CHECKING:
    from ray.data import Dataset

__all__ = ["Plan", "RowCounts", "count_errors", "encode_dataset", "plan"]

@dataclasses.dataclass(frozen=True)
class Plan:
    """How :func:`encode_dataset` spreads the work: ``actors``, each running ``threads``
    threads and ``gpus`` GPUs while asking Ray for ``cpus`` logical CPUs, over batches of
    ``batch_size`` rows."""

    actors: int
    threads: int
    gpus: float
    batch_size: int
    cpus: float

    @property
    def placement(self) -> str:
        return "vram" if self.gpus else "ram"


def plan(
    resources: Mapping[str, float],
    *,
    actors: int | None = None,
    threads_per_actor: int | None = None,
    gpus_per_actor: float | None = None,
    cpus_per_actor: float | None = None,
    batch_size: int | None = None,
) -> Plan:
    """The plan for a cluster with ``resources`` (``ray.cluster_resources()``).

    With GPUs: one actor per GPU, each with a fair share of the CPUs for decoding, batches of
    256. Without: single-threaded actors on every CPU (rows are independent, and one thread
    per model wastes nothing on synchronisation: measured in docs/scale.md), batches of 64.
    Each actor asks Ray for half the CPUs it runs on: a pool holding every logical CPU
    leaves none to the reads feeding it, and the pipeline hangs. Any argument given is
    kept; the others are chosen around it.
    """
    cpus = max(1, int(resources.get("CPU", 1)))
    gpus = int(resources.get("GPU", 0))
    if gpus_per_actor is None:
        gpus_per_actor = 1.0 if gpus else 0.0
    if gpus_per_actor:
        actors = actors or max(1, int(gpus / gpus_per_actor))
        threads = threads_per_actor or max(1, cpus // actors)
        size = batch_size or 256
    else:
        threads = threads_per_actor or (max(1, cpus // actors) if actors else 1)
        actors = actors or max(1, cpus // threads)
        size = batch_size or 64
    return Plan(actors, threads, gpus_per_actor, size, threads / 2 if cpus_per_actor is None else cpus_per_actor)


def encode_dataset(
    ds: Dataset,
    column: str,
    modality: str,
    checkpoint: CheckpointSource,
    *,
    outputs: Outputs = Outputs.EMBEDDINGS,
    outputs_scalar: Scalar | str = Scalar.F32,
    dimensions: int | None = None,
    sample_rate: int | None = None,
    quantization: Scalar | str = Scalar.BF16,
    actors: int | None = None,
    threads_per_actor: int | None = None,
    gpus_per_actor: float | None = None,
    cpus_per_actor: float | None = None,
    batch_size: int | None = None,
    preserve_order: bool = False,
    output_column: str = "embedding",
    tokens_column: str = "tokens",
    error_column: str = "error",
    encoder: type[Encoder] = Encoder,
) -> Dataset:
    """``ds`` with ``column`` encoded: a lazy Dataset (``.materialize()``, ``.write_parquet()``, ...).

    Actors, threads, GPUs and batch size come from :func:`plan` over
    ``ray.cluster_resources()`` unless given. A checkpoint given as bytes is put into the
    object store once and fetched by each node; a path must be readable on every node.
    ``preserve_order=True`` sets ``preserve_order`` in the DataContext of ``ds`` (shared by
    the datasets derived from the same source); without it rows may come back in another
    order, with their columns, so key them by an id column. Reference: docs/scale.md.
    """
    refuse_modality(modality)
    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    p = plan(resources, actors=actors, threads_per_actor=threads_per_actor, gpus_per_actor=gpus_per_actor,
             cpus_per_actor=cpus_per_actor, batch_size=batch_size)
    if isinstance(checkpoint, (bytes, bytearray, memoryview)):
        checkpoint = ray.put(bytes(checkpoint))
    kwargs = dict(
        checkpoint=checkpoint, modality=modality, column=column, outputs=outputs, outputs_scalar=outputs_scalar,
        dimensions=dimensions, sample_rate=sample_rate, quantization=quantization, placement=p.placement,
        threads=p.threads, output_column=output_column, tokens_column=tokens_column, error_column=error_column,
    )  # fmt: skip
    if preserve_order:
        ds.context.execution_options.preserve_order = True
    return ds.map_batches(
        encoder,
        fn_constructor_kwargs=kwargs,
        batch_size=p.batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=p.actors),
        num_cpus=p.cpus,
        num_gpus=p.gpus or None,
    )


@dataclasses.dataclass(frozen=True)
class RowCounts:
    """Rows seen, rows encoded, rows that carry an error, and those errors by type."""

    rows: int
    encoded: int
    failed: int
    errors: dict[str, int]


def count_errors(ds: Dataset, error_column: str = "error") -> RowCounts:
    """Counts the rows of an encoded dataset and its errors by type, reading ``error_column``
    alone. On a lazy dataset this runs the pipeline: count a materialized one, or the
    written files read back."""
    rows = 0
    errors: Counter[str] = Counter()
    for batch in ds.select_columns([error_column]).iter_batches(batch_format="numpy", batch_size=65536):
        column = batch[error_column]
        rows += len(column)
        errors.update(str(e).split(":", 1)[0] for e in column if e)
    failed = sum(errors.values())
    return RowCounts(rows, rows - failed, failed, dict(errors))
