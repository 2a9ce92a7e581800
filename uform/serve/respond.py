"""Rows to OpenAI's responses: ``float`` lists or ``base64`` float32 little-endian, Matryoshka
``dimensions`` (a prefix made unit again), ``usage`` in the model's tokens (the
routes count them: UTF-8 bytes, or a converted model's own tokenizer's)."""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from .errors import ApiError, shown


def assemble(parts: Sequence[tuple[np.ndarray, np.ndarray]], count: int, dimensions: int) -> np.ndarray:
    """One ``[count, dimensions]`` float32 array from each job's ``(positions, rows)``."""
    if len(parts) == 1 and len(parts[0][0]) == count:
        return parts[0][1]
    out = np.empty((count, dimensions), np.float32)
    for positions, rows in parts:
        out[positions] = rows
    return out


def check_dimensions(dimensions: int | None, model_dimensions: int) -> None:
    if dimensions is not None and dimensions > model_dimensions:
        raise ApiError(400, f"'dimensions' is {shown(dimensions)}, but this model's embeddings have {model_dimensions}", param="dimensions", code="invalid_value")


def prefix(rows: np.ndarray, dimensions: int | None, model_dimensions: int) -> np.ndarray:
    """The first ``dimensions`` values of each row, unit again; all of them when None."""
    if dimensions is None or dimensions == model_dimensions:
        return rows
    check_dimensions(dimensions, model_dimensions)
    cut = rows[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    out: np.ndarray = np.divide(cut, norms, out=np.zeros_like(cut), where=norms > 0).astype(np.float32)
    return out


def embeddings_body(rows: np.ndarray, encoding_format: str, model: str, tokens: int) -> bytes:
    """The ``/v1/embeddings`` response's JSON bytes: ``base64`` rows from the array's bytes put
    into the document's fixed text (the bytes orjson writes for it), ``float`` rows as float32
    arrays in one orjson pass (orjson writes each value's shortest decimal that reads back as
    the same float32)."""
    rows = np.ascontiguousarray(rows, dtype="<f4")
    if encoding_format == "base64":
        raw = memoryview(rows.tobytes())
        width = rows.shape[1] * 4
        b64 = binascii.b2a_base64
        joined = b",".join([_ROW % (i, b64(raw[at : at + width], newline=False)) for i, at in enumerate(range(0, len(raw), width))])
        return b'{"object":"list","data":[' + joined + b'],"model":' + orjson.dumps(model) + _USAGE % (tokens, tokens)
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(rows)]
    doc = {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


_ROW = b'{"object":"embedding","index":%d,"embedding":"%s"}'  # base64 needs no JSON escapes
_USAGE = b',"usage":{"prompt_tokens":%d,"total_tokens":%d}}'


def choose_body(values: np.ndarray, offsets: np.ndarray, choices: Sequence[bytes], model: str, tokens: int) -> bytes:
    """The ``/v1/choose`` response: each text's probabilities, in its choices' order (each
    value written as the shortest decimal that reads back as the same float32)."""
    flat = np.ascontiguousarray(values)
    bounds = offsets.tolist()
    data = [
        {"object": "choice_probabilities", "index": i, "choices": c.decode("ascii"), "probabilities": flat[bounds[i] : bounds[i + 1]]}
        for i, c in enumerate(choices)
    ]  # fmt: skip
    doc = {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
