"""The index's way out (and in): Parquet, one row an item, read by Spark, Ray, LanceDB, Qdrant,
pgvector loaders and pandas without glue. Needs ``pyarrow`` (``pip install 'uform[index]'``).

Columns (``schema(dimensions)``): ``path`` (a file's absolute path, a text's key), ``modality``
(``text``, ``image``, ``video``, ``audio``), ``hash`` (hex BLAKE2b-128 of the file's bytes or
the text's UTF-8), ``model`` (hex SHA-256 of the checkpoint), ``quantization`` (the weights'
scalar: ``bf16``, ``e4m3``, ``f32``), ``embedding`` (``fixed_size_list<float>[dimensions]``, the
stored row widened to float32; a B1 index: ``fixed_size_list<uint8>`` of packed sign bits),
``text`` (a text item's text, else null). ``uform.ray.index_rows`` writes the same columns.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import files
from ..core.types import Scalar
from .identity import FORMAT, MODALITIES, Entry, Identity, checkpoint_digest

if TYPE_CHECKING:
    import pyarrow as pa
    from ray.data import Dataset

BATCH = 1 << 15


def arrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ImportError("Parquet needs pyarrow: pip install 'uform[index]' (or pyarrow)") from None
    return pyarrow


def schema(dimensions: int, scalar: Scalar | str = Scalar.F32) -> pa.Schema:
    """The columns of an exported index (a B1 index's ``embedding`` holds packed bits)."""
    pa = arrow()
    bits = Scalar(scalar) is Scalar.B1
    embedding = pa.list_(pa.uint8(), (dimensions + 7) // 8) if bits else pa.list_(pa.float32(), dimensions)
    return pa.schema([
        ("path", pa.string()), ("modality", pa.string()), ("hash", pa.string()), ("model", pa.string()),
        ("quantization", pa.string()), ("embedding", embedding), ("text", pa.string()),
    ], metadata={"uform.format": FORMAT, "uform.dimensions": str(dimensions), "uform.scalar": Scalar(scalar).value})  # fmt: skip


def is_export(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a Parquet file of this schema (an export, or ``index_rows`` output):
    its footer's metadata names ``uform.format``. Only the footer is read."""
    pa = arrow()
    try:
        metadata = pa.parquet.read_schema(path).metadata or {}
    except (OSError, ValueError, pa.ArrowException):  # not Parquet, or unreadable
        return False
    return b"uform.format" in metadata


def table(paths: list[str], modalities: list[str], hashes: list[str], model: str, quantization: str,
          embeddings: np.ndarray, texts: list[str | None], scalar: Scalar | str = Scalar.F32) -> pa.Table:  # fmt: skip
    """Rows of the schema; ``embeddings`` float32 ``[n, dimensions]`` (B1: packed uint8 ``[n, bytes]``)."""
    pa = arrow()
    bits = Scalar(scalar) is Scalar.B1
    dimensions = embeddings.shape[1] * (8 if bits else 1) if embeddings.ndim == 2 else 0
    s = schema(dimensions, scalar)
    flat = np.ascontiguousarray(embeddings, np.uint8 if bits else np.float32).reshape(-1)
    column = pa.FixedSizeListArray.from_arrays(pa.array(flat), embeddings.shape[1])
    n = len(paths)
    return pa.Table.from_arrays([pa.array(paths, pa.string()), pa.array(modalities, pa.string()), pa.array(hashes, pa.string()),
                                 pa.array([model] * n, pa.string()), pa.array([quantization] * n, pa.string()), column,
                                 pa.array(texts, pa.string())], schema=s)  # fmt: skip


def widen(rows: np.ndarray, scalar: Scalar) -> np.ndarray:
    """Stored rows as the ``embedding`` column holds them: float32 (I8: ``q * s``), B1 as its bits."""
    if scalar is Scalar.B1:
        return np.asarray(rows, np.uint8)
    if scalar is Scalar.I8:
        return np.asarray(rows["q"].astype(np.float32) * rows["s"][:, None], np.float32)
    return np.asarray(rows, np.float32)


def write_index(entries: Iterable[Entry], identity: Identity, path: str | os.PathLike[str]) -> int:
    """Write ``entries`` (an index's, of one snapshot) to the Parquet file ``path``, whole or not at
    all (:mod:`uform.core.files`; :class:`~uform.core.files.OutputError` names ``path``); answer the rows."""
    pa = arrow()
    scalar = Scalar(identity.scalar)
    s = schema(identity.dimensions, scalar)
    s = s.with_metadata({**s.metadata, b"uform.checkpoint": os.path.basename(identity.checkpoint).encode()})
    rows = 0
    with files.Outputs() as out, out.open(path) as f, pa.parquet.ParquetWriter(f, s) as writer:  # whole or not at all
        batch: list[Entry] = []
        for entry in entries:
            batch.append(entry)
            if len(batch) == BATCH:
                rows += _write(writer, batch, identity, s)
                batch = []
        if batch or not rows:
            rows += _write(writer, batch, identity, s)
    return rows


def _write(writer: Any, entries: list[Entry], identity: Identity, s: pa.Schema) -> int:
    scalar = Scalar(identity.scalar)
    width = (identity.dimensions + 7) // 8 if scalar is Scalar.B1 else identity.dimensions
    if scalar is Scalar.I8:
        vectors = np.array([e.embedding.astype(np.float32) * (e.embedding_scale or 0.0) for e in entries], np.float32).reshape(-1, width)
    else:
        vectors = np.array([e.embedding for e in entries]).reshape(-1, width)
        vectors = vectors if scalar is Scalar.B1 else vectors.astype(np.float32)
    t = table([e.path for e in entries], [e.modality for e in entries], [e.hash for e in entries], identity.checkpoint_sha256,
              identity.quantization, vectors, [e.text for e in entries], scalar)  # fmt: skip
    writer.write_table(t.cast(s))
    return len(entries)


def ray_batch(batch: dict[str, np.ndarray], *, path_column: str, column: str, modality: str, model: str, quantization: str,
              output_column: str, error_column: str) -> pa.Table:  # fmt: skip
    """An encoded Ray batch (``uform.ray.Encoder``'s output, F32) as rows of the schema; rows
    carrying an error are left out. A file is hashed from its path, or from the bytes given."""
    from .sources import digest

    keep = [i for i, e in enumerate(batch[error_column]) if not e]
    paths: list[str] = []
    hashes: list[str] = []
    texts: list[str | None] = []
    for i in keep:
        value = batch[column][i]
        value = value.item() if isinstance(value, np.generic) else value
        if modality == "text":
            data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            texts.append(data.decode("utf-8", "replace"))
        else:
            data = bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else open(value, "rb").read()
            texts.append(None)
        hashes.append(digest(data).hex())
        path = batch[path_column][i]
        paths.append(str(path.item() if isinstance(path, np.generic) else path))
    embeddings = np.asarray(batch[output_column], np.float32)[keep].reshape(len(keep), -1)
    if modality not in MODALITIES:
        raise ValueError(f"an index holds text, image, video or audio items; got {modality!r}")
    return table(paths, [modality] * len(keep), hashes, model, quantization, embeddings, texts)


def index_rows(ds: Dataset, column: str, modality: str, checkpoint: str | os.PathLike[str], *, path_column: str | None = None,
               quantization: Scalar | str = Scalar.BF16, output_column: str = "embedding", error_column: str = "error") -> Dataset:  # fmt: skip
    """``uform.ray.index_rows``: :func:`uform.ray.encode_dataset`'s output (F32 embeddings) as rows of
    this schema (``path`` from ``path_column``, default ``column``; failed rows left out), lazily:
    ``.write_parquet(dir)``, then ``Index.import_parquet(dir)`` or ``uform index --import-parquet
    dir`` on any machine."""
    from ..core.scalars import coerce

    kwargs = dict(path_column=path_column or column, column=column, modality=modality, model=checkpoint_digest(Path(checkpoint)),
                  quantization=coerce(quantization, "quantization").value, output_column=output_column, error_column=error_column)  # fmt: skip
    return ds.map_batches(ray_batch, fn_kwargs=kwargs, batch_format="numpy")  # type: ignore[arg-type]
