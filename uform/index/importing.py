"""Parquet rows into an index (``Index.import_parquet``, ``uform index --import-parquet``): every
file, row and column checked before any row is added, each refusal naming the file, the row
(counted from 0, as pyarrow and pandas count) and the column.

A file is read as parquet.py's schema writes it, and as pandas and Spark write the same columns:
``embedding`` a ``fixed_size_list`` or a variable ``list`` of floats (of bytes for a B1 index),
each row the index's width. Refused: a column missing or of another type, a null, a modality
that is none, a hash that is not 32 hexadecimal digits, a path twice, another model's rows
(:class:`IndexModelError`), an embedding that is not finite or not a unit vector (its norm
further than ``TOLERANCE`` from 1: rows are stored as they are, never normalised).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..core.types import Scalar
from .identity import MODALITIES, IndexModelError, kind_of
from .parquet import BATCH, arrow
from .records import Chunk, Insert
from .store import Store

STRINGS = ("path", "modality", "hash", "model", "quantization")  # text too, where present
TOLERANCE = 0.02  # |norm - 1| of an exported row widened from F16, BF16 or I8 is under 0.005
HEX = re.compile(r"[0-9a-fA-F]{32}")


class ParquetError(ValueError):
    """A Parquet file an index will not import, named with the row and column where it applies."""


def files(path: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files of ``path`` (a file, or a folder's ``*.parquet`` files, in name order)."""
    p = Path(path)
    if p.is_dir():
        found = sorted(f for f in p.rglob("*.parquet") if f.is_file())
        if not found:
            raise ParquetError(f"{p}: a folder with no .parquet file")
        return found
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file or folder")
    return [p]


def batches(file: Path, dimensions: int, scalar: Scalar) -> Iterator[tuple[int, dict[str, Any]]]:
    """(first row, columns) of ``file`` a batch at a time, checked: strings as lists, ``embedding``
    as a 2-D array of the index's width (float32; B1: uint8)."""
    pa = arrow()
    import pyarrow.compute as pc

    try:
        reader = pa.parquet.ParquetFile(file)
    except (OSError, pa.ArrowException) as exc:
        raise ParquetError(f"{file}: not a Parquet file ({exc})") from None
    types = {f.name: f.type for f in reader.schema_arrow}
    for name in (*STRINGS, "embedding"):
        if name not in types:
            raise ParquetError(f"{file}: no column {name!r} (an index's Parquet has path, modality, hash, model, quantization, embedding, text)")
    for name in (*STRINGS, "text"):
        if name in types and not (pa.types.is_string(types[name]) or pa.types.is_large_string(types[name]) or pa.types.is_null(types[name])):
            raise ParquetError(f"{file}: column {name!r} holds {types[name]}, not strings")
    bits = scalar is Scalar.B1
    width = (dimensions + 7) // 8 if bits else dimensions
    kind = types["embedding"]
    if not (pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not (
        pa.types.is_uint8(kind.value_type) if bits else pa.types.is_floating(kind.value_type)
    ):
        raise ParquetError(f"{file}: column 'embedding' holds {kind}, not lists of {'bytes (uint8)' if bits else 'floats'}")
    first = 0
    for batch in reader.iter_batches(batch_size=BATCH):
        out: dict[str, Any] = {}
        for name in (*STRINGS, "text", "embedding"):
            if name not in types:
                out[name] = [None] * batch.num_rows
                continue
            column = batch.column(name)
            if name != "text" and column.null_count:
                raise ParquetError(f"{file}: row {first + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])}: {name} is null")
            out[name] = column if name == "embedding" else column.to_pylist()
        column = out["embedding"]
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero(lengths != width)
        if len(wrong):
            raise ParquetError(f"{file}: row {first + int(wrong[0])}: embedding has {int(lengths[wrong[0]])} values; "
                               f"the index's rows have {width}")  # fmt: skip
        values = column.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
        out["embedding"] = values.astype(np.uint8 if bits else np.float32)
        check(file, first, out, bits)
        yield first, out
        first += batch.num_rows


def check(file: Path, first: int, out: dict[str, Any], bits: bool) -> None:
    for i, (modality, h) in enumerate(zip(out["modality"], out["hash"], strict=True)):
        if modality not in MODALITIES:
            raise ParquetError(f"{file}: row {first + i}: modality {modality!r} is none of text, image, video, audio")
        if not HEX.fullmatch(h):
            raise ParquetError(f"{file}: row {first + i}: hash {h[:40]!r} is not 32 hexadecimal digits (BLAKE2b-128)")
    if bits:
        return
    rows = out["embedding"]
    with np.errstate(all="ignore"):
        norms = np.sqrt(np.einsum("ij,ij->i", rows.astype(np.float64), rows.astype(np.float64)))
    bad = np.flatnonzero(~(np.abs(norms - 1) <= TOLERANCE))
    if len(bad):
        row = rows[bad[0]]
        why = "is not finite" if not np.isfinite(row).all() else f"is not a unit vector (norm {norms[bad[0]]:.6g})"
        raise ParquetError(f"{file}: row {first + int(bad[0])}: embedding {why}; an index holds the model's unit embeddings")


def import_rows(store: Store, path: str | os.PathLike[str]) -> int:
    """Check every file of ``path``, then add their rows a batch a commit (Store.commit); a path
    already holding the same hash is kept. Answers the rows added."""
    identity = store.identity
    mine = (identity.checkpoint_sha256, identity.quantization)
    scalar = Scalar(identity.scalar)
    found = files(path)
    seen: dict[str, tuple[Path, int]] = {}
    for file in found:  # every refusal before anything is written
        for first, batch in batches(file, identity.dimensions, scalar):
            for i, (p, model, q) in enumerate(zip(batch["path"], batch["model"], batch["quantization"], strict=True)):
                if (model, q) != mine:
                    raise IndexModelError(f"{file}: row {first + i} holds an embedding of the checkpoint with SHA-256 {model} ({q} weights); "
                                          f"{store.folder} is of {identity.describe()}")  # fmt: skip
                if p in seen:
                    raise ParquetError(f"{file}: row {first + i}: path {p!r} again (first at {seen[p][0]} row {seen[p][1]})")
                seen[p] = (file, first + i)
    from .update import store_rows

    with store.snapshot():
        known = store.hashes()
    added = 0
    for file in found:
        for _, batch in batches(file, identity.dimensions, scalar):
            keep = [i for i, (p, h) in enumerate(zip(batch["path"], batch["hash"], strict=True)) if known.get(p) != bytes.fromhex(h)]
            if not keep:
                continue
            vectors = batch["embedding"][keep]
            rows = vectors.view(store.dtype).reshape(-1) if scalar is Scalar.B1 else store_rows(vectors, store)
            inserts = [Insert(batch["path"][i], None, None, bytes.fromhex(batch["hash"][i]), batch["text"][i], kind_of(batch["modality"][i]))
                       for i in keep]  # fmt: skip
            store.commit(Chunk(rows, inserts))
            known.update((i.path, i.hash) for i in inserts)
            added += len(keep)
    return added
