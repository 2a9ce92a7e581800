"""Output scalars: how float32 rows are stored as F32, F16, BF16, E4M3, E5M2, I8 or B1.

* F32, F16, BF16, E4M3, E5M2: a plain cast of each value (round to nearest even; unit
  rows never exceed any of these ranges). Compare rows by dot product after casting to F32.
* I8: each row ``x`` is stored as ``q = rint(x / s)`` with ``s = max|x| / 127`` kept in
  the row's scale. ``dot(qa, qb) * sa * sb`` approximates ``dot(a, b)``.
* B1: the sign bits, ``x > 0``, packed 8 to a byte, most significant bit first
  (``numpy.packbits``). Compare rows by Hamming distance ``h`` (popcount of XOR);
  ``cos(pi * h / width)`` approximates their cosine.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .types import Scalar

_CASTS: dict[Scalar, Any] = {
    Scalar.F32: np.float32,
    Scalar.F16: np.float16,
    Scalar.BF16: ml_dtypes.bfloat16,
    Scalar.E4M3: ml_dtypes.float8_e4m3fn,
    Scalar.E5M2: ml_dtypes.float8_e5m2,
}


def coerce(value: Any, what: str = "outputs_scalar") -> Scalar:
    """``value`` as a :class:`Scalar`, accepting the enum or its string value."""
    try:
        return Scalar(value)
    except ValueError:
        names = ", ".join(s.name for s in Scalar)
        raise ValueError(f"{what} must be one of {names}; got {value!r}") from None


def layout(scalar: Scalar, rows: int, width: int) -> tuple[tuple[int, ...], np.dtype[Any], bool]:
    """Shape and dtype of ``rows`` stored rows of ``width`` values, and whether they carry scales."""
    if scalar is Scalar.B1:
        return (rows, (width + 7) // 8), np.dtype(np.uint8), False
    if scalar is Scalar.I8:
        return (rows, width), np.dtype(np.int8), True
    return (rows, width), np.dtype(_CASTS[scalar]), False


def store(source: np.ndarray, scalar: Scalar, out: np.ndarray, scales: np.ndarray | None) -> None:
    """Write float32 rows ``source`` [n, width] into ``out`` (and ``scales`` for I8)."""
    if scalar is Scalar.B1:
        out[...] = np.packbits(source > 0, axis=1, bitorder="big")
    elif scalar is Scalar.I8:
        assert scales is not None
        width = source.shape[1] if source.ndim == 2 else 0
        peak = np.max(np.abs(source), axis=1) if width else np.zeros(len(source), np.float32)
        scales[...] = np.where(peak > 0, peak / 127.0, 1.0)
        out[...] = np.clip(np.rint(source / scales[:, None]), -127, 127)
    else:
        out[...] = source.astype(_CASTS[scalar], copy=False)
