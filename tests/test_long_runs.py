"""Long runs: what a session, a load or a call keeps after it ends (a server or a notebook runs
for days). Each test counts what is left (heap bytes in use, live objects, threads, descriptors)
over many rounds after a warm-up; none times anything."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oplibrary import LIBRARY, needs_library


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def heap_in_use() -> Callable[[], int] | None:
    """glibc's bytes in use by malloc (small blocks and mapped ones), or None off glibc."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2

    def used() -> int:
        gc.collect()
        info = libc.mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return used


def one_product_graph() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@needs_library
def test_a_session_with_the_op_library_keeps_nothing_after_it_is_gone() -> None:
    """Every tower of every BF16 or E4M3 load is a session that registers the op library; its
    RegisterCustomOps made a new op domain each time and kept it for good (ONNX Runtime never
    frees a library's domains): ~250-330 bytes of heap a session more than a session without the
    library, for as long as the process runs. One domain now serves every session."""
    used = heap_in_use()
    if used is None:
        pytest.skip("needs glibc's mallinfo2 to count the heap in use")
    assert LIBRARY is not None
    model = one_product_graph()

    def session(with_library: bool) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        if with_library:
            options.register_custom_ops_library(str(LIBRARY.path))
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    rounds, kept = 600, {}
    for with_library in (False, True):
        for _ in range(20):  # warm-up: ONNX Runtime's and the library's first-use allocations
            session(with_library)
        before = used()
        for _ in range(rounds):
            session(with_library)
        kept[with_library] = (used() - before) / rounds
    assert kept[True] - kept[False] < 64, f"bytes of heap kept a session: {kept[True]:.0f} with the op library, {kept[False]:.0f} without"
