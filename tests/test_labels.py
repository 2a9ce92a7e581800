"""Zero-shot label probabilities' rows (uform/core/labels.py; docs/api.md "label_probabilities"):
unit rows of floats, each other row refused by its index before any label is encoded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from uform.core.errors import InputError
from uform.core.labels import probabilities, rows

CLIP = {"kind": "softmax", "scale": 100.0, "bias": 0.0}


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_rows_that_are_not_unit_are_refused_by_index() -> None:
    """A row never normalised (transformers' get_image_features, a prefix of an embedding, a
    zero row) gave other probabilities than its unit row: scale x dot product is not scale x
    cosine (a CLIP softmax of 0.558 for the first label became 0.732 for the row doubled)."""
    good = unit(np.random.default_rng(0).normal(size=(3, 8)))
    for bad, norm in ((good * 2, "2"), (good[:, :4], None), (np.zeros((1, 8)), "0")):
        bad = np.array(bad)
        if norm is None:  # the first four dimensions of unit rows: a Matryoshka-style prefix
            bad = np.concatenate([bad, np.zeros_like(bad)], axis=1)
            norm = f"{np.linalg.norm(bad[0]):.6g}"
        with pytest.raises(ValueError, match=rf"^embeddings: row 0 has norm {norm}, not 1: label probabilities compare unit rows \(an encode verb's embeddings, or rows divided by their norms\)$"):
            rows(bad, 8)
    mixed = good.copy()
    mixed[2] *= 1.05
    with pytest.raises(ValueError, match=r"^embeddings: row 2 has norm 1.05, not 1"):
        rows(mixed, 8)


def test_f16_rows_are_refused_f32_and_f64_taken() -> None:
    """docs/api.md takes an encode verb's rows in F32: F16 rows (outputs_scalar=Scalar.F16, an
    index stored in f16) were taken, and their rounding moved these CLIP probabilities by 3.3e-4
    at a scale of 100, past the 2e-4 uform keeps to transformers."""
    rng = np.random.default_rng(1)
    items = unit(rng.normal(size=(16, 512))).astype(np.float32)
    for dtype in (np.float16, np.int8):
        with pytest.raises(TypeError, match=rf"^embeddings must be float32 \(or float64\) rows \(outputs_scalar=Scalar.F32\), got {np.dtype(dtype).name}$"):
            rows(items.astype(dtype), 512)
    assert np.array_equal(rows(items, 512), items.astype(np.float64))
    assert np.array_equal(rows(items.astype(np.float64), 512), items.astype(np.float64))
    assert rows(items[0], 512).shape == (1, 512)


def test_utf8_refusal_has_one_wording_the_text_plugins(tmp_path: Path) -> None:
    """labels.py and calibrate.py each spelled their own "text is not encodable as UTF-8" message;
    they now give the text plugin's utf8_of reason (uform.verbs), named by the label or the line."""
    from uform.calibrate import read_examples
    from uform.core.labels import label_texts
    from uform.verbs import utf8_of

    with pytest.raises(InputError) as refused:
        utf8_of(1, "ok\ud800")
    reason = refused.value.reason
    assert reason == "text is not encodable as UTF-8 (surrogates not allowed at 2)"
    with pytest.raises(ValueError) as labels:
        label_texts(["cat", "ok\ud800"], utf8_of)
    assert str(labels.value) == f"labels[1]: {reason}"
    examples = tmp_path / "ex.jsonl"
    examples.write_text('{"text": "fine", "choices": "AB", "answer": 0}\n{"text": "ok\\ud800", "choices": "AB", "answer": 0}\n')
    with pytest.raises(ValueError) as line:
        read_examples(examples)
    assert str(line.value) == f"{examples}:2: {reason}"
    root = Path(__file__).parents[1] / "uform"
    spelled = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "encodable as UTF-8" in p.read_text(encoding="utf-8"))
    assert spelled == ["plugins/media/text.py"]
