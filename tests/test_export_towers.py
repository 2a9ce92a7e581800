"""Tower export: each exported .onnx runs in a second runtime (onnx.reference) and matches Model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import uform
from ckpt import make_checkpoint
from uform.cli import main
from uform.core.host import get_host
from uform.model import runtime_of

SIZES = {"batch": 2, "length": 5}


def feeds_for(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Valid random feeds for a tower graph, from its declared inputs."""
    out: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        t = value.type.tensor_type
        shape = [d.dim_value or SIZES.get(d.dim_param, 3) for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        if value.name in ("lengths", "last"):
            out[value.name] = np.array([5, 2], np.int64)
        elif value.name == "bytes":
            out[value.name] = rng.integers(0, 256, shape).astype(np.int64)
        elif dtype == np.uint8:
            out[value.name] = rng.integers(0, 256, shape).astype(np.uint8)
        else:
            out[value.name] = (rng.standard_normal(shape) * 0.1).astype(dtype)
    if "last" in out:  # the decoder reads a begin token then `last` bytes
        out["bytes"] = np.concatenate([np.full((2, 1), 256), out["bytes"]], axis=1)
        out["last"] = np.array([out["bytes"].shape[1] - 1, 1], np.int64)
    if "lengths" in out:
        out["lengths"] = np.array([out["bytes"].shape[1], 2], np.int64)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("export")
    path = make_checkpoint(root / "all.safetensors", "tiny", 5)
    assert main(["export", str(path), str(root / "f32")]) == 0
    assert main(["export", str(path), str(root / "bf16"), "--quantization", "bf16"]) == 0
    return path, root


@pytest.mark.parametrize("weights", ["f32", "bf16"])
def test_exported_towers_match_model_in_a_second_runtime(exported: tuple[Path, Path], weights: str) -> None:
    path, root = exported
    model = uform.Model.load_ram(path, quantization=uform.Scalar.F32)  # exported towers are float32
    runners = runtime_of(model).placement.runners
    assert set(runners) == {p.stem for p in (root / weights).glob("*.onnx")}
    rng = np.random.default_rng(0)
    for tower, runner in runners.items():
        proto = onnx.load(str(root / weights / f"{tower}.onnx"))
        onnx.checker.check_model(proto, full_check=True)
        info = json.loads((root / weights / f"{tower}.json").read_text())
        assert [i["name"] for i in info["inputs"]] == [i.name for i in proto.graph.input]
        assert info["weights"] == weights and info["opset"] >= 21 and info["preprocessing"]
        feeds = feeds_for(proto, rng)
        names = [o.name for o in proto.graph.output]
        theirs = ReferenceEvaluator(proto).run(names, feeds)
        ours = runner.run(names, feeds)
        for name, a, b in zip(names, theirs, ours):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"{tower}.{name}")


def test_exported_text_tower_matches_text_encode(exported: tuple[Path, Path]) -> None:
    path, root = exported
    proto = onnx.load(str(root / "f32" / "text.onnx"))
    texts = [b"a cat", b"exported"]
    ids = np.zeros((2, 8), np.int64)
    for i, t in enumerate(texts):
        ids[i, : len(t)] = list(t)
    (theirs,) = ReferenceEvaluator(proto).run(["embeddings"], {"bytes": ids, "lengths": np.array([5, 8])})
    want = uform.Model.load_ram(path, quantization=uform.Scalar.F32).text_encode(texts, uform.Arena()).embeddings
    np.testing.assert_allclose(theirs, want, atol=1e-5)


def test_export_refuses_unknown_quantization(tiny_text: Path, tmp_path: Path) -> None:
    from uform.exporters.towers import export_towers

    with pytest.raises(ValueError, match="quantization must be one of f32, bf16"):
        export_towers(tiny_text, tmp_path, "e4m3")


def test_all_installed_towers_are_exported(exported: tuple[Path, Path]) -> None:
    _, root = exported
    towers = {m.tower.name for m in get_host().modalities.values()}
    assert {p.stem for p in (root / "f32").glob("*.onnx")} == towers


