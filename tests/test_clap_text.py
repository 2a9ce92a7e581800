"""CLAP's RoBERTa text tower as a version-2 file (docs/checkpoint.md: ``norm: post``, ``pooling:
first_token``, ``pooler: tanh``, ``projection: mlp``) against transformers' ``ClapModel.get_text_features``
with its tokenizer (``padding=True, truncation=True``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uform import Arena, CheckpointError, Model, Scalar
from uform.core.config import make_config
from uform.core.host import get_host
from uform.plugins.text import TextEncodeStats

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from clap_text_models import TEXTS, clap_text_file, make_clap  # noqa: E402


@pytest.fixture(scope="module")
def clap(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    """A random ClapModel's folder, its text tower as a uform file, and get_text_features of TEXTS."""
    directory = make_clap(tmp_path_factory.mktemp("clap"))
    model = transformers.ClapModel.from_pretrained(str(directory)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    with torch.no_grad():
        want = model.get_text_features(**tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")).pooler_output.numpy()
    return directory, clap_text_file(directory, directory / "text.safetensors"), want


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(np.asarray(a, np.float64) * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_the_text_tower_equals_get_text_features(clap: tuple[Path, Path, np.ndarray]) -> None:
    _, path, want = clap
    stats = TextEncodeStats()
    with Model.load_ram(path, quantization=Scalar.F32) as model:
        got = model.text_encode(TEXTS, Arena(), stats=stats).embeddings
    assert _cos(got, want).min() >= 0.99999
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert ((got @ want.T).argmax(axis=1) == np.arange(len(TEXTS))).all()  # each text nearest its own reference
    assert stats.truncated_items == 1  # the 900 numbers, cut at 512 tokens as truncation=True cuts them


@pytest.mark.parametrize("quantization,bound,mean", [(Scalar.BF16, 0.9999, 0.9999), (Scalar.E4M3, 0.98, 0.995)])
def test_bf16_and_e4m3_stay_within_the_bounds_of_uforms_towers(clap: tuple[Path, Path, np.ndarray], quantization: Scalar, bound: float, mean: float) -> None:
    _, path, want = clap
    with Model.load_ram(path, quantization=quantization) as model:
        cos = _cos(model.text_encode(TEXTS, Arena()).embeddings, want)
    assert cos.min() >= bound and cos.mean() >= mean


def test_a_text_alone_equals_it_in_a_batch(clap: tuple[Path, Path, np.ndarray]) -> None:
    _, path, _ = clap
    with Model.load_ram(path, quantization=Scalar.F32) as model:
        batch = model.text_encode(TEXTS, Arena()).embeddings
        alone = np.stack([model.text_encode([t], Arena()).embeddings[0] for t in TEXTS[:6]])
    np.testing.assert_allclose(alone, batch[:6], atol=1e-6)


def _tiny_text(**fields: Any) -> dict[str, Any]:
    return {"width": 64, "depth": 1, "heads": 2, "mlp_width": 128, "token_width": 0} | fields


@pytest.mark.parametrize(
    "tower,message",
    [
        ({"text": _tiny_text(pooling="first_token")}, r"towers\.text\.pooling: 'first_token' .* \(class_token false\)"),
        ({"text": _tiny_text(pooler="max")}, r"towers\.text\.pooler: expected one of 'none', 'tanh', got 'max'"),
        ({"text": _tiny_text(norm="middle")}, r"towers\.text\.norm: expected one of 'pre', 'post', got 'middle'"),
        ({"text": _tiny_text(positions="non_pad")}, r"towers\.text\.positions: 'non_pad' needs tokenizer 'tokenizer\.json' and class_token false"),
        ({"image": {"width": 64, "depth": 1, "heads": 2, "mlp_width": 128, "image_size": 32, "patch_size": 16, "norm": "post"}}, r"towers\.image\.norm: not a field of an image tower"),
    ],
)
def test_the_new_fields_are_refused_by_name_where_they_do_not_apply(tmp_path: Path, tower: dict[str, Any], message: str) -> None:
    config = make_config(32, 16, tower, format_version=2)
    name = next(iter(tower))
    spec = get_host().modalities[name].tower
    with pytest.raises(CheckpointError, match=message):
        spec.tensors(spec.read(config.towers[name], config), config)


def test_a_version_1_file_may_not_carry_them() -> None:
    for field, value in (("norm", "post"), ("pooler", "tanh"), ("positions", "non_pad")):
        with pytest.raises(CheckpointError, match=rf"config field towers\.text\.{field}: needs format_version 2"):
            make_config(32, 16, {"text": _tiny_text(**{field: value})})


def test_a_post_norm_tower_has_no_ln_final(clap: tuple[Path, Path, np.ndarray]) -> None:
    from safetensors.numpy import load_file

    names = set(load_file(str(clap[1])))
    assert "text.ln_final.weight" not in names and {"text.blocks.1.ln2.weight", "text.pooler.weight", "text.projection.1.bias"} <= names
