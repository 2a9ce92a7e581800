"""Zero-shot label probabilities: an item's embedding against label texts, as the model was
trained to compare them (checkpoint format version 2's ``labels``; docs/models.md).

CLIP: ``softmax_j(scale · cos_j)`` over the labels of each item (they sum to 1); SigLIP:
``sigmoid(scale · cos_j + bias)`` for each label on its own (each in 0…1, no sum). ``cos_j``
is the dot product of the item's unit embedding with label ``j``'s text embedding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .errors import InputError, UnsupportedError
from .pipeline import check_batch


def label_texts(labels: Any, utf8: Callable[[int, str], bytes]) -> list[str]:
    """``labels`` checked: a non-empty sequence of strings (a bare string is refused, not split),
    each encodable by ``utf8`` (the text plugin's ``utf8_of``, the one wording of that refusal;
    its ``InputError`` is given again naming ``labels[i]``, not an item of a call of its own)."""
    if isinstance(labels, (str, bytes)):
        raise TypeError(f"labels must be a sequence of label texts, got a single {type(labels).__name__}; wrap it in a list")
    check_batch(labels, "labels")
    out = list(labels)
    if not out:
        raise ValueError("labels: give one label text at least")
    for i, label in enumerate(out):
        if not isinstance(label, str):
            raise TypeError(f"labels[{i}]: expected str, got {type(label).__name__}")
        try:
            utf8(i, label)
        except InputError as exc:  # a lone surrogate
            raise ValueError(f"labels[{i}]: {exc.reason}") from None
    return out


UNIT = 0.01  # a row's norm may differ from 1 by this much (an E4M3 tower's rows), not a row never normalised


def rows(embeddings: Any, dimensions: int) -> np.ndarray:
    """``embeddings`` as float64 ``[N, dimensions]`` (one row: ``[dimensions]`` is taken as ``[1, dimensions]``):
    float32 (or float64) unit rows, as the encode verbs give them in F32. F16 rows are refused
    (their rounding moves CLIP's probabilities, at a scale of 100, by up to 3e-4), and so is a row
    whose norm is not 1 (within ``UNIT``), by its index: its cosines would be off."""
    array = np.asarray(embeddings)
    if array.dtype.kind != "f" or array.dtype.itemsize < 4:
        raise TypeError(f"embeddings must be float32 (or float64) rows (outputs_scalar=Scalar.F32), got {array.dtype}")
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2 or array.shape[1] != dimensions:
        raise ValueError(f"embeddings must have shape [N, {dimensions}] (this model's dimensions), got {list(array.shape)}")
    if not np.isfinite(array).all():
        raise ValueError(f"embeddings: row {int(np.flatnonzero(~np.isfinite(array).all(1))[0])} holds NaN or infinite values")
    out = array.astype(np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", out, out))
    off = np.flatnonzero(np.abs(norms - 1.0) > UNIT)
    if off.size:
        i = int(off[0])
        raise ValueError(
            f"embeddings: row {i} has norm {norms[i]:.6g}, not 1: label probabilities compare unit rows "
            "(an encode verb's embeddings, or rows divided by their norms)"
        )
    return out


def spec(labels: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if labels is None:
        raise UnsupportedError(
            "this model has no labels (format version 2's `labels`): zero-shot label probabilities need a converted "
            "CLIP or SigLIP (uform convert, docs/models.md); compare embeddings by cosine instead"
        )
    return labels


def probabilities(labels: Mapping[str, Any], items: np.ndarray, texts: np.ndarray) -> np.ndarray:
    """``[N, L]`` float32 probabilities of ``items`` (``[N, D]``) against label embeddings ``texts`` (``[L, D]``)."""
    logits: np.ndarray = float(labels["scale"]) * (items @ np.asarray(texts, np.float64).T)
    if labels["kind"] == "softmax":
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return np.asarray(e / e.sum(axis=1, keepdims=True), np.float32)
    with np.errstate(over="ignore"):  # exp(-x) past float64 for x < -709: 1 / inf is the sigmoid's 0, exactly
        out = 1.0 / (1.0 + np.exp(-(logits + float(labels.get("bias", 0.0)))))
    return np.asarray(out, np.float32)
