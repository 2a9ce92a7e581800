"""Writing a converted file as a stream: each tensor is read from the source, checked finite,
cast and written in turn through buffers reused from tensor to tensor (a reader thread reads
and casts the next tensor while this one is written), so a conversion holds neither the source
nor the result in memory (a ViT-B/16's 600 MB are never copied whole).

The bytes are those :func:`uform.core.safetensors.write` writes for the same tensors (names
sorted, the header padded with spaces to a multiple of 8, tensors back to back).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from uform.core.safetensors import DTYPE_NAMES

from .sources import ConvertError, Weights

CHUNK = 1 << 18  # values cast at once: cache-sized


@dataclass(frozen=True)
class Ref:
    """An output tensor made of source tensors' bytes back to back (``parts``, each checked
    for its shape when taken), of ``shape``: a rename, a reshape, or q, k, v stacked."""

    parts: tuple[str, ...]
    shape: tuple[int, ...]


Tensor = np.ndarray | Ref


def shape_of(value: Tensor) -> tuple[int, ...]:
    return value.shape if isinstance(value, Ref) else tuple(value.shape)


def stream(f: BinaryIO, tensors: Mapping[str, Tensor], metadata: Mapping[str, str], weights: Weights, dtype: np.dtype[Any]) -> None:
    names = sorted(tensors)
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name in names:
        size = int(np.prod(shape_of(tensors[name]), dtype=np.int64)) * dtype.itemsize
        header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape_of(tensors[name])), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    jobs = [(name, part) for name in names for part in (tensors[name].parts if isinstance(tensors[name], Ref) else (None,))]  # type: ignore[union-attr]
    largest = max((weights.nbytes(p) for _, p in jobs if p is not None), default=0)
    scratch = [np.empty(largest, np.uint8), np.empty(largest, np.uint8)]  # a source tensor's bytes
    values = max((int(np.prod(weights.shapes[p], dtype=np.int64)) for _, p in jobs if p is not None), default=0)
    done = [np.empty(values * dtype.itemsize, np.uint8) for _ in range(2)]  # the same, cast
    ahead, here = Caster(dtype), Caster(dtype)  # the reader's and this thread's (their buffers are their own)
    with ThreadPoolExecutor(1) as reader:  # the next source tensor is read and cast while this one is written
        def read(i: int) -> Future[memoryview] | None:
            part = jobs[i][1] if i < len(jobs) else None
            if part is None:
                return None
            return reader.submit(lambda: ahead.cast(weights.read_into(part, scratch[i % 2]), done[i % 2], jobs[i][0]))

        pending = read(0)
        for i, (name, part) in enumerate(jobs):
            data = pending.result() if pending is not None else here.cast(tensors[name], None, name)  # type: ignore[arg-type]
            pending = read(i + 1)
            f.write(data)


class Caster:
    """Casts float arrays to the output dtype a chunk at a time, through buffers of its own."""

    def __init__(self, dtype: np.dtype[Any]) -> None:
        self.dtype = dtype
        self.out = np.empty(CHUNK, dtype)
        self.bits = np.empty(CHUNK, np.uint32)
        self.wide = np.empty(CHUNK, np.float32)

    def cast(self, array: np.ndarray, into: np.ndarray | None, name: str) -> memoryview:
        """``array``'s values in the output dtype, as bytes: cast into ``into`` (flat bytes, at
        least as large as the result), or into a new array without it."""
        flat = np.ascontiguousarray(array).reshape(-1)
        if flat.dtype == self.dtype:
            return flat.view(np.uint8).data
        size = len(flat) * self.dtype.itemsize
        out = (into[:size] if into is not None else np.empty(size, np.uint8)).view(self.dtype)
        for start in range(0, len(flat), CHUNK):
            part = flat[start : start + CHUNK]
            end = start + len(part)
            if self.dtype == ml_dtypes.bfloat16:
                wide = part if part.dtype == np.float32 else self._widen(part)
                out[start:end].view(np.uint16)[:] = self._bf16(wide)
            else:
                out[start:end] = part
                if not np.isfinite(out[start:end]).all():
                    raise ConvertError(f"tensor {name!r}: holds values past float16's range (65504); convert with --dtype bf16 or f32")
        return out.view(np.uint8).data

    def _widen(self, part: np.ndarray) -> np.ndarray:
        wide = self.wide[: len(part)]
        wide[:] = part
        return wide

    def _bf16(self, wide: np.ndarray) -> np.ndarray:
        """float32 to BF16, rounded to nearest with ties to even (as ``astype(bfloat16)``, for finite values)."""
        n = len(wide)
        u = wide.view(np.uint32)
        t = self.bits[:n]
        np.right_shift(u, 16, out=t)
        np.bitwise_and(t, 1, out=t)
        np.add(t, 0x7FFF, out=t)
        np.add(t, u, out=t)
        np.right_shift(t, 16, out=t)
        out = self.out[:n].view(np.uint16)
        out[:] = t
        return out
