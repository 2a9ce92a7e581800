"""Binding a tower graph's declared weights to data a session can read."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

WEIGHTS_FILE = "weights.bin"


def bind_external(
    model: onnx.ModelProto,
    weights: Mapping[str, np.ndarray],
    directory: Path,
    convert: Callable[[np.ndarray], np.ndarray],
    advance: Callable[[int], None] = lambda n: None,
) -> Path:
    """Write ``convert(w)`` of every weight into one file beside the model and point at it.

    The model's initializers become external data into ``directory/weights.bin``; ONNX
    Runtime then reads each weight once into its own (pre-packed) form, so the process
    holds one copy. Answers the path of the saved model.
    """
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    offset = 0
    with open(directory / WEIGHTS_FILE, "wb") as f:
        for name, stored in weights.items():
            data = np.ascontiguousarray(convert(stored))
            f.write(data.reshape(-1).view(np.uint8).data)
            tensor = onnx.TensorProto(name=name, data_type=_onnx_type(data.dtype), dims=data.shape)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(data.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            bound.graph.initializer.append(tensor)
            offset += data.nbytes
            advance(stored.nbytes)
    path = directory / "tower.onnx"
    with open(path, "wb") as f:
        f.write(bound.SerializeToString())
    return path


def embed(model: onnx.ModelProto, weights: Mapping[str, np.ndarray], convert: Callable[[np.ndarray], np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` with every weight stored inside it (for small exported towers)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.initializer.extend(numpy_helper.from_array(np.ascontiguousarray(convert(w)), n) for n, w in weights.items())
    return out


def _onnx_type(dtype: np.dtype[Any]) -> int:
    import ml_dtypes

    special = {np.dtype(ml_dtypes.bfloat16): onnx.TensorProto.BFLOAT16, np.dtype(ml_dtypes.float8_e4m3fn): onnx.TensorProto.FLOAT8E4M3FN}
    return special.get(dtype) or int(onnx.helper.np_dtype_to_tensor_dtype(dtype))


IN_MEMORY = "uform-memory"  # external-data location of initializers handed to ONNX Runtime from memory


def in_memory(name: str, array: np.ndarray) -> onnx.TensorProto:
    """An initializer declaring ``array``'s type and shape whose data the session gets from
    memory (``SessionOptions.add_external_initializers``): nothing is copied or written."""
    tensor = onnx.TensorProto(name=name, data_type=_onnx_type(array.dtype), dims=array.shape)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", IN_MEMORY), ("offset", "0"), ("length", str(array.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def matrix_products(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> dict[int, str]:
    """The graph's ``Gemm(x, W, b?, transB=1)`` nodes over a checkpoint matrix ``W`` that
    nothing else reads, by node index: the products a backend may run its own way."""
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    found = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type != "Gemm" or len(node.input) < 2:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        plain = attrs.get("transB") == 1 and attrs.get("transA", 0) == 0 and attrs.get("alpha", 1.0) == attrs.get("beta", 1.0) == 1.0
        matrix = node.input[1]
        if plain and matrix in weights and weights[matrix].ndim == 2 and uses[matrix] == 1:
            found[i] = matrix
    return found


def with_nodes(model: onnx.ModelProto, nodes: list[onnx.NodeProto], arrays: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` with ``nodes`` and an in-memory initializer for each of ``arrays``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(in_memory(name, array) for name, array in arrays.items())
    return out


@dataclass(frozen=True)
class Lowered:
    """A tower graph as a backend runs it: the big weights are graph inputs fed on every run
    from ``fed`` (ONNX Runtime copies initializers it is handed, so feeding is what keeps one
    copy: none is made, at load or at run); the small tensors are in-memory initializers
    from ``initializers`` (copied in)."""

    graph: onnx.ModelProto
    fed: dict[str, np.ndarray]
    initializers: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.fed.values(), *self.initializers.values()))


def lowered(model: onnx.ModelProto, nodes: list[onnx.NodeProto], fed: dict[str, np.ndarray], initializers: dict[str, np.ndarray]) -> Lowered:
    """:class:`Lowered` over a copy of ``model`` with ``nodes``, ``fed`` declared as inputs."""
    graph = with_nodes(model, nodes, initializers)
    graph.graph.input.extend(onnx.helper.make_tensor_value_info(n, _onnx_type(a.dtype), a.shape) for n, a in fed.items())
    return Lowered(graph, fed, initializers)


def remove_tree(directory: Path) -> None:
    for child in directory.iterdir():
        child.unlink()
    os.rmdir(directory)
