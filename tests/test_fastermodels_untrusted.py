"""What loading an artifact never runs or fetches without trust_remote_code=True: a private zoo
helper that torch.loads a pickle, weights to download, TorchScript; and load errors that name the
file (a corrupt TorchScript or safetensors, a config.json that is not a JSON object)."""

from __future__ import annotations

import json
import contextlib
import os
import re
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("torchvision")
pytest.importorskip("huggingface_hub")
sys.path.insert(0, str(Path(__file__).parent))

from safetensors.torch import save_file  # noqa: E402

import fastermodels  # noqa: E402
from fastermodels import (ArtifactReadError, FasterModel, UntrustedSourceError, check_source,  # noqa: E402
                          export_artifact, load)
from test_fastermodels_nets import RESNET_KWARGS, RESNET_SOURCE  # noqa: E402
from uform.exporters import quiet_torch_deprecations  # noqa: E402


class Payload:
    """A harmless pickle: unpickling it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "unpickled"))


def _config(directory: Path, source: str, source_kwargs: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {"source": source, "source_kwargs": source_kwargs, "modules": {}, "recipe": None, "provenance": None}
    (directory / "config.json").write_text(json.dumps(config, sort_keys=True, indent=2))
    return directory


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access while loading a local artifact")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_a_private_zoo_helper_that_torch_loads_a_pickle_runs_nothing(tmp_path: Path, no_network: None) -> None:
    marker = tmp_path / "written"
    torch.save(Payload(marker), tmp_path / "evil.pt")
    kwargs = {"url": (tmp_path / "evil.pt").as_uri(), "model_dir": str(tmp_path / "hub")}
    evil = _config(tmp_path / "evil", "torchvision.models._api.load_state_dict_from_url", kwargs)
    message = r"evil: config.json names the source 'torchvision.models._api.load_state_dict_from_url', a private"
    with pytest.raises(UntrustedSourceError, match=message):
        FasterModel.from_pretrained(evil)  # no weights file: refused all the same
    save_file({"x": torch.zeros(1)}, str(evil / "model.safetensors"))
    for attempt in (lambda: load(evil), lambda: load(evil, form="safetensors"), lambda: FasterModel.from_pretrained(evil)):
        with pytest.raises(UntrustedSourceError, match=message):
            attempt()
    assert not marker.exists()
    torch.load(tmp_path / "evil.pt", weights_only=False)  # the payload is live: unpickled, it writes
    assert marker.read_text() == "unpickled"


@pytest.mark.parametrize(
    ("source", "kwargs", "why"),
    [
        (RESNET_SOURCE, {"weights": "DEFAULT"}, "weights='DEFAULT' in its source_kwargs, which would download"),
        (RESNET_SOURCE, {"num_classes": 10, "weights": "ResNet18_Weights.IMAGENET1K_V1"}, "would download"),
        (RESNET_SOURCE, {"pretrained": True}, "'pretrained' in its source_kwargs, not one of the plain architecture"),
        (RESNET_SOURCE, {"progress": False}, "'progress' in its source_kwargs"),
        (RESNET_SOURCE, {"model_dir": "/tmp"}, "'model_dir' in its source_kwargs"),
        (RESNET_SOURCE, {"num_classes": {"url": "http://x"}}, "not a JSON scalar or list"),
        (RESNET_SOURCE, ["weights", "DEFAULT"], "source_kwargs of type list"),
        ("torchvision.models.detection.fasterrcnn_resnet50_fpn", {"num_classes": 3},
         "whose weights_backbone defaults to ResNet50_Weights.IMAGENET1K_V1: it would download"),
        ("torchvision.models.get_model", {"name": "resnet18"}, "not a model builder the zoo registers"),
        ("torchvision.models.resnet.ResNet", {}, "not a model builder the zoo registers"),
        ("torchvision.models.utils.load_state_dict_from_url", {"url": "http://x"}, "not a model builder"),
        ("torch.hub.load", {"repo_or_dir": "x/y", "model": "m"}, "not a model builder"),
        ("timm.create_model", {"model_name": "hf-hub:x/y", "pretrained": True}, "not a model builder"),
        ("transformers.AutoModel.from_pretrained", {"pretrained_model_name_or_path": "x/y"}, "not a model builder"),
        ("os.system", {"command": "true"}, "not a model builder"),
    ],
)
def test_what_would_fetch_or_load_is_refused_without_the_network(tmp_path: Path, no_network: None, source: str,
                                                                 kwargs: Any, why: str) -> None:
    artifact = _config(tmp_path / "a", source, kwargs)
    save_file({"x": torch.zeros(1)}, str(artifact / "model.safetensors"))
    for attempt in (lambda: load(artifact), lambda: FasterModel.from_pretrained(artifact)):
        with pytest.raises(UntrustedSourceError, match="a: config.json .*trust_remote_code=True") as info:
            attempt()
        assert why in str(info.value)


def test_registered_builders_load_by_every_public_path() -> None:
    for fine in ("torchvision.models.resnet18", "torchvision.models.resnet.resnet18",
                 "torchvision.models.quantization.resnet18", "torchvision.models.segmentation.fcn_resnet50",
                 "torchvision.models.detection.fasterrcnn_resnet50_fpn"):
        check_source(fine, {"num_classes": 3, "weights": None, "weights_backbone": None}
                     if "detection" in fine or "segmentation" in fine else {"num_classes": 3})
    check_source("torchvision.models._api.load_state_dict_from_url", {"url": "x"}, trust_remote_code=True)
    assert fastermodels.TRUSTED_SOURCES == ("torchvision.models",)


def test_a_weights_backbone_that_downloads_by_default_must_be_null(tmp_path: Path, no_network: None) -> None:
    source = "torchvision.models.segmentation.lraspp_mobilenet_v3_large"
    kwargs = {"num_classes": 3, "weights": None, "weights_backbone": None}
    fm = FasterModel.wrap(fastermodels.resolve(source)(**kwargs), source, kwargs)
    fm.save_pretrained(tmp_path / "seg")
    back = load(tmp_path / "seg")  # null spelled out: built and loaded offline
    assert isinstance(back, FasterModel) and fastermodels.state_hash(back) == fastermodels.state_hash(fm)
    config = json.loads((tmp_path / "seg" / "config.json").read_text())
    del config["source_kwargs"]["weights_backbone"]  # left to its default, it would download
    (tmp_path / "seg" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UntrustedSourceError, match="whose weights_backbone defaults to MobileNet_V3_Large_Weights"):
        load(tmp_path / "seg")


# -- TorchScript is code ---------------------------------------------------------------------


class Talkative(torch.nn.Module):
    """A scripted module whose ``__setstate__`` runs at torch.jit.load and prints."""

    def __init__(self) -> None:
        super().__init__()
        self.word = "hello"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return (self.word, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        self.word = state[0]
        self.training = state[1]
        print("torchscript payload ran")


@pytest.fixture
def talkative(tmp_path: Path) -> Path:
    with quiet_torch_deprecations():
        torch.jit.script(Talkative()).save(str(tmp_path / "model.torchscript.pt"))  # type: ignore[no-untyped-call]
    return tmp_path


def test_torchscript_loads_only_with_trust_remote_code(talkative: Path, capfd: pytest.CaptureFixture[str]) -> None:
    for form in ("auto", "torchscript"):
        with pytest.raises(UntrustedSourceError, match=r"model.torchscript.pt is TorchScript, which is code: .*"
                                                       r"pass trust_remote_code=True to load\(\)"):
            load(talkative, form=form)
    assert "payload ran" not in capfd.readouterr().out
    module = load(talkative, trust_remote_code=True)
    assert "payload ran" in capfd.readouterr().out  # the payload is live: trusted, it runs
    assert float(module(torch.zeros(1))[0]) == 1.0 and not module.training


def test_auto_names_the_onnx_an_untrusted_torchscript_sits_beside(tmp_path: Path) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
    export_artifact(net, tmp_path, ("torchscript", "onnx"), example_input=torch.randn(1, 4))
    with pytest.raises(UntrustedSourceError, match="or form='onnx' for the model.onnx it also publishes"):
        load(tmp_path)
    assert load(tmp_path, form="onnx") == tmp_path / "model.onnx"
    assert isinstance(load(tmp_path, trust_remote_code=True), torch.jit.ScriptModule)


# -- load errors name the file ---------------------------------------------------------------


def test_a_corrupt_torchscript_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "model.torchscript.pt").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ArtifactReadError, match=r"model\.torchscript\.pt: not a readable TorchScript archive "
                                                r"\(.*failed reading zip archive"):
        load(tmp_path, trust_remote_code=True)


def _zoo_config(directory: Path) -> Path:
    return _config(directory, RESNET_SOURCE, RESNET_KWARGS)


def test_a_safetensors_header_too_large_names_the_file(tmp_path: Path) -> None:
    artifact = _zoo_config(tmp_path / "big")
    (artifact / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    for attempt in (lambda: load(artifact), lambda: FasterModel.from_pretrained(artifact)):
        with pytest.raises(ArtifactReadError, match=r"big/model\.safetensors: not a readable safetensors file "
                                                    r"\(.*header too large"):
            attempt()


@pytest.mark.parametrize("key", ["net.0.weight", "__metadata__"])
def test_a_key_written_twice_in_a_safetensors_header_is_refused(tmp_path: Path, key: str) -> None:
    """The safetensors library loaded such a file with the last entry counting (here: the
    weight's bytes read as I32, or the metadata without the config.json digest); another reader
    may keep the first. uform's own checkpoints refuse it (uform.core.safetensors)."""
    from test_fastermodels_nets import MLP_KWARGS, MLP_SOURCE, pruned_mlp

    artifact = tmp_path / "twice"
    FasterModel.wrap(pruned_mlp(), MLP_SOURCE, MLP_KWARGS).save_pretrained(artifact)
    weights = artifact / "model.safetensors"
    raw = weights.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    again = dict(header[key], dtype="I32") if key != "__metadata__" else {"format": "pt"}
    text = json.dumps(header)[:-1] + f", {json.dumps(key)}: {json.dumps(again)}}}"
    weights.write_bytes(struct.pack("<Q", len(text)) + text.encode() + raw[8 + length :])
    for attempt in (lambda: load(artifact, trust_remote_code=True),
                    lambda: FasterModel.from_pretrained(artifact, trust_remote_code=True)):
        with pytest.raises(ArtifactReadError) as info:
            attempt()
        assert str(info.value) == (f"{weights}: not a readable safetensors file (header is not JSON (the key "
                                   f"'{key}' appears twice in one object))")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", r"config\.json: not JSON \(Expecting property name enclosed in double quotes at column 2\)"),
        ('["source"]', r"config\.json: holds a JSON list, not the object of source"),
        ("\udcff", r"config\.json: not JSON \(not UTF-8: byte 0xff at offset 0\), so not a config\.json"),
        ("[" * 100_000 + "]" * 100_000, r"config\.json: not JSON \(nested too deeply\), so not a config\.json"),
    ],
)
def test_a_bad_config_json_names_the_file(tmp_path: Path, text: str, why: str) -> None:
    artifact = _zoo_config(tmp_path / "cfg")
    (artifact / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    save_file({"x": torch.zeros(1)}, str(artifact / "model.safetensors"))
    for attempt in (lambda: load(artifact), lambda: FasterModel.from_pretrained(artifact)):
        with pytest.raises(ArtifactReadError, match=r"cfg/" + why) as info:
            attempt()
        assert isinstance(info.value, ValueError)


# -- a config.json that does not build names the artifact, and allocates nothing it disagrees on --


@pytest.fixture(scope="module")
def resnet_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("resnet") / "art"
    FasterModel.wrap(fastermodels.resolve(RESNET_SOURCE)(**RESNET_KWARGS), RESNET_SOURCE,
                     RESNET_KWARGS).save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    ("edit", "error", "why"),
    [
        # each was a bare error from torch or Python that named neither the artifact nor config.json
        (lambda c: c["source_kwargs"].update(num_classes="ten"), fastermodels.SpecError,
         r"art: torchvision\.models\.resnet18 cannot be built from source_kwargs \{'num_classes': 'ten', "
         r"'weights': None\} \(TypeError: empty\(\)"),
        (lambda c: c["source_kwargs"].update(num_classes=-1), fastermodels.SpecError,
         r"art: torchvision\.models\.resnet18 cannot be built .*\(RuntimeError: Trying to create tensor with negative"),
        (lambda c: c.update(modules=["fc"]), fastermodels.SpecError,
         r"art: modules is a list, not an object of module name → constructor arguments"),
        (lambda c: c["modules"].update(fc="Linear"), fastermodels.SpecError,
         r"art: module 'fc': its spec entry is a str, not an object of constructor arguments"),
        (lambda c: c["modules"]["fc"].update(type=["Linear"]), fastermodels.SpecError,
         r"art: module 'fc': type \['Linear'\] is not one of Conv2d, Linear"),
        # a constructor argument no spec records: device='meta' left the net without data
        (lambda c: c["modules"]["fc"].update(device="meta"), fastermodels.SpecError,
         r"art: module 'fc': 'device' is not among the arguments a spec records for Linear "
         r"\(in_features, out_features, bias\)"),
        # 400 TB of weights declared: refused on the meta outline (it tried to allocate them)
        (lambda c: c["modules"]["fc"].update(in_features=10**7, out_features=10**7), fastermodels.WeightsMismatchError,
         r"art: the weights disagree .* net\.fc\.weight \(weights \(10, 512\), model \(10000000, 10000000\)\)"),
        (lambda c: c["modules"]["layer1.0.bn1"].update(num_features=10**14), fastermodels.WeightsMismatchError,
         r"art: the weights disagree .* net\.layer1\.0\.bn1\.bias \(weights \(64,\), model \(100000000000000,\)\)"),
    ],
    ids=["kwargs-str", "kwargs-negative", "modules-list", "entry-str", "type-list", "entry-device", "fc-400TB",
         "bn-400TB"],
)
def test_a_config_json_that_does_not_build_names_the_artifact(resnet_artifact: Path, tmp_path: Path, edit: Any,
                                                              error: type[Exception], why: str) -> None:
    artifact = tmp_path / "art"
    artifact.mkdir()
    (artifact / "model.safetensors").write_bytes((resnet_artifact / "model.safetensors").read_bytes())
    config = json.loads((resnet_artifact / "config.json").read_text())
    edit(config)
    (artifact / "config.json").write_text(json.dumps(config))
    for attempt in (lambda: load(artifact), lambda: FasterModel.from_pretrained(artifact)):
        with pytest.raises(error, match=why):
            attempt()


