"""The op library built from ``native/uform_ops``: finding it and loading it. Its C entries
(:class:`OpLibrary`, the kernel variants, :class:`OpLibraryError`) are
:mod:`uform.plugins.oplib.entries`, where its arrays live :mod:`uform.plugins.oplib.memory`;
both are re-exported here, the names every caller imports.

The package's build (``setup.py``) compiles the library beside this package as
``uform/_ops*.so``; ``UFORM_OPS_LIBRARY`` names another file instead. :func:`library`
answers the loaded :class:`OpLibrary`, or raises :class:`OpLibraryError` saying why not: not
built (with the build's own reason), not loadable (corrupt, wrong machine), or built for
another ABI. Nothing here runs an instruction the CPU lacks: the library reports which
kernel variants this CPU runs, and refuses the others itself.

Weights are packed once, at load, into the panels the kernels read (:meth:`OpLibrary.pack`);
:meth:`OpLibrary.gemm` runs a product outside ONNX Runtime, :meth:`OpLibrary.product_session`
one inside it, for parity tests and benchmarks.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

from uform.plugins.oplib.entries import BF16 as BF16
from uform.plugins.oplib.entries import BF16_DTYPES as BF16_DTYPES
from uform.plugins.oplib.entries import BF16_PRODUCTS as BF16_PRODUCTS
from uform.plugins.oplib.entries import E4M3 as E4M3
from uform.plugins.oplib.entries import VARIANTS as VARIANTS
from uform.plugins.oplib.entries import OpLibrary as OpLibrary
from uform.plugins.oplib.entries import OpLibraryError as OpLibraryError
from uform.plugins.oplib.memory import HUGE_PAGE as HUGE_PAGE
from uform.plugins.oplib.memory import aligned_empty as aligned_empty
from uform.plugins.oplib.memory import huge_pages as huge_pages
from uform.plugins.oplib.memory import zeros as zeros

ABI = 11  # uform_ops_abi() of the library this module speaks to
VENDORS = {1: "intel", 2: "amd"}  # uform_ops_cpu_vendor()
ENVIRONMENT = "UFORM_OPS_LIBRARY"


def library_path() -> Path:
    """Where the library is: ``UFORM_OPS_LIBRARY``, else built beside the package."""
    given = os.environ.get(ENVIRONMENT)
    if given:
        return Path(given)
    package = Path(__file__).resolve().parents[2]  # uform/, from uform/plugins/oplib/library.py
    built = sorted(package.glob("_ops*.so")) + sorted(package.glob("_ops*.pyd"))
    if built:
        return built[0]
    reason = package / "_ops.build-error.txt"
    detail = reason.read_text().strip() if reason.is_file() else "no build of it was found"
    raise OpLibraryError(f"the op library was not built with this install of uform: {detail}")


@functools.lru_cache(maxsize=1)
def library() -> OpLibrary:
    """The op library, loaded once; :class:`OpLibraryError` with the reason when it cannot be."""
    path = library_path()
    if not path.is_file():
        raise OpLibraryError(f"{path}: no such file ({ENVIRONMENT} or the build names it)")
    try:
        handle = ctypes.CDLL(str(path))
    except OSError as exc:
        raise OpLibraryError(f"{path} does not load: {exc}") from None
    try:
        abi = int(handle.uform_ops_abi())
    except AttributeError:
        raise OpLibraryError(f"{path} is not uform's op library (it has no uform_ops_abi)") from None
    if abi != ABI:
        raise OpLibraryError(f"{path} speaks ABI {abi}, this uform speaks {ABI}: rebuild it (pip install the package again)")
    handle.uform_packed_elements.restype = ctypes.c_int64
    handle.uform_pack.restype = ctypes.c_int64
    handle.uform_gemm.restype = ctypes.c_int
    handle.uform_attention.restype = ctypes.c_int
    handle.uform_fma_peak.restype = ctypes.c_double
    handle.uform_ops_runnable.restype = ctypes.c_uint
    handle.uform_ops_splits_256.restype = ctypes.c_int
    handle.uform_ops_amx_refusal.restype = ctypes.c_char_p
    handle.uform_ops_cpu_vendor.restype = ctypes.c_int
    mask = int(handle.uform_ops_runnable())  # asks Linux for the tile state where the CPU has AMX
    runnable = frozenset(v for i, v in enumerate(VARIANTS) if mask >> i & 1)
    refusal = handle.uform_ops_amx_refusal()
    vendor = VENDORS.get(int(handle.uform_ops_cpu_vendor()), "other")
    return OpLibrary(path, handle, runnable, bool(handle.uform_ops_splits_256()), vendor, refusal.decode() if refusal else None)
