"""Export forms: TorchScript, ONNX and INT8 ONNX written by export_artifact, read back by load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("huggingface_hub")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
from torch import nn  # noqa: E402

from fastermodels import FasterModel, export_artifact, load, state_hash  # noqa: E402
from test_fastermodels_nets import (MLP_KWARGS, MLP_SOURCE, RESNET_KWARGS,  # noqa: E402
                                    RESNET_SOURCE, pruned_mlp, pruned_resnet18)
from uform.exporters import ARTIFACT_FILES, INT8_RECIPE, ExportMismatchError, ExportReport  # noqa: E402
from uform.exporters.torch_forms import ATOL, RTOL  # noqa: E402

EXAMPLE = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
BATCH3 = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(3))
INT8_REL = 0.1  # INT8 max abs diff ≤ 10 % of the largest |output| (measured 3–6 % on this net)


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])  # the documented one line


def _run_onnx(path: Path, x: torch.Tensor) -> np.ndarray:
    return np.asarray(_session(path).run(None, {"input": x.numpy()})[0])


@pytest.fixture(scope="module")
def pruned() -> nn.Module:
    return pruned_resnet18()


@pytest.fixture(scope="module")
def fm(pruned: nn.Module) -> FasterModel:
    return FasterModel.wrap(pruned, RESNET_SOURCE, RESNET_KWARGS, recipe={"prune": "odd widths"})


@pytest.fixture(scope="module")
def full(fm: FasterModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExportReport]:
    directory = tmp_path_factory.mktemp("full")
    return directory, export_artifact(fm, directory, example_input=EXAMPLE)


@pytest.fixture(scope="module")
def int8(fm: FasterModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExportReport]:
    directory = tmp_path_factory.mktemp("int8")
    return directory, export_artifact(fm, directory, example_input=EXAMPLE, int8=True)


def _expected(pruned: nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return pruned(x).numpy()


def _scale(pruned: nn.Module, x: torch.Tensor) -> float:
    return float(np.abs(_expected(pruned, x)).max())


def test_export_writes_all_three_forms(full: tuple[Path, ExportReport]) -> None:
    directory, report = full
    names = {p.name for p in directory.iterdir()}
    assert set(ARTIFACT_FILES.values()) <= names and "config.json" in names
    assert report.files == {f: directory / n for f, n in ARTIFACT_FILES.items()}
    assert report.max_abs_diff["torchscript"] <= 1e-5
    assert report.max_abs_diff["onnx"] <= 1e-4


def test_load_auto_prefers_safetensors(full: tuple[Path, ExportReport], fm: FasterModel) -> None:
    model = load(full[0])
    assert isinstance(model, FasterModel) and not model.training
    assert state_hash(model) == state_hash(fm)


def test_each_form_matches_the_pruned_net(full: tuple[Path, ExportReport], pruned: nn.Module) -> None:
    directory = full[0]
    expected = _expected(pruned, BATCH3)  # batch 3: the exports were made at batch 1
    tolerance = {"safetensors": 0.0, "torchscript": 1e-5, "onnx": 1e-4}
    for form, tol in tolerance.items():
        model = load(directory, form=form, trust_remote_code=form == "torchscript")  # TorchScript is code
        if form == "onnx":
            assert isinstance(model, Path) and model == directory / "model.onnx"
            got = _run_onnx(model, BATCH3)
        else:
            assert isinstance(model, nn.Module) and not model.training
            with torch.no_grad():
                got = model(BATCH3).numpy()
        assert np.abs(got - expected).max() <= tol, form
        assert np.allclose(got, expected, atol=ATOL, rtol=RTOL)


def test_torchscript_is_a_traced_module(full: tuple[Path, ExportReport]) -> None:
    module = load(full[0], form="torchscript", trust_remote_code=True)
    assert isinstance(module, torch.jit.ScriptModule) and not module.training


def test_the_onnx_file_is_clean(full: tuple[Path, ExportReport]) -> None:
    path = full[0] / "model.onnx"
    onnx.checker.check_model(str(path))
    proto = onnx.load(str(path))
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17
    for value in (*proto.graph.input, *proto.graph.output):
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch"


def test_int8_variant_has_no_safetensors_and_load_falls_through(
        int8: tuple[Path, ExportReport], pruned: nn.Module) -> None:
    directory, report = int8
    assert {p.name for p in directory.iterdir()} == {"model.onnx", "config.json"}
    assert report.int8 and report.max_abs_diff["onnx"] <= INT8_REL * _scale(pruned, EXAMPLE)
    path = load(directory)
    assert path == directory / "model.onnx"
    got, expected = _run_onnx(path, BATCH3), _expected(pruned, BATCH3)
    assert np.abs(got - expected).max() <= INT8_REL * np.abs(expected).max()
    assert json.loads((directory / "config.json").read_text())["recipe"]["int8"] == INT8_RECIPE


def test_int8_quantises_every_conv_and_the_linear(int8: tuple[Path, ExportReport],
                                                  full: tuple[Path, ExportReport]) -> None:
    proto = onnx.load(str(int8[0] / "model.onnx"))
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["ConvInteger"] == 20 and ops["MatMulInteger"] == 1  # 17 convs + 3 downsamples; fc
    assert ops["Conv"] == ops["Gemm"] == ops["MatMul"] == 0
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    for node in proto.graph.node:  # weights int8: conv per tensor, fc per output column
        if node.op_type in ("ConvInteger", "MatMulInteger"):
            weight = inits[node.input[1]]
            scale = inits[node.input[1].replace("_quantized", "_scale")]
            assert weight.dtype == np.int8
            assert scale.shape == (() if node.op_type == "ConvInteger" else (10,))
    size = os.path.getsize(int8[0] / "model.onnx")
    assert size < os.path.getsize(full[0] / "model.onnx") / 3


def test_pruned_mlp_exports_every_form(tmp_path: Path) -> None:
    net = pruned_mlp()
    fm = FasterModel.wrap(net, MLP_SOURCE, MLP_KWARGS)
    x = torch.randn(4, 16)
    report = export_artifact(fm, tmp_path, example_input=torch.randn(1, 16), torchscript_mode="script")
    assert set(report.files) == set(ARTIFACT_FILES)
    expected = _expected(net, x)
    with torch.no_grad():
        assert np.array_equal(load(tmp_path, trust_remote_code=True)(x).numpy(), expected)  # a test-suite factory
        assert np.abs(load(tmp_path, form="torchscript", trust_remote_code=True)(x).numpy() - expected).max() <= 1e-5
    assert np.abs(_run_onnx(load(tmp_path, form="onnx"), x) - expected).max() <= 1e-4


def test_a_bare_module_exports_torchscript_and_onnx(tmp_path: Path) -> None:
    net = pruned_mlp()
    report = export_artifact(net, tmp_path, ("torchscript", "onnx"), example_input=torch.randn(2, 16))
    assert set(report.files) == {"torchscript", "onnx"}
    assert not (tmp_path / "config.json").exists()
    with pytest.raises(TypeError, match="safetensors form needs a FasterModel"):
        export_artifact(net, tmp_path, ("safetensors",), example_input=torch.randn(2, 16))


class _Noisy(nn.Module):
    """A net no written form reproduces: every run draws new noise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # the trace's own check sees the noise too