def test_external_weights_are_as_readable_as_their_model(tiny_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tower past 512 MiB keeps its weights in {tower}.onnx.data, which onnx writes owner-only
    (0600) while {tower}.onnx is 0644: a server running as another user read the model and failed
    on its weights. The data file now has its model's permissions."""
    import onnxruntime as ort

    from uform.exporters import towers

    monkeypatch.setattr(towers, "EXTERNAL_ABOVE", 0)  # every tower's weights beside it
    written = towers.export_towers(tiny_text, tmp_path / "out")
    assert written and all((tmp_path / "out" / f"{t}.onnx.data").exists() for t in written)
    for tower, path in written.items():
        data = path.with_name(f"{tower}.onnx.data")
        assert data.stat().st_mode & 0o777 == path.stat().st_mode & 0o777, tower
    monkeypatch.setattr(towers, "EXTERNAL_ABOVE", 512 << 20)
    inside = towers.export_towers(tiny_text, tmp_path / "inside")
    feeds = {"bytes": np.array([list(b"a cat"), list(b"dog\0\0")], np.int64), "lengths": np.array([5, 3], np.int64)}
    run = [ort.InferenceSession(str(p["text"]), providers=["CPUExecutionProvider"]).run(["embeddings"], feeds)[0] for p in (written, inside)]
    np.testing.assert_array_equal(run[0], run[1])


def test_an_empty_output_folder_is_refused(tiny_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`uform export CK ""` (an unset "$OUT") wrote every tower into the working folder."""
    from uform.exporters.towers import export_towers

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="the output folder is empty: name the folder to write the towers to"):
        export_towers(tiny_text, "")
    assert main(["export", str(tiny_text), "", "-q"]) == 2
    assert capsys.readouterr().err == "uform: error: the output folder is empty: name the folder to write the towers to\n"
    assert list(tmp_path.iterdir()) == []


def test_an_export_over_an_earlier_one_leaves_one_models_towers(exported: tuple[Path, Path], tiny_text: Path, tmp_path: Path) -> None:
    """Exporting a text-only checkpoint over an export of five towers kept the other model's
    image, video, audio and decoder beside the new text tower: a folder of two embedding spaces."""
    path, _ = exported
    out = tmp_path / "out"
    assert main(["export", str(path), str(out), "-q"]) == 0
    (out / "notes.txt").write_text("the user's")
    (out / "mine.json").write_text("{}")
    assert main(["export", str(tiny_text), str(out), "-q"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["mine.json", "notes.txt", "text.json", "text.onnx"]
    assert json.loads((out / "text.json").read_text())["tower"] == "text"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_pytorch_reference_runs_in_half_precision(exported: tuple[Path, Path], dtype: str) -> None:
    """ReferenceModel.from_checkpoint(path, dtype=torch.bfloat16) built, then failed on every text
    and decoder call ('expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16':
    the float32 attention mask widened the scores) and on audio (float32 log-mel into bf16 weights)."""
    torch = pytest.importorskip("torch")
    from uform.exporters.reference import ReferenceModel

    path, _ = exported
    models = {d: ReferenceModel.from_checkpoint(path, dtype=getattr(torch, d)) for d in ("float32", dtype)}
    rng = np.random.default_rng(0)
    cfg = models["float32"].config.towers
    image, video = cfg["image"]["image_size"], cfg["video"]["image_size"]
    inputs = {
        "text": lambda t: t.encode([b"a red circle", b"", b"x" * 300])[0],
        "image": lambda t: t(torch.from_numpy(rng.integers(0, 256, (2, image, image, 3), dtype=np.uint8))),
        "video": lambda t: t(torch.from_numpy(rng.integers(0, 256, (2, cfg["video"]["frames"], video, video, 3), dtype=np.uint8))),
        "audio": lambda t: t.encode(torch.from_numpy(rng.standard_normal((2, cfg["audio"]["samples"])).astype(np.float32))),
        "decoder": lambda t: t.logits([b"a cat", b""]),
    }
    assert set(inputs) == set(models["float32"].towers)
    for name, run in inputs.items():
        with torch.no_grad():
            state = rng.bit_generator.state
            want = run(models["float32"].towers[name])
            rng.bit_generator.state = state  # the same pixels and samples for both
            got = run(models[dtype].towers[name])
        assert got.dtype == getattr(torch, dtype), name
        scale = float(want.abs().max())
        assert float((got.float() - want).abs().max()) <= 0.02 * scale, name


def test_an_export_the_machine_cannot_hold_is_refused_from_the_header_before_anything_is_written(
    tiny_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sparse 32 GB checkpoint, which Model.load_ram refuses from its header in 1.5 s, was read
    # (10 s and more of zero pages) and then made into float32 towers: 64 GB for 24 GiB of RAM.
    import re

    from uform.core import runtime, safetensors
    from uform.exporters import towers

    with uform.core.checkpoint.CheckpointFile(tiny_text) as source:
        values = sum(int(np.prod(e.shape)) for e in source.entries.values())
    monkeypatch.setattr(runtime, "machine_memory", lambda: 2 * values)  # BF16's two bytes a value fit, float32's four do not
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(safetensors, "check_finite", lambda *a: pytest.fail("a weight was read"))
        message = (
            f"{tiny_text}: its {values:,} weight values take at least {4 * values:,} bytes at F32, more than this "
            f"machine's {2 * values:,} bytes of RAM and swap: it cannot be exported here"
        )
        with pytest.raises(uform.UnsupportedError, match=f"^{re.escape(message)}$"):
            towers.export_towers(tiny_text, out)
        assert not out.exists()
        assert main(["export", str(tiny_text), str(out)]) == 2
        assert not out.exists()
    assert set(towers.export_towers(tiny_text, out, "bf16")) == {"text"}
