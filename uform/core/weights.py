"""Binding a tower graph's declared weights to data a session can read."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
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


def remove_tree(directory: Path) -> None:
    for child in directory.iterdir():
        child.unlink()
    os.rmdir(directory)