def test_a_failed_export_leaves_the_artifact_as_it_was(tmp_path: Path) -> None:
    """A form that failed its check used to stay in the artifact beside the good ones (and an
    exporter's error left what was written before it): now nothing is renamed in until every
    form is written and checked."""
    fm = FasterModel.wrap(pruned_mlp(), MLP_SOURCE, MLP_KWARGS)
    export_artifact(fm, tmp_path, example_input=torch.randn(2, 16))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"config.json", "model.safetensors", "model.torchscript.pt", "model.onnx", "README.md"}
    with pytest.raises(ExportMismatchError, match=r"model.torchscript.pt: max abs diff .* nothing was written"):
        export_artifact(_Noisy(), tmp_path, ("torchscript", "onnx"), example_input=torch.randn(2, 16))
    with pytest.raises(ExportMismatchError, match=r"model.onnx: max abs diff .* nothing was written"):
        export_artifact(_Noisy(), tmp_path / "fresh", ("onnx",), example_input=torch.randn(2, 16))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no .partial left, no folder made
    assert load(tmp_path, trust_remote_code=True).spec == fm.spec


class _Reshaped(nn.Module):
    """Eager, its output is (batch, 4); traced (as TorchScript and the ONNX exporter see it), (1, batch, 4)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return y.unsqueeze(0) if torch.jit.is_tracing() else y


@pytest.mark.parametrize("form", ["torchscript", "onnx"])
def test_an_export_of_another_shape_than_eager_is_refused(tmp_path: Path, form: str) -> None:
    """Same values, another shape: numpy's broadcasting passed (1, 1, 4) as close to (1, 4), max abs diff 0."""
    with pytest.raises(ExportMismatchError, match=rf"{ARTIFACT_FILES[form]}: outputs of shapes \[\(1, 1, 4\)\] "
                                                  r"where eager PyTorch gives \[\(1, 4\)\]; nothing was written"):
        export_artifact(_Reshaped(), tmp_path, (form,), example_input=torch.randn(1, 4))
    assert list(tmp_path.iterdir()) == []


def test_export_restores_the_training_flag(tmp_path: Path) -> None:
    net = pruned_mlp().train()
    export_artifact(net, tmp_path, ("onnx",), example_input=torch.randn(2, 16))
    assert net.training


