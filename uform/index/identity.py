"""What an index is, apart from where it is kept: its format, the model that made its vectors,
the layout of a stored row, the modality a kind byte names, and the errors it raises."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..core.errors import UformError
from ..core.types import Scalar

FORMAT = "uform-index/1"
MODALITIES = ("text", "image", "video", "audio")  # a slot's kind byte is the position here
SCALARS = (Scalar.F32, Scalar.F16, Scalar.BF16, Scalar.I8, Scalar.B1)


class IndexFormatError(UformError, ValueError):
    """Not a uform index, an index of another format version, or a damaged one."""


class IndexModelError(UformError, ValueError):
    """The index was made by another model (checkpoint, quantization or scalar) than the one given."""


class IndexBusyError(UformError):
    """Another writer is updating the index."""


@dataclass(frozen=True)
class Identity:
    """What made an index's vectors: rows of two identities are never compared."""

    checkpoint_sha256: str
    checkpoint: str  # the checkpoint's path when the index was made, for messages
    quantization: str
    dimensions: int
    scalar: str

    def describe(self) -> str:
        dimensions = f"{self.dimensions} dimensions, " if self.dimensions else ""
        return f"{self.checkpoint} (sha256 {self.checkpoint_sha256[:12]}…, {self.quantization} weights, {dimensions}{self.scalar} vectors)"


@dataclass(frozen=True)
class Entry:
    """One indexed item as :meth:`Index.entries` yields it."""

    path: str
    modality: str
    hash: str  # hex BLAKE2b-128 of the file's bytes (a text's UTF-8)
    size: int | None  # None for a text
    mtime_ns: int | None  # -1 when the file changed while it was read; None for a text
    text: str | None
    embedding: np.ndarray  # a row of the index's scalar (I8: the int8 values; scales via embedding_scale)
    embedding_scale: float | None


def checkpoint_digest(path: Path) -> str:
    """SHA-256 of a checkpoint file (the model's identity in an index)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def row_dtype(scalar: Scalar, dimensions: int) -> np.dtype[Any]:
    """One stored row: the vector in ``scalar`` (I8 with its float32 scale after it; B1 packed bits)."""
    if scalar is Scalar.F32:
        return np.dtype((np.float32, (dimensions,)))
    if scalar is Scalar.F16:
        return np.dtype((np.float16, (dimensions,)))
    if scalar is Scalar.BF16:
        return np.dtype((ml_dtypes.bfloat16, (dimensions,)))
    if scalar is Scalar.I8:
        return np.dtype([("q", np.int8, (dimensions,)), ("s", "<f4")])
    if scalar is Scalar.B1:
        return np.dtype((np.uint8, ((dimensions + 7) // 8,)))
    raise ValueError(f"an index stores F32, F16, BF16, I8 or B1 vectors; got {scalar.name}")


def kind_of(modality: str) -> int:
    """A modality's kind byte (its position in ``MODALITIES``); ``ValueError`` for another name."""
    if modality not in MODALITIES:
        raise ValueError(f"modalities must name text, image, video or audio; got {modality!r}")
    return MODALITIES.index(modality)
