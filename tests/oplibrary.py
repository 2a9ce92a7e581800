"""The op library as the tests see it: loaded once, or the reason it cannot be, and skips
that name what this machine lacks."""

from __future__ import annotations

import pytest

from uform.plugins.oplib.library import OpLibrary, OpLibraryError, library

try:
    LIBRARY: OpLibrary | None = library()
    WHY_NOT = ""
except OpLibraryError as exc:  # the suite still runs: the fallback tests cover this case
    LIBRARY, WHY_NOT = None, str(exc)

needs_library = pytest.mark.skipif(LIBRARY is None, reason=f"the op library is not usable here: {WHY_NOT}")


def runnable(variant: str) -> OpLibrary:
    """The library, where this CPU runs ``variant``'s kernels (else the test is skipped)."""
    if LIBRARY is None:
        pytest.skip(f"the op library is not usable here: {WHY_NOT}")
    if variant not in LIBRARY.runnable:
        why = f": {LIBRARY.amx_refusal}" if variant == "amx" and LIBRARY.amx_refusal else ""
        pytest.skip(f"this CPU cannot run the {variant} kernels{why} (it runs {sorted(LIBRARY.runnable)})")
    return LIBRARY
