"""``projection: "mlp"`` (docs/checkpoint.md, Version 2): the pooled row through Linear, ReLU,
Linear (both with bias), then unit-normalised, as CLAP's ``ClapProjectionLayer`` projects."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from uform import Arena, CheckpointError, Model, Scalar
from uform.core import checkpoint
from uform.core.config import make_config
from uform.core.host import get_host

torch = pytest.importorskip("torch")

TEXTS = ["", "a", "the sound of rain on a roof", "ünïcödé ✓ 🐈", "x" * 300]


def _files(tmp_path: Path, drop: str = "") -> tuple[Path, Path, dict[str, np.ndarray]]:
    """A tiny version-1 text tower (projection ``linear``) and the same tower as version 2
    with ``projection: "mlp"`` (its ``text.projection.0``/``.1`` drawn at random; ``drop``
    left out)."""
    config, tensors = checkpoint.new(get_host(), "tiny", seed=7, modalities=["text"])
    v1 = tmp_path / "v1.safetensors"
    checkpoint.save(v1, config, tensors)
    rng = np.random.default_rng(3)
    width, d = config.towers["text"]["width"], config.dimensions
    mlp = {
        "text.projection.0.weight": rng.standard_normal((d, width), np.float32) * 0.2,
        "text.projection.0.bias": rng.standard_normal(d, np.float32) * 0.2,
        "text.projection.1.weight": rng.standard_normal((d, d), np.float32) * 0.2,
        "text.projection.1.bias": rng.standard_normal(d, np.float32) * 0.2,
    }
    tower = dict(config.towers["text"]) | {"projection": "mlp"}
    v2_config = make_config(config.dimensions, config.context, {"text": tower}, format_version=2)
    v2_tensors = {k: v.astype(np.float32) for k, v in (tensors | mlp).items() if k not in ("text.projection.weight", drop)}
    v2 = tmp_path / "v2.safetensors"
    checkpoint.save(v2, v2_config, v2_tensors)
    return v1, v2, mlp


def test_an_mlp_projection_is_linear_relu_linear_then_normalised(tmp_path: Path) -> None:
    from uform.exporters.reference import ReferenceModel

    v1, v2, mlp = _files(tmp_path)
    reference = ReferenceModel.from_checkpoint(v1).towers["text"]
    d, w = mlp["text.projection.0.weight"].shape
    head = torch.nn.Sequential(torch.nn.Linear(w, d), torch.nn.ReLU(), torch.nn.Linear(d, d))
    with torch.no_grad():
        for i, layer in ((0, head[0]), (1, head[2])):
            layer.weight.copy_(torch.from_numpy(mlp[f"text.projection.{i}.weight"]))
            layer.bias.copy_(torch.from_numpy(mlp[f"text.projection.{i}.bias"]))
    reference.projection = head  # the reference's pooled class token, through the MLP
    with torch.no_grad():
        expected = reference.encode([t.encode() for t in TEXTS])[0].numpy()
    with Model.load_ram(v2, quantization=Scalar.F32) as model:
        got = model.text_encode(TEXTS, Arena()).embeddings
    assert got.shape == (len(TEXTS), d)
    np.testing.assert_allclose(got, expected, atol=2e-6)
    assert min(float(a @ b) for a, b in zip(got, expected)) > 0.999999


def test_an_mlp_projection_without_its_second_layer_is_refused_by_name(tmp_path: Path) -> None:
    _, v2, _ = _files(tmp_path, drop="text.projection.1.bias")
    with pytest.raises(CheckpointError, match=r"text\.projection\.1\.bias"):
        Model.load_ram(v2)
