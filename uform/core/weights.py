"""Binding a tower graph's declared weights to data a session can read."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import CheckpointError, UformError

WEIGHTS_FILE = "weights.bin"


class Source(Protocol):
    """Where a load's tensors come from: a parsed buffer (``safetensors.Container``, arrays
    are views) or an open file (``checkpoint.CheckpointFile``, arrays are read when asked)."""

    @property
    def streams(self) -> bool: ...
    @property
    def entries(self) -> Mapping[str, Any]: ...
    @property
    def metadata(self) -> Mapping[str, str]: ...

    def nbytes(self, name: str) -> int: ...
    def array(self, name: str) -> np.ndarray: ...
    def read_into(self, name: str, out: np.ndarray, skip_bf16_check: bool = False) -> np.ndarray: ...
    def named(self, exc: UformError) -> UformError:
        """``exc`` naming where the tensors come from (a file's path), once."""
        ...


class Stored(Mapping[str, np.ndarray]):
    """A tower's stored weights by name, as a backend gets them (``TowerPlan.weights``).

    A plain mapping of arrays to whoever reads it (each read once and kept: the same object
    every time); shapes and byte counts are known without reading (:meth:`shape`,
    :meth:`nbytes_of`, :attr:`nbytes`). :meth:`fetch` hands a weight over without keeping it: read into a
    scratch buffer the caller reuses, for backends that repack every matrix anyway, so the
    load never holds the file's bytes beside the packed ones.
    """

    def __init__(self, source: Source, names: Iterable[str], as_bf16: bool = False) -> None:
        self._source, self._names = source, list(names)
        self._names_set = frozenset(self._names)
        self._read: dict[str, np.ndarray] = {}
        # version 2: F16 and F32 tensors are rounded to BF16 as they are read (a BF16 or E4M3 load)
        self._as_bf16 = as_bf16

    def _widened(self, name: str) -> bool:
        """Whether weight ``name`` is stored in another type than it is handed over in."""
        return self._as_bf16 and self._source.entries[name].dtype != "BF16"

    def __getitem__(self, name: str) -> np.ndarray:
        array = self._read.get(name)
        if array is None:
            if name not in self._names_set:
                raise KeyError(name)
            array = self._source.array(name)
            if self._widened(name):
                array = _as_bf16(name, array)
            self._read[name] = array
        return array

    def __contains__(self, name: object) -> bool:  # Mapping's own would read the weight
        return name in self._names_set

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    @property
    def streams(self) -> bool:
        """Whether weights not read yet come from a file (else they are views of memory)."""
        return self._source.streams

    def nbytes_of(self, name: str) -> int:
        return self._source.nbytes(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._source.entries[name].shape)

    @property
    def nbytes(self) -> int:
        """The stored bytes of every weight."""
        return sum(self._source.nbytes(n) for n in self._names)

    def fetch(self, name: str, scratch: np.ndarray, skip_bf16_check: bool = False) -> np.ndarray:
        """Weight ``name``, not kept: a view of memory already holding it, else read into the
        front of ``scratch`` (flat uint8, at least the weight's bytes), valid until the next
        fetch into it. ``skip_bf16_check``: a BF16 weight read here is not checked finite (the
        caller checks its bits itself)."""
        if name in self._read or not self._source.streams:
            return self[name]
        if self._widened(name):  # rounded into an array of its own (the scratch is sized for BF16)
            return _as_bf16(name, self._source.array(name))
        return self._source.read_into(name, scratch, skip_bf16_check)


def _as_bf16(name: str, array: np.ndarray) -> np.ndarray:
    """F16 or F32 tensor ``name`` rounded to BF16 (to nearest, ties to even); CheckpointError
    naming it, the value and its index when a finite value rounds to infinity (an F32 magnitude
    of 3.3961e38 or more: BF16's exponent ends there), which no check of the stored bits sees."""
    import ml_dtypes

    rounded = array.astype(ml_dtypes.bfloat16)
    beyond = (rounded.view(np.uint16) & 0x7FFF) >= 0x7F80
    if beyond.any():
        first = int(np.flatnonzero(beyond)[0])
        index = [int(i) for i in np.unravel_index(first, array.shape)]
        raise CheckpointError(
            f"tensor {name!r}: its value {array.reshape(-1)[first]!s} at index {index} is beyond BF16's range and "
            "rounds to infinity in a BF16 or E4M3 load, which holds it in BF16; load it with quantization f32"
        )
    return rounded


def stored_bytes(weights: Mapping[str, np.ndarray]) -> int:
    """The stored bytes of ``weights``, without reading any that are not read yet."""
    return weights.nbytes if isinstance(weights, Stored) else sum(w.nbytes for w in weights.values())


def shape_of(weights: Mapping[str, np.ndarray], name: str) -> tuple[int, ...]:
    """A weight's shape, without reading it where ``weights`` can tell."""
    return weights.shape(name) if isinstance(weights, Stored) else tuple(weights[name].shape)


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
        if plain and matrix in weights and len(shape_of(weights, matrix)) == 2 and uses[matrix] == 1:
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
