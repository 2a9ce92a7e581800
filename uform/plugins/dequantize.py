"""E4M3 weights through standard ONNX ops: the cpu backend's graphs when the op library is
not there (``DequantizeLinear`` before each product, as any ONNX runtime runs them).

:func:`quantize_e4m3` is the reference of the quantization the op library performs: a scale
per output row, ``amax / 448``; codes ``e4m3(w * min(448 / amax, FLT_MAX))`` rounded to nearest
even and saturated at ±448 (a row of zeros has scale 1 and zero codes). Both give the same bits. :func:`lower` turns each product over a block's
matrix into ``Gemm(x, DequantizeLinear(codes, scale, axis=0), b, transB=1)``: float32
weights are made on every run (about 2 ns a weight) and dropped after their product.
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from uform.core.weights import matrix_products, with_nodes

E4M3_MAX = np.float32(448.0)
FLOAT32_MAX = np.finfo(np.float32).max
ROWS = 256  # rows quantized at a time: the float32 scratch stays small


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


def lower(graph: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``graph`` with the blocks' products dequantizing E4M3 codes, and the arrays its
    initializers take (codes as FLOAT8E4M3FN, scales, other weights widened to float32)."""
    arrays: dict[str, np.ndarray] = {}
    nodes = list(graph.graph.node)
    blocks = [(i, m) for i, m in sorted(matrix_products(graph, weights).items()) if ".blocks." in m]
    for inserted, (index, matrix) in enumerate(blocks):
        codes, scale = quantize_e4m3(weights[matrix])
        arrays[f"{matrix}:e4m3"] = codes.view(ml_dtypes.float8_e4m3fn)
        arrays[f"{matrix}:scale"] = scale
        # the product keeps reading `matrix`, now the output of its DequantizeLinear
        inputs = [f"{matrix}:e4m3", f"{matrix}:scale"]
        nodes.insert(index + inserted, helper.make_node("DequantizeLinear", inputs, [matrix], name=f"{matrix}:dequantize", axis=0))
    for name, stored in weights.items():
        if f"{name}:e4m3" not in arrays:
            arrays[name] = stored.astype(np.float32)
    return with_nodes(graph, nodes, arrays), arrays
