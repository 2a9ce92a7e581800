"""fastermodels loading what it may: registered zoo builders, trust_remote_code, and local folders
that do not exist (answered at once, never looked up on the Hub). What would fetch, load or run
code is tested in test_fastermodels_untrusted.py."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("huggingface_hub")
sys.path.insert(0, str(Path(__file__).parent))

from safetensors.torch import save_file  # noqa: E402

import fastermodels  # noqa: E402
from fastermodels import (ArtifactNotFoundError, FasterModel, UntrustedSourceError, load,  # noqa: E402
                          state_hash)
from fastermodels import _load  # noqa: E402
from test_fastermodels_nets import (MLP_KWARGS, MLP_SOURCE, RESNET_KWARGS, RESNET_SOURCE,  # noqa: E402
                                    pruned_mlp, pruned_resnet18)


def _artifact(directory: Path, source: str, source_kwargs: dict[str, object], state: dict[str, object]) -> Path:
    """An artifact laid out as fastermodels 0.1.2 writes it: config.json (five keys, sorted,
    indent 2) and model.safetensors (the weights under ``net.``)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"source": source, "source_kwargs": source_kwargs, "modules": {}, "recipe": None, "provenance": None}
    (directory / "config.json").write_text(json.dumps(config, sort_keys=True, indent=2))
    save_file({f"net.{k}": v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))  # type: ignore[union-attr]
    return directory


def test_a_model_zoo_artifact_of_upstream_0_1_2_loads_as_before(tmp_path: Path) -> None:
    pruned = pruned_resnet18()
    fm = FasterModel.wrap(pruned, RESNET_SOURCE, RESNET_KWARGS, recipe={"prune": "odd widths"})
    fm.save_pretrained(tmp_path / "zoo")
    model = load(tmp_path / "zoo")
    assert isinstance(model, FasterModel) and state_hash(model) == state_hash(fm)
    assert isinstance(FasterModel.from_pretrained(tmp_path / "zoo"), FasterModel)


def test_a_source_outside_the_zoos_is_refused_naming_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = _artifact(tmp_path / "evil", "os.system", {"command": f"touch {marker}"}, {})
    message = r"evil: config.json names the source 'os.system', not a model builder the zoo registers .*trust_remote_code=True"
    with pytest.raises(UntrustedSourceError, match=message) as info:
        load(evil)
    assert isinstance(info.value, ImportError)
    with pytest.raises(UntrustedSourceError, match=message):
        FasterModel.from_pretrained(evil)
    assert not marker.exists()  # nothing was imported or called


def test_trust_remote_code_loads_a_local_factory(tmp_path: Path) -> None:
    net = pruned_mlp()
    FasterModel.wrap(net, MLP_SOURCE, MLP_KWARGS).save_pretrained(tmp_path)
    with pytest.raises(UntrustedSourceError, match=f"'{MLP_SOURCE}'"):
        load(tmp_path)
    x = torch.randn(3, 16)
    for back in (load(tmp_path, trust_remote_code=True), FasterModel.from_pretrained(tmp_path, trust_remote_code=True)):
        assert isinstance(back, FasterModel) and not back.training
        with torch.no_grad():
            assert torch.equal(back(x), net.eval()(x))


def test_source_kwargs_asking_to_trust_remote_code_are_refused(tmp_path: Path) -> None:
    artifact = _artifact(tmp_path / "remote", RESNET_SOURCE, {"num_classes": 10, "trust_remote_code": True}, {})
    with pytest.raises(UntrustedSourceError, match="calls 'torchvision.models.resnet18' with 'trust_remote_code' in its "
                                                   "source_kwargs, not one of the plain architecture arguments"):
        load(artifact)


def test_the_allow_list_is_by_registered_builder() -> None:
    for fine in ("torchvision.models.resnet18", "torchvision.models.resnet.resnet18", "torchvision.models.vit_b_16"):
        fastermodels.check_source(fine, {"num_classes": 10, "weights": None})
    for refused in ("torchvision.io.read_file", "torchvisionx.models.f", "torchvision.models._utils.IntermediateLayerGetter",
                    "torchvision.models.resnet.ResNet", "torchvision.models.get_weight", "timm.create_model",
                    "transformers.AutoModel", "builtins.exec", "resnet18", None, 18):
        with pytest.raises(UntrustedSourceError):
            fastermodels.check_source(refused)
    fastermodels.check_source("builtins.exec", trust_remote_code=True)


