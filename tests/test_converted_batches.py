"""A batch of texts of different lengths through a converted CLIP, SigLIP and open_clip: each
row equals the text encoded alone, and the family's own model given that text alone (transformers'
tokenizer output with ``truncation=True, max_length=context``; SigLIP's ``input_ids`` padded to its
context with no attention mask, as trained; open_clip's ``encode_text``), on every load."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf_models
import uform
from uform import Arena, Scalar
from uform.convert import convert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# lengths from 1 token to past the context (CLIP 77, the small SigLIP 16)
TEXTS = ["a", "a photo of a dog on the beach at sunset with friends", "", "x " * 100, "日本語のテキスト", "emoji 🐱🐶", "  spaced   out  ", "dog"]
BOUNDS = {Scalar.F32: 0.99999, Scalar.BF16: 0.9995, Scalar.E4M3: 0.99}  # docs/models.md


def _unit(x: Any) -> np.ndarray:
    x = np.asarray(getattr(x, "pooler_output", x), np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)  # type: ignore[no-any-return]


def _hf_alone(directory: Path, family: str, masked: bool = False) -> np.ndarray:
    model = transformers.AutoModel.from_pretrained(directory).eval()
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    context = model.config.text_config.max_position_embeddings
    rows = []
    for text in TEXTS:
        padding: Any = "max_length" if family == "siglip" else False
        enc = tok([text], truncation=True, max_length=context, padding=padding, return_tensors="pt")
        kwargs = dict(enc) if family == "clip" or masked else {"input_ids": enc["input_ids"]}
        with torch.no_grad():
            rows.append(_unit(model.get_text_features(**kwargs))[0])
    return np.stack(rows)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    tmp = tmp_path_factory.mktemp("families")
    out: dict[str, tuple[Path, np.ndarray]] = {}
    for family, make in (("clip", hf_models.make_clip), ("siglip", hf_models.make_siglip)):
        directory = make(tmp / family)
        convert(directory, tmp / f"{family}.safetensors", dtype="f32")
        out[family] = (tmp / f"{family}.safetensors", _hf_alone(directory, family))
    if importlib.util.find_spec("open_clip") is not None:
        import open_clip

        directory, model = hf_models.make_open_clip(tmp / "oc")
        convert(directory, tmp / "oc.safetensors", dtype="f32")
        tok = open_clip.get_tokenizer("ViT-B-32")
        with torch.no_grad():
            out["open_clip"] = (tmp / "oc.safetensors", np.stack([_unit(model.encode_text(tok([t])))[0] for t in TEXTS]))
    return out


@pytest.mark.parametrize("quantization", list(BOUNDS), ids=lambda q: q.name)
@pytest.mark.parametrize("family", ["clip", "siglip", "open_clip"])
def test_a_batch_of_lengths_equals_each_text_alone_and_the_family_model(families: dict[str, Any], family: str, quantization: Scalar) -> None:
    if family not in families:
        pytest.skip("open_clip_torch is not installed")
    path, reference = families[family]
    with uform.Model.load_ram(path, quantization=quantization) as m:
        batch = np.asarray(m.text_encode(TEXTS, Arena()).embeddings)
        alone = np.stack([np.asarray(m.text_encode([t], Arena()).embeddings)[0] for t in TEXTS])
    assert np.abs(batch - alone).max() <= 1e-6
    cos = (batch * reference).sum(1)
    assert [t[:20] for t, c in zip(TEXTS, cos) if c < BOUNDS[quantization]] == []


def main() -> None:
    """docs/models.md's SigLIP figure (``python tests/test_converted_batches.py``): transformers 5's
    SiglipTokenizer returns an attention_mask; given it, SiglipModel hides the padding SigLIP was
    trained seeing. Cosine of uform's rows to transformers' with and without that mask."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        directory = hf_models.make_siglip(Path(tmp) / "siglip")
        convert(directory, Path(tmp) / "s.safetensors", dtype="f32")
        with uform.Model.load_ram(Path(tmp) / "s.safetensors", quantization=Scalar.F32) as m:
            rows = np.asarray(m.text_encode(TEXTS, Arena()).embeddings)
        for masked in (False, True):
            cos = (rows * _hf_alone(directory, "siglip", masked)).sum(1)
            print(f"SigLIP, transformers {'with' if masked else 'without'} the attention_mask: cosine per text {np.round(cos, 4).tolist()}")


if __name__ == "__main__":
    main()