@pytest.mark.parametrize("kwargs, error", [
    ({"forms": ("pickle",)}, "unknown form"),
    ({"forms": ()}, r"forms is empty: name at least one of safetensors, torchscript, onnx \(or leave it out for all\)"),
    ({"forms": ("torchscript", "onnx"), "int8": True}, "INT8 variant is ONNX only"),
    ({"forms": ("onnx",), "opset": 13}, "opset must be at least 17"),
    ({"forms": ("torchscript",), "torchscript_mode": "compile"}, "'trace' or 'script'"),
])
def test_export_argument_errors(tmp_path: Path, kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        export_artifact(pruned_mlp(), tmp_path, example_input=torch.randn(2, 16), **kwargs)  # type: ignore[arg-type]


def test_importing_uform_exporters_does_not_import_torch() -> None:
    root = Path(__file__).resolve().parents[1]
    code = "import sys, uform.exporters; assert 'torch' not in sys.modules, 'torch was imported'"
    env = {**os.environ, "PYTHONPATH": str(root)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_net_is_published_with_fp32_forms(tmp_path: Path, dtype: torch.dtype) -> None:
    """An fp16 net's ONNX was traced in fp16 and refused against its own eager output
    (ExportMismatchError, 1.2e-4 on this MLP), a bf16 net's was "TypeError: Got unsupported
    ScalarType BFloat16" (and its ONNX no runtime loads): both forms are FP32, as documented."""
    net = pruned_mlp().to(dtype)
    fm = FasterModel.wrap(net, MLP_SOURCE, MLP_KWARGS)
    report = export_artifact(fm, tmp_path, example_input=torch.randn(2, 16, dtype=dtype))
    assert report.max_abs_diff["torchscript"] == 0.0 and report.max_abs_diff["onnx"] <= 1e-5
    x = torch.randn(5, 16)
    with torch.no_grad():
        wide = pruned_mlp().eval()
        wide.load_state_dict({k: v.float() for k, v in net.state_dict().items()})
        expected = wide(x).numpy()
        assert np.allclose(net.eval()(x.to(dtype)).float().numpy(), expected, atol=0.05)  # the same net
    session = _session(load(tmp_path, form="onnx"))
    assert [i.type for i in session.get_inputs()] == ["tensor(float)"]
    assert np.allclose(session.run(None, {"input": x.numpy()})[0], expected, atol=ATOL, rtol=RTOL)
    module = load(tmp_path, form="torchscript", trust_remote_code=True)
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    with torch.no_grad():
        assert np.array_equal(module(x).numpy(), expected)
    back = load(tmp_path, trust_remote_code=True)  # the safetensors form keeps the net's own dtype
    assert state_hash(back) == state_hash(fm) and {p.dtype for p in back.parameters()} == {dtype}
    assert {p.dtype for p in net.parameters()} == {dtype}  # the net is left as it was


def test_weights_past_2gib_are_gathered_in_one_data_file(tmp_path: Path) -> None:
    """Past protobuf's 2 GiB torch's exporter writes each weight beside model.onnx in a file
    named after it ('2.weight', 'onnx__MatMul_8': measured on a 2.0 GiB MLP), which load's Hub
    route (model.onnx.*) never fetched and which replaced any file of that name in the artifact:
    export_onnx gathers them into model.onnx.data, readable as model.onnx is (onnx writes 0600)."""
    from onnx import TensorProto, helper, numpy_helper

    from uform.exporters.torch_forms import gathered

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), n) for n in ("2.weight", "onnx__MatMul_8")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "2.weight"], ["h"]), helper.make_node("MatMul", ["h", "onnx__MatMul_8"], ["output"])],
        "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 32])], weights)
    exported = tmp_path / "torch" / "model.onnx"
    exported.parent.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(exported),
              save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)  # as torch writes it
    assert {p.name for p in exported.parent.iterdir()} == {"model.onnx", "2.weight", "onnx__MatMul_8"}
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "model.onnx.data").write_bytes(b"an earlier export's weights")
    gathered(exported, artifact / "model.onnx")
    assert {p.name for p in artifact.iterdir()} == {"model.onnx", "model.onnx.data"}
    assert os.path.getsize(artifact / "model.onnx.data") == 2 * 32 * 32 * 4
    mode = (artifact / "model.onnx").stat().st_mode & 0o777
    assert (artifact / "model.onnx.data").stat().st_mode & 0o777 == mode and mode & 0o044 == 0o044
    x = rng.standard_normal((3, 32)).astype(np.float32)
    want = _session(exported).run(None, {"input": x})[0]
    assert np.array_equal(_session(artifact / "model.onnx").run(None, {"input": x})[0], want)


def test_a_model_onnx_data_of_an_earlier_export_goes_with_its_model_onnx(tmp_path: Path) -> None:
    (tmp_path / "model.onnx.data").write_bytes(b"weights an earlier, larger model.onnx named")
    (tmp_path / "notes.txt").write_bytes(b"the user's")
    export_artifact(pruned_mlp(), tmp_path, ("onnx",), example_input=torch.randn(2, 16))
    assert {p.name for p in tmp_path.iterdir()} == {"model.onnx", "notes.txt"}


def test_an_empty_artifact_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # Path('') is the working folder: the forms were written there
    with pytest.raises(ValueError, match="the artifact directory is empty: name the folder to write the forms to"):
        export_artifact(pruned_mlp(), "", ("onnx",), example_input=torch.randn(2, 16))
    assert list(tmp_path.iterdir()) == []


def test_forms_given_as_a_string_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"forms takes a sequence of forms, e.g. \('onnx',\), not the string 'onnx'"):
        export_artifact(pruned_mlp(), tmp_path / "a", "onnx", example_input=torch.randn(2, 16))
    assert not (tmp_path / "a").exists()