# -- folders that do not exist --------------------------------------------------------------


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access for a local folder")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(_load, "_hub_files", refuse)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("artifcat", "nor a Hub repo id, which reads 'namespace/name'"),
        ("./artifcat", "nor a Hub repo id, which reads 'namespace/name'"),
        ("out/artifcat", "out/ is a local folder, so this is taken as a path in it"),
        ("a/b/c", "nor a Hub repo id, which reads 'namespace/name'"),
    ],
)
def test_a_mistyped_folder_is_answered_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               no_network: None, name: str, why: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    started = time.monotonic()
    with pytest.raises(ArtifactNotFoundError) as info:
        load(name)
    assert str(info.value) == f"{name}: no such artifact folder ({why}); nothing was looked up on the Hub"
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(ArtifactNotFoundError, match="a path object is never a Hub repo id"):
        load(tmp_path / "artifcat")
    assert time.monotonic() - started < 5  # no retries: nothing waited on a network


def test_a_file_is_not_an_artifact(tmp_path: Path, no_network: None) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ArtifactNotFoundError, match="is a file; an artifact is a folder"):
        load(tmp_path / "model.safetensors")


def test_a_failed_hub_look_up_says_it_was_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    def unreachable(repo_id: str, hub: dict[str, object]) -> set[str]:
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(_load, "_hub_files", unreachable)
    with pytest.raises(ArtifactNotFoundError) as info:
        load("someone/artifcat")
    assert str(info.value) == ("someone/artifcat: no such local folder, and looking it up on the Hub as a repo id "
                               "failed: ConnectionError: [Errno -2] Name or service not known")
    assert isinstance(info.value.__cause__, ConnectionError)


@pytest.mark.parametrize("how", ["local_files_only", "HF_HUB_OFFLINE"])
def test_a_hub_id_offline_and_not_cached_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """It said 'someone/model publishes none of model.safetensors, ...': a claim about the repo, made
    without asking the Hub anything."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access while offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.chdir(tmp_path)
    kw: dict[str, object] = {"cache_dir": str(tmp_path / "cache")}
    if how == "local_files_only":
        kw["local_files_only"] = True
    else:
        monkeypatch.setattr(_load, "_offline", lambda hub: True)  # HF_HUB_OFFLINE=1 is read once, at import
    with pytest.raises(ArtifactNotFoundError) as info:
        load("someone/model", **kw)
    assert str(info.value) == (
        "someone/model: offline (HF_HUB_OFFLINE=1 or local_files_only=True) and the huggingface_hub cache holds "
        "none of model.safetensors, model.torchscript.pt, model.onnx for it; nothing was looked up on the Hub: "
        "load it once online, or pass the artifact's local folder")


@pytest.mark.parametrize("how", ["local_files_only", "HF_HUB_OFFLINE", "unreachable"])
def test_from_pretrained_of_a_hub_id_the_cache_lacks_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              how: str) -> None:
    """FasterModel.from_pretrained raised huggingface_hub's own LocalEntryNotFoundError ('Cannot find
    the requested files in the disk cache and outgoing traffic has been disabled...'), naming
    neither the repo nor HF_HUB_OFFLINE."""
    from huggingface_hub import constants

    def refuse(*args: object, **kwargs: object) -> None:
        if how != "unreachable":
            raise AssertionError("network access while offline")
        raise OSError("[Errno 101] Network is unreachable")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # huggingface_hub's retries back off 23 s in all
    kw: dict[str, object] = {"cache_dir": str(tmp_path / "cache")}
    if how == "local_files_only":
        kw["local_files_only"] = True
    elif how == "HF_HUB_OFFLINE":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # HF_HUB_OFFLINE=1 is read once, at import
    with pytest.raises(ArtifactNotFoundError) as info:
        FasterModel.from_pretrained("someone/model", **kw)
    if how == "unreachable":
        assert str(info.value) == (
            "someone/model: the Hub could not be reached and the huggingface_hub cache holds no config.json for "
            "it: check the connection (HF_ENDPOINT), or pass the artifact's local folder")
    else:
        assert str(info.value) == (
            "someone/model: offline (HF_HUB_OFFLINE=1 or local_files_only=True) and the huggingface_hub cache "
            "holds no config.json for it; nothing was looked up on the Hub: load it once online, or pass the "
            "artifact's local folder")


@pytest.mark.parametrize("name", ["artifcat", "./x", "a/b/c"])
def test_from_pretrained_of_a_folder_that_is_not_there_says_so_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      name: str) -> None:
    """A mistyped folder went to the Hub: 'artifcat' spent huggingface_hub's retries (23.5 s here,
    offline) and then said the Hub could not be reached; './x' and 'a/b/c' raised its
    HFValidationError ('Repo id must use alphanumeric chars ...'). load() said what it does now."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access for a local path")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArtifactNotFoundError) as info:
        FasterModel.from_pretrained(name)
    assert str(info.value) == (f"{name}: no such artifact folder (nor a Hub repo id, which reads 'namespace/name'); "
                               "nothing was looked up on the Hub")
