"""fastermodels: resolve, spec_from, state_hash, FasterModel (strict, eval, layout) and load errors."""

from __future__ import annotations

import hashlib
import json
import socket
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("huggingface_hub")
sys.path.insert(0, str(Path(__file__).parent))

from safetensors.torch import load_file  # noqa: E402
from torch import nn  # noqa: E402

import fastermodels  # noqa: E402
from fastermodels import (ArtifactNotFoundError, FasterModel, SpecError,  # noqa: E402
                          WeightsMismatchError, load, resolve, spec_from, state_hash)
from test_fastermodels_nets import (MLP_KEEP, MLP_KWARGS, MLP_SOURCE, RESNET_KWARGS,  # noqa: E402
                                    RESNET_SOURCE, pruned_mlp, pruned_resnet18, tied_embeddings)

X = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
RECIPE = {"prune": "layer1/layer2 inner convs to odd widths, L1 norm"}
PROVENANCE = {"torch": torch.__version__, "weights": "random init, seed 0"}


@pytest.fixture(scope="module")
def pruned() -> nn.Module:
    return pruned_resnet18()


@pytest.fixture(scope="module")
def fm(pruned: nn.Module) -> FasterModel:
    return FasterModel.wrap(pruned, RESNET_SOURCE, RESNET_KWARGS, recipe=RECIPE, provenance=PROVENANCE)


@pytest.fixture(scope="module")
def saved(fm: FasterModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("artifact")
    fm.save_pretrained(directory)
    return directory


# -- resolve -----------------------------------------------------------------------------

def test_resolve_imports_the_factory() -> None:
    import torchvision

    assert resolve("torchvision.models.resnet18") is torchvision.models.resnet18


@pytest.mark.parametrize("source", ["resnet18", "torchvision.models.no_such_net",
                                    "no_such_package.factory", "", "torchvision.models."])
def test_resolve_explains_a_dotted_path(source: str) -> None:
    with pytest.raises(ImportError, match=r"dotted path.*e\.g\. 'torchvision\.models\.resnet18'"):
        resolve(source)


# -- spec_from ---------------------------------------------------------------------------

class MyConv(nn.Conv2d):
    """A subclass: not recorded, since it might not rebuild from Conv2d's arguments."""


def test_spec_from_records_exact_types_only() -> None:
    net = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1, bias=False), MyConv(5, 5, 1), nn.BatchNorm2d(5),
                        nn.Flatten(), nn.Linear(5 * 4 * 4, 7), nn.BatchNorm1d(7, eps=1e-3))
    spec = spec_from(net)
    assert set(spec) == {"0", "2", "4", "5"}
    assert spec["0"] == {"type": "Conv2d", "in_channels": 3, "out_channels": 5, "kernel_size": [3, 3],
                         "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1,
                         "padding_mode": "zeros", "bias": False}
    assert spec["4"] == {"type": "Linear", "in_features": 80, "out_features": 7, "bias": True}
    assert spec["5"] == {"type": "BatchNorm1d", "num_features": 7, "eps": 1e-3, "momentum": 0.1,
                         "affine": True, "track_running_stats": True}
    assert spec["2"]["type"] == "BatchNorm2d"
    assert json.loads(json.dumps(spec)) == spec  # JSON-native, as config.json needs


def test_spec_from_reads_the_pruned_widths(pruned: nn.Module) -> None:
    spec = spec_from(pruned)
    assert spec["layer1.0.conv1"]["out_channels"] == 37
    assert spec["layer1.0.bn1"]["num_features"] == 37
    assert spec["layer2.1.conv2"]["in_channels"] == 77
    assert spec["fc"] == {"type": "Linear", "in_features": 512, "out_features": 10, "bias": True}


# -- state_hash --------------------------------------------------------------------------

def test_state_hash_is_sha256_of_key_shape_dtype_and_bytes() -> None:
    state = OrderedDict(b=torch.arange(6, dtype=torch.int64).reshape(2, 3), a=torch.tensor(1.5))
    expected = hashlib.sha256()
    for key in ("a", "b"):
        t = state[key]
        expected.update(f"{key}{tuple(t.shape)}{t.dtype}".encode() + t.numpy().tobytes())
    assert state_hash(state) == expected.hexdigest()
    assert state_hash(OrderedDict(reversed(state.items()))) == expected.hexdigest()


