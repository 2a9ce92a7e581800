"""Float16 products for the cuda backend's experimental ``COMPUTE = "f16"``: a tower's graph
whose weight ``Gemm`` nodes multiply in float16, the rest of it staying float32."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def half_products(model: onnx.ModelProto, weights: Sequence[str]) -> tuple[onnx.ModelProto, set[str]]:
    """A copy of ``model`` whose ``Gemm`` nodes multiply in float16, and the weights that
    become float16.

    Each ``Gemm`` over checkpoint weights (or embedded constants) used by no other node gets
    its activation cast to float16 before and its result cast back to float32 after; the rest
    of the graph (residual stream, LayerNorm, softmax, pooling) stays float32, as do the
    graph's inputs and outputs. Constants it multiplies become float16 in place.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    constants = {t.name: i for i, t in enumerate(g.initializer)}
    declared, halves, nodes = set(weights), set(), []
    gemms = [n for n in g.node if n.op_type == "Gemm"]
    elsewhere = {name for n in g.node if n.op_type != "Gemm" for name in n.input} | {n.input[0] for n in gemms}
    chosen = {id(n) for n in gemms if all((w in declared or w in constants) and w not in elsewhere for w in n.input[1:])}
    blocked = {w for n in gemms if id(n) not in chosen for w in n.input[1:]}  # shared with a float32 Gemm
    chosen = {id(n) for n in gemms if id(n) in chosen and not blocked.intersection(n.input[1:])}
    for node in g.node:
        operands = node.input[1:]
        if id(node) not in chosen:
            nodes.append(node)
            continue
        x16, y16 = f"{node.name}_x16", f"{node.name}_y16"
        nodes.append(helper.make_node("Cast", [node.input[0]], [x16], name=f"{node.name}_to16", to=TensorProto.FLOAT16))
        half = onnx.NodeProto()
        half.CopyFrom(node)
        half.input[0], half.output[0] = x16, y16
        nodes.append(half)
        nodes.append(helper.make_node("Cast", [y16], [node.output[0]], name=f"{node.name}_to32", to=TensorProto.FLOAT))
        for w in operands:
            if w in constants and w not in halves:
                table = numpy_helper.to_array(g.initializer[constants[w]])
                g.initializer[constants[w]].CopyFrom(numpy_helper.from_array(halve(table), w))
            halves.add(w)
    del g.node[:]
    g.node.extend(nodes)
    return out, halves & declared


def halve(values: np.ndarray) -> np.ndarray:
    """``values`` as float16, clipped to its finite range (+-65504) first."""
    return np.clip(values.astype(np.float32), -65504, 65504).astype(np.float16)
