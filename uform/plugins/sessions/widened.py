"""Sessions over a tower's weights widened for ONNX Runtime, as the cpu and cuda backends start
them: the one place their temporary weights file is named, written and removed.

The weights, converted (BF16 widened to float32, or, for the cuda backend's float16 products,
made float16), are written as external data into a folder named after its writer
(:func:`uform.core.files.own_folder`, ``.uform-TOWER.MACHINE-PID-START-XXXXXXXX.partial`` in the
system's temporary folder); the sessions are started over that file, and the folder is removed
once they have read it, whether they started or not (ONNX Runtime holds its own packed copy).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from uform.core.files import own_folder
from uform.core.weights import bind_external, remove_tree

if TYPE_CHECKING:
    import onnx

T = TypeVar("T")


def widen(stored: np.ndarray) -> np.ndarray:
    """A stored weight (BF16 as its float32 view, or float32) as float32."""
    return stored.astype(np.float32)


def widened_sessions(
    name: str,
    graph: onnx.ModelProto,
    weights: Mapping[str, np.ndarray],
    convert: Callable[[np.ndarray], np.ndarray],
    advance: Callable[[int], None],
    start: Callable[[Path], list[T]],
) -> list[T]:
    """``start(path)``'s sessions over tower ``name``'s ``graph`` saved beside ``convert(w)`` of
    its ``weights``, in a folder of the temporary folder removed before this returns or raises."""
    directory = own_folder(tempfile.gettempdir(), f"uform-{name}")
    try:
        return start(bind_external(graph, weights, directory, convert, advance))
    finally:
        remove_tree(directory)
