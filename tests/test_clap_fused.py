"""A fused CLAP's audio tower (``fusion: "aff"``, laion/clap-htsat-fused) against transformers'
``ClapFeatureExtractor(truncation="fusion")`` + ``ClapModel.get_audio_features``: recordings up to
the window (channel 0 only), longer ones (the fusion, transformers' random crops pinned to
uform's: the middle of each third), past ``max_samples`` (cut), mixed batches, files, export,
the index, and the refusals.

The model is random (tests/clap_audio_models.py's reduced HTSAT, fused), its fusion's BatchNorm
statistics drawn away from 0 and 1 so that folding them matters.
"""

from __future__ import annotations

import json
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clap_audio_models import AUDIO, FRONT, TEXT, audio_file

import uform
from uform.core.errors import CheckpointError
from uform.plugins.audio import AudioEncodeStats

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

R, N = 48000, 480000
MAX = 6 * N
BOUNDS = {uform.Scalar.F32: 0.99999, uform.Scalar.BF16: 0.9995, uform.Scalar.E4M3: 0.99}  # the converted models' (docs/models.md)
FUSED = {**AUDIO, "enable_fusion": True, "fusion_type": "aff_2d"}
# lengths in samples: short ones, the window, under one hop past it (transformers: not longer),
# just past it (crops at frames 0, 1, 2), 14.6 s, 31.25 s, the most read (60 s), and past it (cut)
LENGTHS = (7001, 150000, N, N + 100, N + 1000, 700000, 1500000, MAX, MAX + 96000)


def fused_folder(path: Path, seed: int = 0) -> Any:
    """A random fused ``ClapModel`` saved to ``path`` with its ``fusion`` feature extractor."""
    torch.manual_seed(seed)
    model = transformers.ClapModel(transformers.ClapConfig(text_config=TEXT, audio_config=FUSED, projection_dim=32)).eval()
    with torch.no_grad():
        for name, m in model.audio_model.audio_encoder.named_modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                big = name == "batch_norm"
                m.running_mean.normal_(-40 if big else 0, 10 if big else 0.5)
                m.running_var.uniform_(50 if big else 0.5, 400 if big else 2)
                m.weight.normal_(1, 0.2)
                m.bias.normal_(0, 0.3)
    model.save_pretrained(path)
    transformers.ClapFeatureExtractor(**{**FRONT, "truncation": "fusion"}).save_pretrained(path)
    return model


def signals(lengths: tuple[int, ...] = LENGTHS) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for i, n in enumerate(lengths):
        t = np.arange(n) / R
        tone = 0.3 * np.sin(2 * np.pi * (220 + 110 * i) * t) * (t < 5 + i)  # a tone that stops: the crops differ
        out.append((tone + 0.05 * rng.standard_normal(n)).astype(np.float32))
    return out


