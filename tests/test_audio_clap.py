"""CLAP's audio tower (``front: "clap"``): the front end against transformers'
``ClapFeatureExtractor`` + ``batch_norm`` + ``reshape_mel2img``, the whole tower against
``ClapModel.get_audio_features``, and the refusals (config and conversion).

The models are random (tests/clap_audio_models.py): laion/clap-htsat-unfused's front end and
Swin layout at reduced widths and depths.
"""

from __future__ import annotations

import json
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clap_audio_models import audio_file, clap_folder

import uform
from uform.core.errors import CheckpointError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

R, N = 48000, 480000
BOUNDS = {uform.Scalar.F32: 0.99999, uform.Scalar.BF16: 0.9995, uform.Scalar.E4M3: 0.99}  # the converted models' (docs/models.md)


def signals() -> list[np.ndarray]:
    """A tone in noise (10 s), noise (3.1 s), a quiet beating tone (0.15 s), noise (12.5 s: cut)."""
    rng = np.random.default_rng(0)
    t = np.arange(600000) / R
    return [
        (0.3 * np.sin(2 * np.pi * 440 * t[:N]) + 0.05 * rng.standard_normal(N)).astype(np.float32),
        (0.5 * rng.standard_normal(150000)).astype(np.float32),
        (0.2 * np.sin(2 * np.pi * 3000 * t[:7001]) * np.sin(2 * np.pi * 5 * t[:7001])).astype(np.float32),
        (0.5 * rng.standard_normal(600000)).astype(np.float32),
    ]


def features(folder: Path, items: list[np.ndarray], **kw: Any) -> Any:
    """transformers' features, its random crop of a long recording pinned to the start (uform's window)."""
    extractor = transformers.ClapFeatureExtractor.from_pretrained(folder, **kw)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(np.random, "randint", lambda low, high=None, *a, **k: 0)
        return extractor(items, sampling_rate=R, return_tensors="pt")


@pytest.fixture(scope="module")
def clap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, Path]]:
    d = tmp_path_factory.mktemp("clap")
    model = clap_folder(d / "clap")
    yield model, d / "clap", audio_file(d / "clap", d / "audio.safetensors")


@pytest.mark.parametrize("padding", ["repeatpad", "repeat", "pad"])
def test_front_end_equals_transformers_features_batch_norm_and_mel2img(clap: tuple[Any, Path, Path], padding: str) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper

    from uform.core import safetensors as st
    from uform.core.config import ModelConfig
    from uform.core.graph import GraphBuilder
    from uform.plugins.melfront import clap as audio_clap

    model, folder, path = clap
    container = st.parse(memoryview(path.read_bytes()))
    config = ModelConfig.from_metadata(container.metadata)
    t = audio_clap.read(config.towers["audio"], "towers.audio")
    b = GraphBuilder("front")
    b.output(audio_clap.front_graph(b, b.input("samples", TensorProto.FLOAT, ["batch", N]), t.front), "image", None, ["batch", 1, 256, 256])
    graph = b.build()
    graph.graph.initializer.extend(numpy_helper.from_array(container.array(k).astype(np.float32), k) for k in audio_clap.front_tensors(t.front))
    items = signals()
    windows = []
    for x in items:
        window = np.zeros(N, np.float32)
        window[: min(len(x), N)] = x[:N]
        windows.append(audio_clap.fill(window, min(len(x), N), padding))
    ours = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"samples": np.stack(windows)})[0]
    encoder = model.audio_model.audio_encoder
    with torch.no_grad():
        x = features(folder, items, padding=padding)["input_features"]
        ref = encoder.reshape_mel2img(encoder.batch_norm(x.transpose(1, 3)).transpose(1, 3)).numpy()
    assert ours.shape == ref.shape == (4, 1, 256, 256)
    error = np.abs(ours - ref).reshape(4, -1)
    # the quiet tone's faint bins (near -100 dB) differ by what float32's DFT can resolve next to its loud ones
    assert error[[0, 1, 3]].mean(axis=1).max() < 2e-6 and error[2].mean() < 1e-4, error.mean(axis=1)
    assert error[[0, 1, 3]].max() < 1e-4 and error[2].max() < 5e-3, error.max(axis=1)