def test_a_config_json_that_is_a_folder_names_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").mkdir()
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    for attempt in (lambda: load(tmp_path), lambda: FasterModel.from_pretrained(tmp_path)):
        with pytest.raises(ArtifactReadError, match=r"config\.json: a folder, not a regular file, so not a "
                                                    r"config\.json"):
            attempt()  # was IsADirectoryError from the mixin's open


# -- a model.onnx whose external data lie outside the artifact's folder is refused before any runtime reads it --

WEIGHTS = np.arange(4, dtype=np.float32)  # what the crafted models add to their input


def _external(tensor: Any, location: str) -> Any:
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _onnx(directory: Path, location: str, where: str = "initializer") -> Path:
    """An artifact whose model.onnx adds a weight kept in ``location``: an initializer's, a
    Constant node's value, or an initializer of an If's branch."""
    from onnx import helper, numpy_helper

    directory.mkdir(parents=True, exist_ok=True)
    weight = _external(numpy_helper.from_array(WEIGHTS, "w"), location)
    x = helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, [4])
    add = helper.make_node("Add", ["input", "w"], ["output"])
    if where == "initializer":
        graph = helper.make_graph([add], "g", [x], [y], [weight])
    elif where == "constant":
        graph = helper.make_graph([helper.make_node("Constant", [], ["w"], value=weight), add], "g", [x], [y])
    else:
        branch = helper.make_graph([helper.make_node("Identity", ["w"], ["b"])], "branch", [],
                                   [helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [4])], [weight])
        flag = helper.make_tensor_value_info("flag", onnx.TensorProto.BOOL, [])
        graph = helper.make_graph([helper.make_node("If", ["flag"], ["output"], then_branch=branch, else_branch=branch)],
                                  "g", [x, flag], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (directory / "model.onnx").write_bytes(model.SerializeToString())
    return directory


def _run(path: Path) -> Any:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": np.ones(4, np.float32)})[0]


@pytest.mark.parametrize(
    ("location", "where", "why"),
    [
        ("../secret.bin", "initializer", "a path through '..'"),
        ("sub/../../secret.bin", "initializer", "a path through '..'"),
        ("..\\secret.bin", "initializer", "a path through '..'"),
        ("{secret}", "initializer", "an absolute path"),
        ("C:\\secret.bin", "initializer", "an absolute path"),
        ("", "initializer", "not a file name"),
        ("../secret.bin", "constant", "a path through '..'"),
        ("../secret.bin", "branch", "a path through '..'"),
    ],
    ids=["dotdot", "sub-dotdot", "backslash-dotdot", "absolute", "drive", "empty", "constant", "if-branch"],
)
def test_external_data_named_outside_the_artifact_is_refused(tmp_path: Path, location: str, where: str, why: str) -> None:
    (tmp_path / "secret.bin").write_bytes(np.full(4, 7, np.float32).tobytes())
    location = location.format(secret=tmp_path / "secret.bin")
    artifact = _onnx(tmp_path / "art", location, where)
    message = (f"{artifact / 'model.onnx'}: tensor 'w' keeps its data in {location!r}, {why}; an ONNX artifact's "
               "external data are files in its folder; nothing was read")
    for form in ("onnx", "auto"):
        with pytest.raises(ArtifactReadError) as info:
            load(artifact, form=form)
        assert str(info.value) == message


@pytest.mark.parametrize("link", ["file", "folder"])
def test_external_data_through_a_link_leading_outside_is_refused(tmp_path: Path, link: str) -> None:
    (tmp_path / "w.bin").write_bytes(np.full(4, 7, np.float32).tobytes())
    artifact = _onnx(tmp_path / "art", "model.onnx.data" if link == "file" else "d/w.bin")
    if link == "file":
        (artifact / "model.onnx.data").symlink_to(tmp_path / "w.bin")
    else:
        (artifact / "d").symlink_to(tmp_path)
    with pytest.raises(ArtifactReadError) as info:
        load(artifact)
    location = "model.onnx.data" if link == "file" else "d/w.bin"
    assert str(info.value) == (f"{artifact / 'model.onnx'}: tensor 'w' keeps its data in {location!r}, a link leading "
                               f"outside the artifact's folder, to {os.path.realpath(tmp_path / 'w.bin')}; an ONNX "
                               "artifact's external data are files in its folder; nothing was read")


def test_external_data_inside_the_artifact_loads_and_runs(tmp_path: Path) -> None:
    flat = _onnx(tmp_path / "flat", "model.onnx.data")
    (flat / "model.onnx.data").write_bytes(WEIGHTS.tobytes())
    nested = _onnx(tmp_path / "nested", "./weights/w.bin")
    (nested / "weights").mkdir()
    (nested / "weights" / "w.bin").write_bytes(WEIGHTS.tobytes())
    linked = _onnx(tmp_path / "linked", "model.onnx.data")  # a link to a file of the artifact's own
    (linked / "kept.bin").write_bytes(WEIGHTS.tobytes())
    (linked / "model.onnx.data").symlink_to("kept.bin")
    for artifact in (flat, nested, linked):
        path = load(artifact)
        assert path == artifact / "model.onnx"
        assert _run(path).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_external_data_in_the_hub_cache_are_its_blobs(tmp_path: Path) -> None:
    """A Hub download's files are links from snapshots/REV/ to the repo's blobs/: those load;
    a link elsewhere does not."""
    cache, revision = tmp_path / "cache", "0" * 40
    repo = cache / "models--local-org--onnx"
    snapshot = repo / "snapshots" / revision
    _onnx(repo / "blobs" / "m", "model.onnx.data")
    (repo / "blobs" / "m" / "model.onnx").rename(repo / "blobs" / "b1")
    (repo / "blobs" / "b2").write_bytes(WEIGHTS.tobytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    snapshot.mkdir(parents=True)
    (snapshot / "model.onnx").symlink_to("../../blobs/b1")
    (snapshot / "model.onnx.data").symlink_to("../../blobs/b2")
    path = load("local-org/onnx", cache_dir=str(cache), local_files_only=True)
    assert path == snapshot / "model.onnx" and _run(path).tolist() == [1.0, 2.0, 3.0, 4.0]
    (tmp_path / "secret.bin").write_bytes(WEIGHTS.tobytes())
    (snapshot / "model.onnx.data").unlink()
    (snapshot / "model.onnx.data").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(ArtifactReadError, match=r"a link leading outside the artifact's folder, to .*secret\.bin"):
        load("local-org/onnx", cache_dir=str(cache), local_files_only=True)


# -- loading reads regular files in the artifact's folder only: a link out of it or a FIFO is named, not read --


def _linked(directory: Path, name: str, to: str | Path) -> Path:
    artifact = _zoo_config(directory)
    if name == "config.json":
        (artifact / name).unlink()
    (artifact / name).symlink_to(to)
    return artifact


@pytest.mark.parametrize(
    ("name", "to", "why"),
    [
        # each was read: the weights of another folder loaded, /etc/passwd parsed as the config
        ("model.safetensors", "OUTSIDE", "a link leading outside the artifact's folder, to .*other/model.safetensors"),
        ("config.json", "/etc/passwd", "a link leading outside the artifact's folder, to /etc/passwd"),
        ("model.safetensors", "/dev/zero", "a link leading outside the artifact's folder, to /dev/zero"),
        ("model.onnx", "OUTSIDE", "a link leading outside the artifact's folder, to .*other/model.safetensors"),
    ],
    ids=["safetensors-out", "config-passwd", "safetensors-zero", "onnx-out"],
)
def test_a_link_leading_out_of_the_artifact_is_not_read(resnet_artifact: Path, tmp_path: Path, name: str,
                                                         to: str, why: str) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes((resnet_artifact / "model.safetensors").read_bytes())
    artifact = _linked(tmp_path / "art", name, other / "model.safetensors" if to == "OUTSIDE" else to)
    if name == "config.json":
        (artifact / "model.safetensors").write_bytes((resnet_artifact / "model.safetensors").read_bytes())
    form = "onnx" if name == "model.onnx" else "auto"
    attempts = [lambda: load(artifact, form=form)]
    if form == "auto":
        attempts.append(lambda: FasterModel.from_pretrained(artifact))
    for attempt in attempts:
        with pytest.raises(ArtifactReadError, match=rf"art/{re.escape(name)}: {why}, so not a {re.escape(name)}: "
                                                    r"an artifact's files are regular files in its folder; nothing was read"):
            attempt()


def test_a_link_inside_the_artifact_loads(resnet_artifact: Path, tmp_path: Path) -> None:
    artifact = _zoo_config(tmp_path / "art")
    (artifact / "blobs").mkdir()
    (artifact / "blobs" / "w").write_bytes((resnet_artifact / "model.safetensors").read_bytes())
    (artifact / "model.safetensors").symlink_to("blobs/w")
    assert fastermodels.state_hash(load(artifact)) == fastermodels.state_hash(FasterModel.from_pretrained(resnet_artifact))


@pytest.mark.parametrize("name", ["model.safetensors", "model.onnx", "config.json"])
def test_a_fifo_is_named_instead_of_hanging_load(tmp_path: Path, name: str) -> None:
    artifact = _zoo_config(tmp_path / "art")
    if name == "config.json":
        (artifact / name).unlink()
        save_file({"x": torch.zeros(1)}, str(artifact / "model.safetensors"))
    os.mkfifo(artifact / name)  # opening it for reading blocks until a writer comes: load hung for good
    # (a model.torchscript.pt FIFO hangs torch.jit.load even when given an end of file: refused the same way)
    with _unblocked(artifact / name), pytest.raises(ArtifactReadError, match=rf"art/{re.escape(name)}: a FIFO, "
                                                                          rf"not a regular file, so not a {re.escape(name)}"):
        load(artifact, trust_remote_code=True)


@contextlib.contextmanager
def _unblocked(fifo: Path) -> Iterator[None]:
    """From 5 s on, each reader blocked on ``fifo`` is given an end of file, so that a load that
    opened it fails instead of hanging the test run."""
    done = threading.Event()

    def end() -> None:
        while not done.wait(5):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader: nothing opened it
                pass

    thread = threading.Thread(target=end, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_external_data_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    artifact = _onnx(tmp_path / "art", "w.bin")
    os.mkfifo(artifact / "w.bin")  # ONNX Runtime's read of it blocked for good
    with _unblocked(artifact / "w.bin"), pytest.raises(ArtifactReadError, match=r"model\.onnx: tensor 'w' keeps its data in 'w\.bin', a FIFO, "
                                                r"not a regular file; an ONNX artifact's external data"):
        _run(load(artifact))


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        # each loaded: an int64 or bool weight raised torch's bare RuntimeError 'data set to a tensor that
        # requires gradients must be floating point', a float num_batches_tracked loaded as float
        ("net.fc.weight", lambda t: t.to(torch.int64), r"net\.fc\.weight \(weights torch\.int64, model torch\.float32\)"),
        ("net.fc.weight", lambda t: t > 0, r"net\.fc\.weight \(weights torch\.bool, model torch\.float32\)"),
        ("net.bn1.num_batches_tracked", lambda t: t.to(torch.float32) + 0.5,
         r"net\.bn1\.num_batches_tracked \(weights torch\.float32, model torch\.int64\)"),
    ],
    ids=["int64-weight", "bool-weight", "float-counter"],
)
def test_a_weight_of_another_kind_of_dtype_names_itself(resnet_artifact: Path, tmp_path: Path, key: str,
                                                        value: Any, why: str) -> None:
    from safetensors.torch import load_file

    artifact = tmp_path / "art"
    artifact.mkdir()
    (artifact / "config.json").write_bytes((resnet_artifact / "config.json").read_bytes())
    state = load_file(str(resnet_artifact / "model.safetensors"))
    state[key] = value(state[key])
    save_file(state, str(artifact / "model.safetensors"))
    for attempt in (lambda: load(artifact), lambda: FasterModel.from_pretrained(artifact)):
        with pytest.raises(fastermodels.WeightsMismatchError, match=r"art: the weights disagree .*; dtype mismatch "
                                                                    r"\(1\): " + why):
            attempt()