def test_state_hash_sees_values_shapes_and_dtypes(pruned: nn.Module) -> None:
    state = {k: v.clone() for k, v in pruned.state_dict().items()}
    base = state_hash(state)
    assert state_hash(pruned) == base
    assert state_hash({**state, "fc.bias": state["fc.bias"] + 1e-6}) != base
    assert state_hash({**state, "fc.bias": state["fc.bias"].double()}) != base
    assert state_hash({**state, "fc.bias": state["fc.bias"].reshape(2, 5)}) != base
    assert len(state_hash({"w": torch.ones(3, dtype=torch.bfloat16)})) == 64


# -- FasterModel -------------------------------------------------------------------------

def test_wrap_rebuilds_the_net_from_source_and_spec(pruned: nn.Module, fm: FasterModel) -> None:
    assert fm.net is not pruned and not fm.training and not fm.net.training
    assert fm.source == RESNET_SOURCE and fm.recipe == RECIPE and fm.provenance == PROVENANCE
    assert fm.net.layer1[0].conv1.out_channels == 37
    assert state_hash(fm.net) == state_hash(pruned)
    with torch.no_grad():
        assert torch.equal(fm(X), pruned(X))


def test_save_pretrained_writes_the_release_layout(fm: FasterModel, saved: Path) -> None:
    assert {"config.json", "model.safetensors"} <= {p.name for p in saved.iterdir()}
    config_text = (saved / "config.json").read_text()
    config = json.loads(config_text)
    assert set(config) == {"source", "source_kwargs", "modules", "recipe", "provenance"}
    assert config == {"source": RESNET_SOURCE, "source_kwargs": RESNET_KWARGS,
                      "modules": spec_from(fm.net), "recipe": RECIPE, "provenance": PROVENANCE}
    # byte for byte what PyTorchModelHubMixin writes for these init arguments
    assert config_text == json.dumps(fm._hub_mixin_config, sort_keys=True, indent=2)
    weights = load_file(saved / "model.safetensors")
    assert set(weights) == {f"net.{k}" for k in fm.net.state_dict()}
    assert state_hash(weights) == state_hash(fm)


def test_from_pretrained_round_trips(fm: FasterModel, saved: Path) -> None:
    back = FasterModel.from_pretrained(saved)
    assert isinstance(back, FasterModel) and not back.training and not back.net.training
    assert state_hash(back) == state_hash(fm)
    assert back.recipe == RECIPE and back.provenance == PROVENANCE and back.spec == fm.spec
    with torch.no_grad():
        assert torch.equal(back(X), fm(X))


def test_a_saved_and_reloaded_artifact_saves_the_same_files(saved: Path, tmp_path: Path) -> None:
    FasterModel.from_pretrained(saved).save_pretrained(tmp_path)
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / name).read_bytes() == (saved / name).read_bytes()


