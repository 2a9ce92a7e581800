"""Where the op library's arrays live: packed weights in one private anonymous map of huge
pages (:func:`zeros`), and outputs that start on a 64-byte line as ONNX Runtime's do
(:func:`aligned_empty`)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

HUGE_PAGE = 2 << 20


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialized C-contiguous array that starts on a 64-byte line (as ONNX Runtime's
    allocator places its outputs; numpy's large arrays start 16 bytes into a page)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    out: np.ndarray = raw[start : start + nbytes].view(np.dtype(dtype)).reshape(shape)
    return out


def zeros(shapes: Sequence[tuple[int, np.dtype[Any]]]) -> list[np.ndarray]:
    """Zeroed arrays of ``(count, dtype)`` in one private anonymous map, each starting on a
    64-byte line and the first on a 2 MiB boundary. The map is unmapped when the last array
    goes (from malloc's heap the pages would stay).

    Huge pages are asked for (``MADV_HUGEPAGE``) unless ``UFORM_HUGE_PAGES=0``: a short query
    streams every weight once, and with 4 KiB pages a base text tower's 12-byte query took
    1.05x the time (BF16, Zen 4, AVX-512 and AVX2 kernels alike; longer inputs within 1 %).
    Where a VM backs its guest's memory only as it is first touched, 2 MiB pages may come from
    memory the host has not backed yet: on a 2-core Zen 1 a BF16 load of the full base
    checkpoint took 1.00-1.08 s with them against 0.72-0.74 s without (docs/op-library.md)."""
    offsets, size = [], 0
    for count, dtype in shapes:
        offsets.append(size)
        size += -(-count * dtype.itemsize // 64) * 64
    buffer = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE") and huge_pages():
        try:
            buffer.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages (EINVAL): 4 KiB pages serve
            pass
    base = np.frombuffer(buffer, np.uint8)
    start = -base.ctypes.data % HUGE_PAGE
    return [base[start + o : start + o + c * d.itemsize].view(d) for o, (c, d) in zip(offsets, shapes)]


def huge_pages() -> bool:
    """Whether packed weights ask for huge pages: yes, unless ``UFORM_HUGE_PAGES`` is ``0``."""
    return os.environ.get("UFORM_HUGE_PAGES", "1").strip() != "0"
