"""E4M3 weights through standard ONNX ops: the cpu backend's graphs when the op library is
not there (``DequantizeLinear`` before each product, as any ONNX runtime runs them).

:func:`quantize_e4m3` is the reference of the quantization the op library performs: a scale
per output row, ``amax / 448``; codes ``e4m3(w * min(448 / amax, FLT_MAX))`` rounded to nearest
even and saturated at ±448 (a row of zeros has scale 1 and zero codes). Both give the same
bits. :func:`lower` turns each product over a block's matrix into ``Gemm(x,
DequantizeLinear(codes, scale, axis=0), b, transB=1)`` with the codes fed on every run:
float32 weights are made on every run (about 2 ns a weight) and dropped after their product.
:func:`embedded` puts them inside the model instead, for a GPU that copies them in once.
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from uform.core.weights import Lowered, lowered, matrix_products

E4M3_MAX = np.float32(448.0)
FLOAT32_MAX = np.finfo(np.float32).max
ROWS = 32  # rows quantized at a time: the float32 scratch stays small (and is reused from the heap)


def quantize_e4m3(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``weights`` [n, k] (BF16) as E4M3FN codes (uint8) and a float32 scale per row."""
    n, k = weights.shape
    codes = np.empty((n, k), np.uint8)
    scale = np.empty(n, np.float32)
    for lo in range(0, n, ROWS):
        rows = weights[lo : lo + ROWS].astype(np.float32)
        amax = np.abs(rows).max(axis=1)
        positive = amax > 0
        with np.errstate(over="ignore"):  # 448 / a subnormal amax: the largest float32 instead
            inverse = np.where(positive, np.minimum(E4M3_MAX / np.where(positive, amax, 1), FLOAT32_MAX), np.float32(1))
        scale[lo : lo + ROWS] = np.where(positive, amax / E4M3_MAX, np.float32(1))
        scaled = np.clip(rows * inverse[:, None], -E4M3_MAX, E4M3_MAX)
        codes[lo : lo + ROWS] = scaled.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return codes, scale


def lower(graph: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> Lowered:
    """``graph`` with the blocks' products dequantizing E4M3 codes: the codes (FLOAT8E4M3FN)
    and scales fed, the other weights float32 initializers."""
    fed: dict[str, np.ndarray] = {}
    nodes = list(graph.graph.node)
    blocks = [(i, m) for i, m in sorted(matrix_products(graph, weights).items()) if ".blocks." in m]
    for inserted, (index, matrix) in enumerate(blocks):
        codes, scale = quantize_e4m3(weights[matrix])
        fed[f"{matrix}:e4m3"] = codes.view(ml_dtypes.float8_e4m3fn)
        fed[f"{matrix}:scale"] = scale
        # the product keeps reading `matrix`, now the output of its DequantizeLinear
        inputs = [f"{matrix}:e4m3", f"{matrix}:scale"]
        nodes.insert(index + inserted, helper.make_node("DequantizeLinear", inputs, [matrix], name=f"{matrix}:dequantize", axis=0))
    initializers = {name: stored.astype(np.float32) for name, stored in weights.items() if f"{name}:e4m3" not in fed}
    return lowered(graph, nodes, fed, initializers)


def embedded(low: Lowered) -> bytes:
    """``low`` serialized with every weight inside, fed ones included (for a device, where
    feeding would copy them over on every run)."""
    graph = onnx.ModelProto()
    graph.CopyFrom(low.graph)
    inputs = [i for i in graph.graph.input if i.name not in low.fed]
    del graph.graph.input[:]
    graph.graph.input.extend(inputs)
    constants = [t for t in graph.graph.initializer if t.name not in low.initializers]  # the graph's own
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(constants)
    arrays = {**low.fed, **low.initializers}
    graph.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in arrays.items())
    data: bytes = graph.SerializeToString()
    return data