def test_pruned_mlp_with_batchnorm1d_round_trips(tmp_path: Path) -> None:
    net = pruned_mlp()
    fm = FasterModel.wrap(net, MLP_SOURCE, MLP_KWARGS)
    assert fm.spec is not None and fm.spec["1"]["type"] == "BatchNorm1d"
    assert fm.spec["1"]["num_features"] == MLP_KEEP
    fm.save_pretrained(tmp_path)
    back = load(tmp_path, trust_remote_code=True)  # the factory is this test suite's own module
    x = torch.randn(3, 16)
    assert isinstance(back, FasterModel) and not back.training
    with torch.no_grad():
        assert torch.equal(back(x), net(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_wrap_and_load_keep_the_dtype_of_the_weights(dtype: torch.dtype, tmp_path: Path) -> None:
    net = pruned_mlp().to(dtype)
    if dtype != torch.float64:
        net[1].to(torch.float32)  # a mixed net: an fp32 BatchNorm between low-precision Linears
    fm = FasterModel.wrap(net, MLP_SOURCE, MLP_KWARGS)  # was cast to the factory's fp32
    assert {k: v.dtype for k, v in fm.net.state_dict().items()} == {k: v.dtype for k, v in net.state_dict().items()}
    assert state_hash(fm.net) == state_hash(net)
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(3)).to(dtype)
    with torch.no_grad():
        assert fm.net[0].weight.requires_grad and torch.equal(fm(x), net(x))  # was: mat1 and mat2 must have the same dtype
        fm.net[0].weight.add_(1)
    assert state_hash(fm.net) != state_hash(net)  # a copy: the net it came from is left as it was
    fm = FasterModel.wrap(net, MLP_SOURCE, MLP_KWARGS)
    fm.save_pretrained(tmp_path)
    assert load_file(str(tmp_path / "model.safetensors"))["net.0.weight"].dtype == dtype
    back = load(tmp_path, trust_remote_code=True)
    assert isinstance(back, FasterModel) and state_hash(back) == state_hash(fm)  # was loaded as fp32
    with torch.no_grad():
        assert torch.equal(back(x), net(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tied_weights_round_trip_tied(dtype: torch.dtype, tmp_path: Path) -> None:
    net = tied_embeddings().to(dtype)
    fm = FasterModel.wrap(net, "test_fastermodels_nets.tied_embeddings", {})
    assert fm.net[0].weight is fm.net[1].weight and state_hash(fm.net) == state_hash(net)
    fm.save_pretrained(tmp_path)
    assert list(load_file(str(tmp_path / "model.safetensors"))) == ["net.0.weight"]  # written once, as safetensors must
    back = load(tmp_path, trust_remote_code=True)  # was WeightsMismatchError: missing (1): net.1.weight
    assert isinstance(back, FasterModel) and back.net[0].weight is back.net[1].weight
    assert state_hash(back) == state_hash(fm)


def test_a_spec_that_disagrees_with_the_weights_raises(saved: Path, tmp_path: Path) -> None:
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((saved / name).read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    config["modules"]["layer1.0.conv1"]["out_channels"] = 40
    config["modules"]["layer1.0.bn1"]["num_features"] = 40
    config["modules"]["layer1.0.conv2"]["in_channels"] = 40
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsMismatchError, match=r"net\.layer1\.0\.conv1\.weight \(weights \(37, 64, 3, 3\), model \(40, 64, 3, 3\)\)"):
        FasterModel.from_pretrained(tmp_path)
    with pytest.raises(WeightsMismatchError):
        load(tmp_path)


@pytest.mark.parametrize("damage", ["shape", "missing", "unexpected"])
def test_a_failed_load_leaves_the_model_untouched(fm: FasterModel, damage: str) -> None:
    before = state_hash(fm)
    state = {k: v + 1 if v.is_floating_point() else v for k, v in fm.state_dict().items()}
    if damage == "shape":
        state["net.layer2.0.bn1.running_mean"] = torch.zeros(128)
    elif damage == "missing":
        del state["net.fc.bias"]
    else:
        state["net.extra"] = torch.zeros(1)
    with pytest.raises(WeightsMismatchError, match="nothing was loaded"):
        fm.load_state_dict(state)
    assert state_hash(fm) == before


def test_loading_is_always_strict(fm: FasterModel, saved: Path) -> None:
    with pytest.raises(ValueError, match="always strict"):
        fm.load_state_dict(fm.state_dict(), strict=False)
    with pytest.raises(ValueError, match="always strict"):
        FasterModel.from_pretrained(saved, strict=False)


def test_a_spec_naming_an_unknown_module_raises() -> None:
    with pytest.raises(SpecError, match="'layer9.conv' is not in the source model"):
        FasterModel(RESNET_SOURCE, RESNET_KWARGS,
                    {"layer9.conv": {"type": "Linear", "in_features": 1, "out_features": 1}})
    with pytest.raises(SpecError, match="type 'Conv3d'"):
        FasterModel(RESNET_SOURCE, RESNET_KWARGS, {"fc": {"type": "Conv3d"}})


def test_wrap_refuses_a_change_the_spec_cannot_record() -> None:
    net = pruned_mlp()
    net[3] = type("PrunedLinear", (nn.Linear,), {})(MLP_KEEP, 4)  # a subclass: not in the spec
    net[0] = nn.Linear(16, MLP_KEEP)
    with pytest.raises(WeightsMismatchError, match=r"net\.3\.weight"):
        FasterModel.wrap(net, MLP_SOURCE, MLP_KWARGS)


def test_wrap_does_not_depend_on_the_training_flag(pruned: nn.Module) -> None:
    pruned.train()
    try:
        assert not FasterModel.wrap(pruned, RESNET_SOURCE, RESNET_KWARGS).training
    finally:
        pruned.eval()


def test_save_pretrained_refuses_a_config_that_is_not_json(fm: FasterModel, tmp_path: Path) -> None:
    odd = FasterModel(MLP_SOURCE, MLP_KWARGS, recipe={"step": object()})
    with pytest.raises(TypeError, match="config.json must be JSON"):
        odd.save_pretrained(tmp_path)


SAVE_LIMITED = """
import resource, sys
from fastermodels import FasterModel
from uform.core.files import OutputError
sys.path.insert(0, sys.argv[2])
from test_fastermodels_nets import MLP_KWARGS, MLP_SOURCE, pruned_mlp
fm = FasterModel.wrap(pruned_mlp(), MLP_SOURCE, MLP_KWARGS)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    fm.save_pretrained(sys.argv[1])
except OutputError as e:
    print(e)
"""


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def test_a_failed_save_leaves_the_old_artifact_whole(saved: Path, tmp_path: Path) -> None:
    """The mixin's own save removed the old config.json before writing, and wrote the weights in
    place: a save that failed left the artifact without its config (unloadable) or with half its
    weights. Now the old files stay as they were, and nothing is left beside them."""
    import shutil
    import subprocess

    artifact = tmp_path / "artifact"
    shutil.copytree(saved, artifact)
    before = files_of(artifact)
    odd = FasterModel(MLP_SOURCE, MLP_KWARGS, recipe={"step": object()})
    with pytest.raises(TypeError, match="config.json must be JSON"):
        odd.save_pretrained(artifact)
    assert files_of(artifact) == before
    run = subprocess.run([sys.executable, "-c", SAVE_LIMITED, str(artifact), str(Path(__file__).parent)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"{artifact}: not saved (") and "File too large" in run.stdout, run.stdout
    assert run.stdout.rstrip().endswith("; every old file is as it was")
    assert files_of(artifact) == before  # no .partial file or folder left either
    assert state_hash(FasterModel.from_pretrained(artifact)) == state_hash(load_file(saved / "model.safetensors"))


def test_a_save_replaces_every_file_and_keeps_a_card_of_its_own(fm: FasterModel, tmp_path: Path) -> None:
    other = FasterModel.wrap(pruned_mlp(), MLP_SOURCE, MLP_KWARGS)
    other.save_pretrained(tmp_path)
    (tmp_path / "README.md").write_text("my own card")
    fm.save_pretrained(tmp_path)
    assert sorted(files_of(tmp_path)) == ["README.md", "config.json", "model.safetensors"]
    assert (tmp_path / "README.md").read_text() == "my own card"  # as the mixin: a card there is kept
    assert state_hash(FasterModel.from_pretrained(tmp_path)) == state_hash(fm)
    fm.save_pretrained(tmp_path / "new" / "deeper")  # folders made as the mixin makes them
    assert sorted(files_of(tmp_path / "new" / "deeper")) == ["README.md", "config.json", "model.safetensors"]


# -- load --------------------------------------------------------------------------------

def test_load_without_an_artifact_names_the_three_files(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("nothing here")
    with pytest.raises(ArtifactNotFoundError) as err:
        load(tmp_path)
    assert isinstance(err.value, FileNotFoundError)
    for name in ("model.safetensors", "model.torchscript.pt", "model.onnx"):
        assert name in str(err.value)


def test_load_of_a_form_the_artifact_lacks_raises(saved: Path) -> None:
    with pytest.raises(ArtifactNotFoundError, match=r"model\.onnx \(form='onnx'\)"):
        load(saved, form="onnx")


def test_a_wrong_form_lists_the_valid_ones(saved: Path) -> None:
    with pytest.raises(ValueError, match="'auto' or one of 'safetensors', 'torchscript', 'onnx'"):
        load(saved, form="pickle")


def test_load_rejects_unknown_keywords(saved: Path) -> None:
    with pytest.raises(TypeError, match="strictness"):
        load(saved, strictness=True)


def test_a_local_directory_never_touches_the_network(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access while loading a local directory")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    model = load(saved)
    assert isinstance(model, FasterModel) and not model.training
    assert isinstance(load(str(saved), form="safetensors"), FasterModel)


def test_the_public_names() -> None:
    for name in ("resolve", "spec_from", "state_hash", "FasterModel", "load"):
        assert name in fastermodels.__all__
    assert fastermodels.FORMS == {"safetensors": "model.safetensors",
                                  "torchscript": "model.torchscript.pt", "onnx": "model.onnx"}


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_weights_are_written_as_the_umask_says(tmp_path: Path, umask: int) -> None:
    """model.safetensors came out 0600 whatever the umask (safetensors writes its file so) beside a
    0644 config.json: a published artifact another user or a server could not read; a file already
    there keeps its own mode."""
    import os
    import stat

    fm = FasterModel.wrap(fastermodels.resolve(MLP_SOURCE)(**MLP_KWARGS), MLP_SOURCE, MLP_KWARGS)
    old = os.umask(umask)
    try:
        fm.save_pretrained(tmp_path / "art")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "art").iterdir()}
    assert modes == dict.fromkeys(["README.md", "config.json", "model.safetensors"], 0o666 & ~umask)
    (tmp_path / "art" / "model.safetensors").chmod(0o640)
    fm.save_pretrained(tmp_path / "art")
    assert stat.S_IMODE((tmp_path / "art" / "model.safetensors").stat().st_mode) == 0o640