def test_tower_equals_get_audio_features(clap: tuple[Any, Path, Path]) -> None:
    model, folder, path = clap
    items = signals()
    with torch.no_grad():
        ref = model.get_audio_features(**features(folder, items)).pooler_output.numpy()
    for scalar, floor in BOUNDS.items():
        with uform.Model.load_ram(path, quantization=scalar) as m:
            ours = np.asarray(m.audio_encode_samples(items, R, uform.Arena()).embeddings, np.float32)
        cosines = ours @ ref.T
        assert np.diag(cosines).min() >= floor, (scalar, np.diag(cosines))
        assert (cosines.argmax(axis=1) == np.arange(len(items))).all(), (scalar, cosines)


def test_a_file_is_its_samples_and_a_short_one_is_repeated(clap: tuple[Any, Path, Path], tmp_path: Path) -> None:
    _, _, path = clap
    x = signals()[1]
    with wave.open(str(tmp_path / "a.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(R)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    pcm = np.frombuffer((tmp_path / "a.wav").read_bytes()[44:], "<i2").astype(np.float32) / 32768
    with uform.Model.load_ram(path, quantization=uform.Scalar.F32) as m:
        from_file = np.asarray(m.audio_encode([tmp_path / "a.wav"], uform.Arena()).embeddings)
        from_samples = np.asarray(m.audio_encode_samples([pcm, np.tile(pcm, 3)[:450000]], R, uform.Arena()).embeddings)
        lone = np.asarray(m.audio_encode_samples([np.ones(1, np.float32)], 384000, uform.Arena()).embeddings)  # under one sample at 48 kHz
    np.testing.assert_allclose(from_file[0], from_samples[0], atol=1e-6)
    np.testing.assert_allclose(from_samples[0], from_samples[1], atol=1e-6)  # repeatpad: 3 copies of 150,000 samples, then zeros
    assert np.isfinite(lone).all()


def _tower(**changes: Any) -> dict[str, Any]:
    base = {
        "front": "clap", "sample_rate": R, "samples": N, "n_fft": 1024, "hop": 480, "n_mels": 64, "f_min": 50, "f_max": 14000,
        "padding": "repeatpad", "projection": "mlp", "image_size": 256, "channels": 1, "patch_size": 4, "embed_dim": 16,
        "depths": [1, 1], "heads": [1, 2], "window_size": 8, "mlp_ratio": 4.0,
    }  # fmt: skip
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"channels": 4}, "config field towers.audio.channels: 4; the CLAP front end makes one channel"),
        ({"n_mels": 60}, "config field towers.audio.n_mels: 60 mel bins times a whole number must make image_size 256"),
        ({"samples": 500000}, "config field towers.audio.samples: 1042 frames are more than the 1024 rows of image_size 256"),
        ({"f_min": 14000}, r"config field towers.audio.f_max: 14000 Hz is not above f_min, 14000 Hz"),
        ({"padding": "wrap"}, "config field towers.audio.padding: expected one of 'repeatpad', 'repeat', 'pad', got 'wrap'"),
        ({"patch_frames": 4}, r"config field towers.audio.patch_frames: not a field of a CLAP audio tower \(it has activation, channels"),
        ({"projection": "linear"}, "config field towers.audio.projection: expected one of 'mlp', got 'linear'"),
    ],
)
def test_config_is_checked_naming_the_field(changes: dict[str, Any], message: str) -> None:
    from uform.plugins.melfront import clap as audio_clap

    with pytest.raises(CheckpointError, match=message):
        audio_clap.read(_tower(**changes), "towers.audio")


@pytest.mark.parametrize(
    ("front", "message"),
    [
        ({"truncation": "fusion"}, "preprocessor_config.json: truncation 'fusion' is not supported; supported: 'rand_trunc'"),
        ({"feature_size": 32}, "preprocessor_config.json: feature_size 32 differs from .*config.json audio_config's num_mel_bins 64"),
        ({"padding": "edge"}, "preprocessor_config.json: padding 'edge' is not supported"),
    ],
)
def test_a_front_end_uform_does_not_run_is_refused_by_name(tmp_path: Path, front: dict[str, Any], message: str) -> None:
    from uform.convert.sources import ConvertError

    folder = tmp_path / "clap"
    clap_folder(folder)
    path = folder / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **front}))
    with pytest.raises(ConvertError, match=message):
        audio_file(folder, tmp_path / "out.safetensors")
    path.unlink()
    with pytest.raises(ConvertError, match="no preprocessor_config.json"):
        audio_file(folder, tmp_path / "out.safetensors")


