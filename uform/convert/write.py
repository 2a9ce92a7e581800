"""Writing a converted file as a stream: the tensors are cut into jobs of :data:`JOB` values,
which worker threads (one a core) check finite and cast from the source's memory map into
buffers reused from job to job, while this thread writes the finished jobs in order. So a
conversion holds neither the source nor the result in memory (a ViT-B/16's 600 MB are never
copied whole), the disk reads the source ahead of the casts (each job's bytes are asked for,
``MADV_WILLNEED``, when it is queued), and the casts run on every core. Tensors whose dtype
does not change are written from the map as they are (checked, not copied).

The bytes are those :func:`uform.core.safetensors.write` writes for the same tensors (names
sorted, the header padded with spaces to a multiple of 8, tensors back to back).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from uform.core.executor import available_cores
from uform.core.safetensors import DTYPE_NAMES

from .sources import ConvertError, Weights

JOB = 1 << 20  # values one job casts: 4 MiB of float32 read, 2 MiB of BF16 written
CHUNK = 1 << 16  # values cast at once inside a job: the temporaries stay in the core's cache
BEHIND = 16 << 20  # bytes of the output whose writeback is started at once
BF16 = np.dtype(ml_dtypes.bfloat16)
EXPONENT = {np.dtype(np.float32): 0x7F800000, np.dtype(np.float16): 0x7C00, BF16: 0x7F80}  # all ones: an infinity or a NaN


@dataclass(frozen=True)
class Ref:
    """An output tensor made of source tensors' bytes back to back (``parts``, each checked
    for its shape when taken), of ``shape``: a rename, a reshape, or q, k, v stacked."""

    parts: tuple[str, ...]
    shape: tuple[int, ...]


Tensor = np.ndarray | Ref


def shape_of(value: Tensor) -> tuple[int, ...]:
    return value.shape if isinstance(value, Ref) else tuple(value.shape)


@dataclass(frozen=True)
class Job:
    """Values ``[begin, end)`` of one source tensor (flat), for output tensor ``name``."""

    name: str
    flat: np.ndarray
    check: Callable[[], None]  # refuses the whole source tensor, naming it (the slow path, on a fault)
    begin: int
    end: int


def stream(
    f: BinaryIO, tensors: Mapping[str, Tensor], metadata: Mapping[str, str], weights: Weights, dtype: np.dtype[Any], workers: int | None = None
) -> None:
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
    jobs = _jobs(names, tensors, weights)
    workers = workers or max(1, min(available_cores(), 8))
    window = 2 * workers + 2  # jobs queued or done and not yet written: each holds one buffer
    buffers: deque[np.ndarray] = deque(np.empty(JOB * dtype.itemsize, np.uint8) for _ in range(window))
    caster = Caster(dtype)
    behind = WriteBehind(f)
    pending: deque[tuple[Future[memoryview], np.ndarray]] = deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="uform-convert") as pool:
        try:
            for job in jobs:
                if len(pending) == window:
                    behind.write(_done(pending, buffers))
                buffer = buffers.popleft()
                pending.append((pool.submit(caster.cast, job, buffer), buffer))
            while pending:
                behind.write(_done(pending, buffers))
        except BaseException:
            for future, _ in pending:
                future.cancel()
            raise


class WriteBehind:
    """Writes to ``f`` and asks the kernel to start writing each :data:`BEHIND` bytes to the
    disk once the next as many are written (``POSIX_FADV_DONTNEED`` starts the writeback of
    dirty pages and returns), so the sync that ends an atomic write (:mod:`uform.core.files`)
    waits for the last bytes only, not for the whole file. A hint: it neither syncs nor orders."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.start = self.written = f.tell()
        try:
            self.fd = f.fileno() if hasattr(os, "posix_fadvise") else -1
        except (AttributeError, OSError, ValueError):  # not a file of the operating system's
            self.fd = -1

    def write(self, data: memoryview) -> None:
        self.f.write(data)
        self.written += len(data)
        if self.fd >= 0 and self.written - self.start >= 2 * BEHIND:
            self.f.flush()
            try:
                os.posix_fadvise(self.fd, self.start, BEHIND, os.POSIX_FADV_DONTNEED)
            except OSError:
                self.fd = -1
            self.start += BEHIND


def _done(pending: deque[tuple[Future[memoryview], np.ndarray]], buffers: deque[np.ndarray]) -> memoryview:
    """The oldest job's bytes; its buffer goes back to ``buffers`` (the caller writes the bytes
    before it queues the next job, which may reuse it)."""
    future, buffer = pending.popleft()
    data = future.result()
    buffers.append(buffer)
    return data