def middle(a: Any) -> int:
    """uform's crop of a third (``np.random.choice`` pinned): its middle start."""
    a = np.asarray(a)
    return int(a[(len(a) - 1) // 2])


def reference(model: Any, folder: Path, items: list[np.ndarray]) -> np.ndarray:
    """get_audio_features of transformers' fusion features, the crops pinned to uform's and
    ``is_longer`` each recording's own (transformers marks one at random where none is)."""
    extractor = transformers.ClapFeatureExtractor.from_pretrained(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(np.random, "choice", middle)
        features = extractor([x[:MAX] for x in items], sampling_rate=R, return_tensors="pt")
    longer = torch.tensor([[len(x) > N and 1 + min(len(x), MAX) // 480 > 1 + N // 480] for x in items])
    with torch.no_grad():
        ref = model.get_audio_features(input_features=features["input_features"], is_longer=longer).pooler_output.numpy()
    return ref / np.linalg.norm(ref, axis=1, keepdims=True)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, Path]]:
    d = tmp_path_factory.mktemp("fused")
    model = fused_folder(d / "clap")
    yield model, d / "clap", audio_file(d / "clap", d / "audio.safetensors")


def test_the_conversion_writes_a_fused_tower(fused: tuple[Any, Path, Path]) -> None:
    from uform.core import safetensors as st
    from uform.core.config import ModelConfig

    _, _, path = fused
    tower = ModelConfig.from_metadata(st.parse(memoryview(path.read_bytes())).metadata).towers["audio"]
    assert (tower["fusion"], tower["fusion_ratio"], tower["max_samples"], tower["channels"]) == ("aff", 4, MAX, 1)


def test_recordings_short_and_long_equal_get_audio_features(fused: tuple[Any, Path, Path]) -> None:
    model, folder, path = fused
    items = signals()
    ref = reference(model, folder, items)
    for scalar, floor in BOUNDS.items():
        with uform.Model.load_ram(path, quantization=scalar) as m:
            ours = np.asarray(m.audio_encode_samples(items, R, uform.Arena()).embeddings, np.float32)
        cosines = ours @ ref.T
        print(scalar, np.round(np.diag(cosines), 7))
        assert np.diag(cosines).min() >= floor, (scalar, np.diag(cosines))
        assert (cosines.argmax(axis=1) == np.arange(len(items))).all(), (scalar, cosines)


def test_the_fusion_matters_and_the_crops_are_the_middle_of_each_third(fused: tuple[Any, Path, Path]) -> None:
    model, folder, path = fused
    x = signals((1500000,))[0]
    items = [x * (np.arange(len(x)) < 4 * R)]  # loud for 4 s, then silent: the first third's crops differ most
    with uform.Model.load_ram(path, quantization=uform.Scalar.F32) as m:
        ours = np.asarray(m.audio_encode_samples(items, R, uform.Arena()).embeddings, np.float32)[0]
    ref = reference(model, folder, items)[0]
    extractor = transformers.ClapFeatureExtractor.from_pretrained(folder)
    with pytest.MonkeyPatch.context() as patch:  # the crops at the start of each third instead
        patch.setattr(np.random, "choice", lambda a: int(np.asarray(a)[0]))
        features = extractor(items, sampling_rate=R, return_tensors="pt")
    with torch.no_grad():
        starts = model.get_audio_features(input_features=features["input_features"], is_longer=torch.tensor([[True]])).pooler_output.numpy()[0]
        unfused = model.get_audio_features(input_features=features["input_features"], is_longer=torch.tensor([[False]])).pooler_output.numpy()[0]
    near = [float(ours @ (v / np.linalg.norm(v))) for v in (ref, starts, unfused)]
    print(near)
    assert near[0] >= 0.9999995 and max(near[1:]) <= 0.99999, near


def test_a_recordings_row_does_not_depend_on_the_recordings_beside_it(fused: tuple[Any, Path, Path]) -> None:
    _, _, path = fused
    items = signals()
    for scalar in BOUNDS:
        with uform.Model.load_ram(path, quantization=scalar) as m:
            together = np.asarray(m.audio_encode_samples(items, R, uform.Arena()).embeddings, np.float32)
            for i in (0, 4, 6, 1):  # short, long, long, short: each alone
                alone = np.asarray(m.audio_encode_samples([items[i]], R, uform.Arena()).embeddings, np.float32)[0]
                assert np.array_equal(alone, together[i]), (scalar, i, np.abs(alone - together[i]).max())


def test_a_file_is_its_samples_and_stats_count_the_window(fused: tuple[Any, Path, Path], tmp_path: Path) -> None:
    _, _, path = fused
    items = signals((150000, 1500000, MAX + 96000))
    files = []
    for i, x in enumerate(items):
        files.append(tmp_path / f"{i}.wav")
        with wave.open(str(files[-1]), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(R)
            w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    pcm = [np.frombuffer(f.read_bytes()[44:], "<i2").astype(np.float32) / 32768 for f in files]
    stats = AudioEncodeStats()
    with uform.Model.load_ram(path, quantization=uform.Scalar.F32) as m:
        from_files = np.asarray(m.audio_encode(files, uform.Arena(), stats=stats).embeddings)
        from_samples = np.asarray(m.audio_encode_samples(pcm, R, uform.Arena()).embeddings)
    np.testing.assert_allclose(from_files, from_samples, atol=1e-6)
    assert (stats.padded_items, stats.truncated_items) == (1, 1)  # shorter than the window; read past max_samples


def test_export_writes_the_fused_tower_and_says_what_it_reads(fused: tuple[Any, Path, Path], tmp_path: Path) -> None:
    import onnxruntime as ort

    from uform.core import safetensors as st
    from uform.core.config import ModelConfig
    from uform.exporters.towers import export_towers
    from uform.plugins.media.window import Recording
    from uform.plugins.melfront import fusion

    _, _, path = fused
    export_towers(path, tmp_path)
    said = json.loads((tmp_path / "audio.json").read_text())
    assert "first `max_samples` samples; mels: the four log-mel channels in dB" in said["preprocessing"]
    items = signals((150000, 1500000))
    with uform.Model.load_ram(path, quantization=uform.Scalar.F32) as m:
        ours = np.asarray(m.audio_encode_samples(items, R, uform.Arena()).embeddings)
    t = fusion.read(ModelConfig.from_metadata(st.parse(memoryview(path.read_bytes())).metadata).towers["audio"], "towers.audio")
    bank = fusion.htk_mel(t.front)
    read = [np.pad(x, (0, MAX - len(x))) for x in items]  # as the host reads them: to max_samples, zero-padded
    made = [fusion.mels(Recording(x, len(x) / R, False, False, len(y)), t.fusion, bank) for x, y in zip(read, items)]
    feeds = {"mels": np.stack([c for c, _ in made]), "longer": np.array([lo for _, lo in made])}
    exported = ort.InferenceSession(str(tmp_path / "audio.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(exported, ours, atol=1e-5)


def _tower(**changes: Any) -> dict[str, Any]:
    base = {
        "front": "clap", "sample_rate": R, "samples": N, "n_fft": 1024, "hop": 480, "n_mels": 64, "f_min": 50, "f_max": 14000,
        "padding": "repeatpad", "projection": "mlp", "image_size": 256, "channels": 1, "patch_size": 4, "embed_dim": 16,
        "depths": [1, 1], "heads": [1, 2], "window_size": 8, "mlp_ratio": 4.0, "fusion": "aff", "fusion_ratio": 4, "max_samples": MAX,
    }  # fmt: skip
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"fusion": "daf"}, "config field towers.audio.fusion: expected one of 'aff', got 'daf'"),
        ({"max_samples": N - 1}, r"config field towers.audio.max_samples: expected an integer in \[480000, 30720000\], got 479999"),
        ({"max_samples": 65 * N}, r"config field towers.audio.max_samples: expected an integer in \[480000, 30720000\]"),
        ({"max_samples": None}, "config field towers.audio.max_samples is missing"),
        ({"fusion_ratio": 17}, r"config field towers.audio.fusion_ratio: expected an integer in \[1, 16\], got 17"),
        ({"n_mels": 32, "image_size": 128, "samples": 240000}, "config field towers.audio.n_mels: 32; a fused tower's long recordings are shrunk to 64 mel bins"),
        ({"patch_size": 128, "depths": [1], "heads": [1], "window_size": 2}, "config field towers.audio.patch_size: 128; a fused tower's crops are read 3 patches wide"),
    ],
)
def test_config_is_checked_naming_the_field(changes: dict[str, Any], message: str) -> None:
    from uform.plugins.melfront import fusion

    with pytest.raises(CheckpointError, match=message):
        fusion.read(_tower(**changes), "towers.audio")


def test_an_unfused_tower_may_not_say_max_samples() -> None:
    from uform.plugins.melfront import clap

    with pytest.raises(CheckpointError, match=r"config field towers.audio.max_samples: not a field of a CLAP audio tower"):
        clap.read(_tower(fusion=None, fusion_ratio=None), "towers.audio")


@pytest.mark.parametrize(
    ("file", "change", "message"),
    [
        ("preprocessor_config.json", {"truncation": "rand_trunc"}, r"truncation 'rand_trunc' is not supported for a fused model \(.*enable_fusion true\); supported: 'fusion'"),
        ("config.json", {"fusion_type": "channel_map"}, "audio_config: fusion_type 'channel_map' .* is not supported; the attentional fusion is"),
        ("config.json", {"enable_fusion": "yes"}, "audio_config: field 'enable_fusion' is 'yes', not true or false"),
    ],
)
def test_a_fused_checkpoint_uform_cannot_run_is_refused_by_name(fused: tuple[Any, Path, Path], tmp_path: Path, file: str, change: dict[str, Any], message: str) -> None:
    import shutil

    from uform.convert.sources import ConvertError

    _, folder, _ = fused
    copy = tmp_path / "clap"
    shutil.copytree(folder, copy)
    cfg = json.loads((copy / file).read_text())
    (cfg["audio_config"] if file == "config.json" else cfg).update(change)
    (copy / file).write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match=message):
        audio_file(copy, tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``uform convert`` of a whole fused ClapModel (tests/clap_text_models.py's, fused)."""
    pytest.importorskip("tokenizers")
    from clap_text_models import AUDIO_SMALL, make_clap

    from uform.convert import convert

    directory = make_clap(tmp_path_factory.mktemp("clap") / "fused", audio={**AUDIO_SMALL, "enable_fusion": True, "fusion_type": "aff_2d"})
    transformers.ClapFeatureExtractor(truncation="fusion").save_pretrained(directory)  # a fused model's
    out = directory.parent / "fused.safetensors"
    conversion = convert(directory, out, dtype="f32")
    return {"directory": directory, "file": out, "conversion": conversion, "model": transformers.ClapModel.from_pretrained(str(directory)).eval()}


def test_uform_convert_says_how_a_fused_model_reads_long_recordings(converted: dict[str, Any]) -> None:
    assert any("recordings are read to 6 windows (60 s)" in note and "middle of each third" in note for note in converted["conversion"].notes)


def test_label_probabilities_of_long_and_short_recordings_equal_logits_per_audio(converted: dict[str, Any]) -> None:
    model, folder = converted["model"], converted["directory"]
    labels = ["rain on a roof", "a dog barks", "the sound of rain on a tin roof"]
    items = signals((150000, 700000, 1500000))
    extractor = transformers.ClapFeatureExtractor.from_pretrained(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(np.random, "choice", middle)
        features = extractor(items, sampling_rate=R, return_tensors="pt")
    inputs = transformers.AutoTokenizer.from_pretrained(str(folder))(labels, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = model(**inputs, input_features=features["input_features"], is_longer=torch.tensor([[False], [True], [True]])).logits_per_audio.softmax(-1).numpy()
    with uform.Model.load_ram(converted["file"], quantization=uform.Scalar.F32) as m:
        got = m.label_probabilities(m.audio_encode_samples(items, R, uform.Arena()).embeddings, labels)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_server_and_the_index_take_long_recordings_as_the_model_does(converted: dict[str, Any], tmp_path: Path) -> None:
    import base64

    import httpx
    from media_audio import write
    from serving import thread_server

    from uform.index import Index
    from uform.serve import ServeConfig

    folder = tmp_path / "sounds"
    folder.mkdir()
    paths = [write(folder / f"s{i}.flac", x[None], R, "flac") for i, x in enumerate(signals((150000, 700000, 1500000)))]
    with uform.Model.load_ram(converted["file"]) as model:
        rows = np.asarray(model.audio_encode(paths, uform.Arena()).embeddings)
        query = np.asarray(model.text_encode(["rain on a roof"], uform.Arena()).embeddings)[0]
        parts = [{"type": "input_audio", "input_audio": {"data": base64.b64encode(p.read_bytes()).decode(), "format": "flac"}} for p in paths]
        with thread_server(model, ServeConfig(model_id="clap")) as (url, _):
            answer = httpx.post(url + "/v1/embeddings", json={"input": parts}, timeout=120)
    assert answer.status_code == 200, answer.text
    np.testing.assert_array_equal(np.array([d["embedding"] for d in answer.json()["data"]], np.float32), rows)
    with Index(tmp_path / "sounds.index", checkpoint=str(converted["file"])) as index:
        index.update([folder])
        hits = index.search("rain on a roof", k=3, modalities=["audio"])
    assert [Path(h.path).name for h in hits] == [paths[i].name for i in np.argsort(-(rows @ query))]


if __name__ == "__main__":  # the memory figures of docs/checkpoint-clap.md (it gives the commands)
    import sys
    import time

    from clap_audio_models import clap_folder

    if sys.argv[1] == "htsat":  # htsat DIR: laion's widths and depths against transformers, 5 recordings
        import clap_audio_models

        clap_audio_models.AUDIO.update(depths=[2, 2, 6, 2], num_attention_heads=[4, 8, 16, 32], patch_embeds_hidden_size=96, hidden_size=768)
        FUSED.update(clap_audio_models.AUDIO, enable_fusion=True, fusion_type="aff_2d")
        out = Path(sys.argv[2])
        model = fused_folder(out / "clap")
        model_path = audio_file(out / "clap", out / "audio.safetensors")
        items = signals((150000, N, 700000, 1500000, MAX))
        ref = reference(model, out / "clap", items)
        for scalar in BOUNDS:
            with uform.Model.load_ram(model_path, quantization=scalar) as m:
                cosines = np.asarray(m.audio_encode_samples(items, R, uform.Arena()).embeddings, np.float32) @ ref.T
            print(scalar, np.round(np.diag(cosines), 7).tolist(), "each nearest its own:", bool((cosines.argmax(axis=1) == np.arange(len(items))).all()))
    elif sys.argv[1] == "logmel":  # the host's log-mel of 10 s and 60 s of noise, best of 5
        from uform.plugins.melfront import clap, fusion

        front = clap.ClapFront(R, N, 1024, 480, 64, 50.0, 14000.0, "repeatpad", 256)
        bank = fusion.htk_mel(front)
        x = (0.3 * np.random.default_rng(0).standard_normal(MAX)).astype(np.float32)
        for n in (N, MAX):
            took = []
            for _ in range(5):
                started = time.perf_counter()
                fusion.log_mel(x[:n], front, bank)
                took.append(time.perf_counter() - started)
            print(f"log-mel of {n / R:g} s: {min(took) * 1000:.0f} ms")
    elif sys.argv[1] == "build":  # build DIR: DIR/fused.safetensors and DIR/unfused.safetensors
        out = Path(sys.argv[2])
        fused_folder(out / "fused")
        clap_folder(out / "unfused")
        for kind in ("fused", "unfused"):
            audio_file(out / kind, out / f"{kind}.safetensors")
    else:  # FILE SECONDS: 8 recordings of noise
        x = (0.3 * np.random.default_rng(0).standard_normal(int(float(sys.argv[2]) * R))).astype(np.float32)
        with uform.Model.load_ram(sys.argv[1], quantization=uform.Scalar.F32) as m:
            m.audio_encode_samples([x[:R]], R, uform.Arena())
            started = time.perf_counter()
            m.audio_encode_samples([x] * 8, R, uform.Arena())
            print(f"8 recordings of {sys.argv[2]} s: {time.perf_counter() - started:.2f} s")