def test_a_version_1_file_may_not_carry_front() -> None:
    from uform.core.config import make_config

    with pytest.raises(CheckpointError, match=r"config field towers.audio.front: needs format_version 2 \(the file says 1\)"):
        make_config(32, 1, {"audio": _tower()}, format_version=1)


def test_export_writes_the_tower_and_says_how_its_window_is_filled(clap: tuple[Any, Path, Path], tmp_path: Path) -> None:
    import onnxruntime as ort

    from uform.exporters.towers import export_towers

    _, _, path = clap
    export_towers(path, tmp_path)
    said = json.loads((tmp_path / "audio.json").read_text())
    assert "repeated floor(N / length) times, then zero-padded (padding 'repeatpad'" in said["preprocessing"]
    items = signals()[:2]
    windows = np.stack([np.tile(x, -(-N // len(x)))[:N] * (np.arange(N) < N // len(x) * len(x)) for x in items]).astype(np.float32)
    exported = ort.InferenceSession(str(tmp_path / "audio.onnx"), providers=["CPUExecutionProvider"]).run(None, {"samples": windows})[0]
    with uform.Model.load_ram(path, quantization=uform.Scalar.F32) as m:
        ours = np.asarray(m.audio_encode_samples(items, R, uform.Arena()).embeddings)
    np.testing.assert_allclose(exported, ours, atol=1e-5)


def test_the_dft_computes_only_the_bins_the_mel_bank_uses() -> None:
    from onnx import TensorProto, numpy_helper

    from uform.core.graph import GraphBuilder
    from uform.plugins.melfront import clap as audio_clap

    t = audio_clap.read(_tower(), "towers.audio")
    b = GraphBuilder("front")
    audio_clap.front_graph(b, b.input("samples", TensorProto.FLOAT, ["batch", N]), t.front)
    shapes = {c.name.rsplit("_", 1)[0]: numpy_helper.to_array(c).shape for c in b.constants}
    assert shapes["dft_cos"] == shapes["dft_sin"] == (512, 297) and shapes["mel"] == (297, 64)  # bins 2 … 298 of 513: 50 … 14000 Hz


def test_a_recordings_image_does_not_depend_on_the_batch_at_any_thread_count() -> None:
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper

    from uform.core.graph import GraphBuilder
    from uform.plugins.melfront import clap as audio_clap

    t = audio_clap.read(_tower(), "towers.audio")
    b = GraphBuilder("front")
    b.output(audio_clap.front_graph(b, b.input("samples", TensorProto.FLOAT, ["batch", N]), t.front), "image", None, ["batch", 1, 256, 256])
    graph = b.build()
    graph.graph.initializer.extend([numpy_helper.from_array(np.full(64, 0.1, np.float32), "audio.mel_norm.scale"), numpy_helper.from_array(np.zeros(64, np.float32), "audio.mel_norm.shift")])
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, N)) * rng.uniform(0.01, 0.5, (4, 1))).astype(np.float32)
    for threads in (3, 8):  # ORT's Log moved an element's last bit with the batch at 3, 6, 8 and 16 threads (4.8e-7)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
        alone = np.concatenate([session.run(None, {"samples": x[i : i + 1]})[0] for i in range(4)])
        for count in (2, 3, 4):
            np.testing.assert_array_equal(session.run(None, {"samples": x[:count]})[0], alone[:count])


def test_a_recordings_row_does_not_depend_on_the_recordings_beside_it(clap: tuple[Any, Path, Path]) -> None:
    _, _, path = clap
    items = signals()
    for scalar in (uform.Scalar.F32, uform.Scalar.E4M3):
        with uform.Model.load_ram(path, quantization=scalar, executor=uform.Executor(3)) as m:  # 3 threads: where ORT's Log moved bits
            alone = np.concatenate([np.asarray(m.audio_encode_samples([x], R, uform.Arena()).embeddings) for x in items])
            np.testing.assert_array_equal(np.asarray(m.audio_encode_samples(items, R, uform.Arena()).embeddings), alone)