def _jobs(names: list[str], tensors: Mapping[str, Tensor], weights: Weights) -> list[Job]:
    jobs = []
    for name in names:
        value = tensors[name]
        sources: list[tuple[np.ndarray, Callable[[], None]]] = []
        if isinstance(value, Ref):
            for part in value.parts:
                array, check = weights.source(part)
                sources.append((array.reshape(-1), check))
        else:  # an array the conversion made
            sources.append((np.ascontiguousarray(value).reshape(-1), lambda: None))
        for flat, check in sources:
            jobs += [Job(name, flat, check, b, min(b + JOB, len(flat))) for b in range(0, len(flat), JOB)]
    return jobs


class Caster:
    """Checks and casts jobs to the output dtype, a cache-sized chunk at a time, through
    temporaries of each worker thread's own."""

    def __init__(self, dtype: np.dtype[Any]) -> None:
        self.dtype = dtype
        self.local = threading.local()

    def _scratch(self) -> tuple[np.ndarray, np.ndarray]:
        held = getattr(self.local, "held", None)
        if held is None:
            held = self.local.held = (np.empty(CHUNK, np.uint32), np.empty(CHUNK, np.float32))
        return held

    def cast(self, job: Job, into: np.ndarray) -> memoryview:
        """The job's values checked finite and in the output dtype, as bytes: the source's
        own bytes where the dtype does not change, else cast into ``into`` (flat bytes)."""
        part = job.flat[job.begin : job.end]
        if part.dtype == self.dtype:
            self._check(job, part)
            return part.view(np.uint8).data
        out = into[: len(part) * self.dtype.itemsize].view(self.dtype)
        bits, wide = self._scratch()
        for start in range(0, len(part), CHUNK):
            chunk = part[start : start + CHUNK]
            end = start + len(chunk)
            if self.dtype == BF16:
                if chunk.dtype != np.float32:
                    self._check(job, chunk)
                    chunk = _widen(chunk, wide)
                self._bf16(job, chunk, out[start:end].view(np.uint16), bits[: len(chunk)])
            else:
                self._check(job, chunk)
                with np.errstate(over="ignore"):  # a value past float16's range is refused next
                    out[start:end] = chunk
                if self.dtype == np.float16 and not np.isfinite(out[start:end]).all():
                    raise ConvertError(f"tensor {job.name!r}: holds values past float16's range (65504); convert with --dtype bf16 or f32")
        return out.view(np.uint8).data

    def _check(self, job: Job, values: np.ndarray) -> None:
        """Refuse ``values`` (a slice of the job's source) holding a NaN or an infinity: the
        whole source tensor is checked then, so the error names it and its first such value."""
        limit = EXPONENT.get(values.dtype)
        if limit is None:  # another float type (float64): rare, checked as it is
            if not np.isfinite(values).all():
                self._fault(job)
            return
        bits, _ = self._scratch()
        kind = np.uint16 if values.dtype.itemsize == 2 else np.uint32
        for start in range(0, len(values), CHUNK):
            chunk = values[start : start + CHUNK].view(kind)
            held = np.bitwise_and(chunk, limit, out=bits[: len(chunk)])
            if held.max() == limit:
                self._fault(job)

    def _fault(self, job: Job) -> None:
        """A NaN, an infinity or a value past the output's range is in the job: the source
        tensor's own check names a NaN or an infinity in it; else a value was too large."""
        job.check()
        raise ConvertError(f"tensor {job.name!r}: holds values past {DTYPE_NAMES[self.dtype]}'s range; convert with --dtype f32")

    def _bf16(self, job: Job, wide: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
        """float32 to BF16 bits in ``out``, rounded to nearest with ties to even (as
        ``astype(bfloat16)``); a NaN, an infinity, or a value that rounds past BF16's range
        refused (the magnitude's bits at or past 0x7F7F8000)."""
        u = wide.view(np.uint32)
        np.bitwise_and(u, 0x7FFFFFFF, out=t)
        if t.max() >= 0x7F7F8000:
            self._fault(job)
        np.right_shift(u, 16, out=t)
        np.bitwise_and(t, 1, out=t)
        np.add(t, 0x7FFF, out=t)
        np.add(t, u, out=t)
        np.right_shift(t, 16, out=t)
        out[:] = t


def _widen(part: np.ndarray, wide: np.ndarray) -> np.ndarray:
    out = wide[: len(part)]
    out[:] = part
    return out
