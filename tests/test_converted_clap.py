"""``uform convert`` of a transformers ``ClapModel`` (random weights, the real layout at a small
width: tests/clap_text_models.py) against ``get_text_features`` with its tokenizer and
``get_audio_features`` with its ``ClapFeatureExtractor``: texts, recordings as files (WAV, FLAC,
MP3 at 16, 44.1 and 48 kHz; 3, 10 and 25 s) and as buffers, at F32, BF16 and E4M3."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uform
from uform.convert import ConvertError, convert
from uform import Arena, Scalar

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
av = pytest.importorskip("av")

from clap_text_models import TEXTS, make_clap  # noqa: E402
from media_audio import write  # noqa: E402

from uform.plugins.media.audio import decode  # noqa: E402
from uform.plugins.media.files import sources  # noqa: E402

RATE, SECONDS = 48000, 10  # the feature extractor's sampling_rate and max_length_s
# (codec, rate, seconds): every format at every rate, a recording shorter than, as long as, and longer than the window
FILES = [("pcm_s16le", 48000, 3), ("flac", 44100, 10), ("libmp3lame", 16000, 25), ("pcm_s16le", 16000, 25), ("flac", 48000, 25), ("libmp3lame", 44100, 3)]
SUFFIX = {"pcm_s16le": ".wav", "flac": ".flac", "libmp3lame": ".mp3"}


@pytest.fixture(scope="module")
def clap(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = make_clap(tmp_path_factory.mktemp("clap"))
    out = directory.parent / "clap.safetensors"
    conversion = convert(directory, out, dtype="f32")
    return {
        "directory": directory, "file": out, "conversion": conversion,
        "model": transformers.ClapModel.from_pretrained(str(directory)).eval(),
        "tokenizer": transformers.AutoTokenizer.from_pretrained(str(directory)),
        "extractor": transformers.ClapFeatureExtractor.from_pretrained(str(directory)),
    }  # fmt: skip


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(np.asarray(a, np.float64) * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _signal(seconds: float, rate: int, seed: int) -> np.ndarray:
    """Mono [1, n]: a few tones below 8 kHz (every rate here holds them) and some noise, -1…1."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * rate)) / rate
    tones = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) * a for f, a in zip(rng.uniform(80, 7000, 4), (0.3, 0.2, 0.1, 0.05)))
    return (tones + rng.standard_normal(t.size) * 0.02).astype(np.float32)[None] * 0.8


def _audio_reference(clap: dict[str, Any], recordings: list[np.ndarray]) -> np.ndarray:
    """get_audio_features of 48 kHz recordings, a longer one cropped at its start (rand_trunc's random crop pinned to 0)."""
    window = RATE * SECONDS
    features = clap["extractor"]([r[:window] for r in recordings], sampling_rate=RATE, return_tensors="pt")
    with torch.no_grad():
        return clap["model"].get_audio_features(**features).pooler_output.numpy()  # type: ignore[no-any-return]


def test_the_conversion_says_what_it_wrote(clap: dict[str, Any]) -> None:
    c = clap["conversion"]
    assert (c.family, c.architecture) == ("clap", "ClapModel")
    with uform.Model.load_ram(clap["file"]) as model:
        assert model.source is not None and model.source["family"] == "clap"


def test_texts_equal_get_text_features(clap: dict[str, Any]) -> None:
    encoded = clap["tokenizer"](TEXTS, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        want = clap["model"].get_text_features(**encoded).pooler_output.numpy()
    with uform.Model.load_ram(clap["file"], quantization=Scalar.F32) as model:
        got = model.text_encode(TEXTS, Arena()).embeddings
    assert _cos(got, want).min() >= 0.99999
    assert ((got @ want.T).argmax(axis=1) == np.arange(len(TEXTS))).all()


def test_buffers_equal_get_audio_features(clap: dict[str, Any]) -> None:
    """3, 10 and 25 s at 48 kHz: repeatpad, exact, and the first 10 s (uform's deterministic crop)."""
    recordings = [_signal(s, RATE, seed)[0] for seed, s in enumerate((3, 10, 25, 0.5))]
    want = _audio_reference(clap, recordings)
    with uform.Model.load_ram(clap["file"], quantization=Scalar.F32) as model:
        got = model.audio_encode_samples(recordings, RATE, Arena()).embeddings
    assert _cos(got, want).min() >= 0.99999
    assert ((got @ want.T).argmax(axis=1) == np.arange(len(recordings))).all()


def test_a_long_recording_is_its_first_window_where_transformers_crops_at_random(clap: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    long = _signal(25, RATE, 7)[0]
    monkeypatch.setattr(np.random, "randint", lambda low, high=None, *a, **k: 0)  # rand_trunc's crop, pinned at the start
    features = clap["extractor"]([long], sampling_rate=RATE, return_tensors="pt")
    with torch.no_grad():
        want = clap["model"].get_audio_features(**features).pooler_output.numpy()
    with uform.Model.load_ram(clap["file"], quantization=Scalar.F32) as model:
        got = model.audio_encode_samples([long], RATE, Arena()).embeddings
    assert _cos(got, want).min() >= 0.99999


def test_files_equal_get_audio_features_of_their_decoded_samples(clap: dict[str, Any], tmp_path: Path) -> None:
    """Each file decoded and resampled to 48 kHz as uform decodes it (libswresample; media-audio.md),
    then through transformers: the front end, the stack and the projection are the same math."""
    paths = [write(tmp_path / f"clip{i}{SUFFIX[codec]}", _signal(s, rate, 10 + i), rate, codec) for i, (codec, rate, s) in enumerate(FILES)]
    decoded = [decode(source, RATE, RATE * SECONDS) for source in sources(paths, "recordings")]
    want = _audio_reference(clap, [r.samples[: r.kept] for r in decoded])
    with uform.Model.load_ram(clap["file"], quantization=Scalar.F32) as model:
        got = model.audio_encode(paths, Arena()).embeddings
    assert _cos(got, want).min() >= 0.99999
    assert ((got @ want.T).argmax(axis=1) == np.arange(len(paths))).all()


@pytest.mark.parametrize("quantization,bound,mean", [(Scalar.BF16, 0.9999, 0.9999), (Scalar.E4M3, 0.98, 0.995)])
def test_bf16_and_e4m3_stay_within_the_bounds_of_uforms_towers(clap: dict[str, Any], quantization: Scalar, bound: float, mean: float) -> None:
    recordings = [_signal(s, RATE, 20 + s)[0] for s in (3, 10)]
    with uform.Model.load_ram(clap["file"], quantization=Scalar.F32) as model:
        texts, audio = model.text_encode(TEXTS, Arena()).embeddings, model.audio_encode_samples(recordings, RATE, Arena()).embeddings
    with uform.Model.load_ram(clap["file"], quantization=quantization) as model:
        for got, want in ((model.text_encode(TEXTS, Arena()).embeddings, texts), (model.audio_encode_samples(recordings, RATE, Arena()).embeddings, audio)):
            cos = _cos(got, want)
            assert cos.min() >= bound and cos.mean() >= mean


def test_the_server_embeds_recordings_and_texts_as_the_model_does(clap: dict[str, Any], tmp_path: Path) -> None:
    import base64

    import httpx

    from serving import thread_server
    from uform.serve import ServeConfig

    wav = write(tmp_path / "rain.wav", _signal(4, 44100, 30), 44100, "pcm_s16le")
    with uform.Model.load_ram(clap["file"]) as model:
        want = np.concatenate([model.audio_encode([wav], Arena()).embeddings, model.text_encode(["rain on a roof"], Arena()).embeddings])
        parts = [{"type": "input_audio", "input_audio": {"data": base64.b64encode(wav.read_bytes()).decode(), "format": "wav"}}, {"type": "text", "text": "rain on a roof"}]
        with thread_server(model, ServeConfig(model_id="clap")) as (url, _):
            answer = httpx.post(url + "/v1/embeddings", json={"input": parts}, timeout=60)
    assert answer.status_code == 200, answer.text
    np.testing.assert_array_equal(np.array([d["embedding"] for d in answer.json()["data"]], np.float32), want)


def test_an_index_of_recordings_finds_them_by_text(clap: dict[str, Any], tmp_path: Path) -> None:
    from uform.index import Index

    folder = tmp_path / "sounds"
    folder.mkdir()
    paths = [write(folder / f"s{i}.flac", _signal(3 + i, 48000, 40 + i), 48000, "flac") for i in range(3)]
    with Index(tmp_path / "sounds.index", checkpoint=str(clap["file"])) as index:
        index.update([folder])
        hits = index.search("rain on a roof", k=3, modalities=["audio"])
    with uform.Model.load_ram(clap["file"]) as model:
        rows = model.audio_encode(paths, Arena()).embeddings
        query = model.text_encode(["rain on a roof"], Arena()).embeddings[0]
    order = [paths[i].name for i in np.argsort(-(rows @ query))]
    assert [Path(h.path).name for h in hits] == order


def test_export_writes_towers_that_run_as_the_model_does(clap: dict[str, Any], tmp_path: Path) -> None:
    import onnxruntime as ort
    import tokenizers

    from uform.cli import main

    out = tmp_path / "exported"
    assert main(["export", str(clap["file"]), str(out), "-q"]) == 0
    text = "the sound of rain on a tin roof"
    ids = tokenizers.Tokenizer.from_file(str(out / "text.tokenizer.json")).encode(text).ids
    recording = _signal(10, RATE, 50)[0]  # exactly the window: nothing to fill
    with uform.Model.load_ram(clap["file"], quantization=Scalar.F32) as model:
        want_text = model.text_encode([text], Arena()).embeddings
        want_audio = model.audio_encode_samples([recording], RATE, Arena()).embeddings
    got_text = ort.InferenceSession(str(out / "text.onnx")).run(None, {"bytes": np.array([ids], np.int64), "lengths": np.array([len(ids)], np.int64)})[0]
    got_audio = ort.InferenceSession(str(out / "audio.onnx")).run(None, {"samples": recording[None]})[0]
    assert _cos(got_text, want_text).min() >= 0.99999 and _cos(got_audio, want_audio).min() >= 0.99999


def test_label_probabilities_of_a_recording_equal_logits_per_audio(clap: dict[str, Any]) -> None:
    labels = ["rain on a roof", "a dog barks", "a car passes"]
    recordings = [_signal(s, RATE, 60 + s)[0] for s in (3, 10)]
    inputs = clap["tokenizer"](labels, padding=True, return_tensors="pt")
    features = clap["extractor"](recordings, sampling_rate=RATE, return_tensors="pt")
    with torch.no_grad():
        want = clap["model"](**inputs, **features).logits_per_audio.softmax(-1).numpy()
    with uform.Model.load_ram(clap["file"], quantization=Scalar.F32) as model:
        got = model.label_probabilities(model.audio_encode_samples(recordings, RATE, Arena()).embeddings, labels)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(
    "file,edit,message",
    [
        ("config.json", lambda c: c["audio_config"].update(enable_fusion=True), r"(?i)enable_fusion true"),
        ("config.json", lambda c: c.update(projection_hidden_act="gelu"), r"config\.json: projection_hidden_act 'gelu' is not supported; supported: 'relu'"),
        ("preprocessor_config.json", lambda c: c.update(truncation="fusion"), r"preprocessor_config\.json: truncation 'fusion' is not supported"),
    ],
)
def test_what_uform_cannot_run_is_refused_by_name_and_nothing_is_written(clap: dict[str, Any], tmp_path: Path, file: str, edit: Any, message: str) -> None:
    import json
    import shutil

    source = tmp_path / "source"
    shutil.copytree(clap["directory"], source, ignore=shutil.ignore_patterns("model.safetensors"))
    (source / "model.safetensors").symlink_to(clap["directory"] / "model.safetensors")
    cfg = json.loads((source / file).read_text())
    edit(cfg)
    (source / file).write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match=message):
        convert(source, tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


def _held_ids(path: Path, texts: list[str]) -> list[list[int]]:
    """The token ids the file's own tokenizer gives (what text_encode feeds), cut at its context."""
    from uform.core.checkpoint import map_file
    from uform.core.config import ModelConfig
    from uform.core.safetensors import header
    from uform.plugins.media.text import read

    mapped = map_file(path)
    metadata = header(len(mapped), lambda begin, end: mapped[begin:end])[0]
    config = ModelConfig.from_metadata(metadata)
    tower = config.towers["text"]
    held = read(config.extras, tower["context"], tower["vocab_size"], "towers.text")
    return [row.tolist() for row in held.encode(texts).ids]


@pytest.mark.parametrize("files", ["tokenizer.json", "vocab.json and merges.txt"])
def test_token_ids_equal_the_roberta_tokenizers(clap: dict[str, Any], tmp_path: Path, files: str) -> None:
    """The ids of every text, cut at 512 as truncation=True cuts, from a source with tokenizer.json
    or with the slow tokenizer's files alone (the file then holds transformers' fast tokenizer of them)."""
    if files == "tokenizer.json":
        directory, path = clap["directory"], clap["file"]
    else:
        directory, path = make_clap(tmp_path / "slow", tokenizer_json=False), tmp_path / "slow.safetensors"
        assert not (directory / "tokenizer.json").exists()
        convert(directory, path, dtype="f32")
    want = transformers.AutoTokenizer.from_pretrained(str(directory))(TEXTS, truncation=True).input_ids
    assert _held_ids(path, TEXTS) == want
    assert max(len(ids) for ids in want) == 512


def test_the_readmes_clap_commands_run_as_written(clap: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """README's CLAP block (convert laion/clap-htsat-unfused, search recordings by a caption,
    label one) runs as written, offline, on a Hugging Face cache holding the small CLAP under
    LAION's Hub id and a folder standing for ~/Recordings (a WAV, a FLAC, an MP3)."""
    import shlex
    import shutil

    from uform.cli import main

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("LAION's CLAP (`laion/clap-htsat-unfused`", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = block.strip().splitlines()
    assert [shlex.split(line)[:2] for line in lines] == [["uform", "convert"], ["uform", "search"], ["uform", "labels"]]
    repo = tmp_path / "hub" / "models--laion--clap-htsat-unfused"
    shutil.copytree(clap["directory"], repo / "snapshots" / ("1" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1" * 40)
    recordings = tmp_path / "Recordings"
    recordings.mkdir()
    write(recordings / "park.wav", _signal(3, 48000, 1), 48000, "pcm_s16le")
    write(recordings / "rain.flac", _signal(4, 44100, 2), 44100, "flac")
    write(recordings / "street.mp3", _signal(2, 16000, 3), 16000, "libmp3lame")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    for line in lines:
        assert main([a.replace("~", str(tmp_path)) for a in shlex.split(line)[1:]]) == 0, line
    out = capsys.readouterr().out
    assert "clap (ClapModel) from laion/clap-htsat-unfused" in out
    assert sorted(line.split()[-1].rsplit("/", 1)[-1] for line in out.splitlines() if line.strip()[:2] in ("1 ", "2 ", "3 ")) == ["park.wav", "rain.flac", "street.mp3"]
    assert "park.wav  (softmax)" in out and "birdsong" in out


def test_frames_for_a_clap_is_refused_by_name(clap: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--frames`` sets the video tower that a converted image tower gives; a CLAP has none, and
    ``uform convert CLAP OUT --frames 3`` wrote the file as if the flag were absent, saying
    nothing. Now it is refused, naming the value, the family and what to do; nothing is written,
    an earlier OUT stays. Left out, the conversion is as before."""
    from uform.cli import main

    out = tmp_path / "clap.safetensors"
    out.write_bytes(clap["file"].read_bytes())
    message = rf"^{re.escape(str(clap['directory']))}: frames 3 \(--frames\) sets what video_encode averages through the image tower, but clap \(ClapModel\) has no image tower, so no video tower; leave it out$"
    with pytest.raises(ConvertError, match=message):
        convert(clap["directory"], out, dtype="bf16", frames=3)
    assert out.read_bytes() == clap["file"].read_bytes() and list(tmp_path.iterdir()) == [out]
    assert main(["convert", str(clap["directory"]), str(tmp_path / "b.safetensors"), "--frames", "8"]) == 2
    assert "frames 8 (--frames)" in capsys.readouterr().err and not (tmp_path / "b.safetensors").exists()
    assert main(["convert", str(clap["directory"]), str(tmp_path / "c.safetensors"), "--dtype", "f32"]) == 0
    assert (tmp_path / "c.safetensors").read_bytes() == clap["file"].read_bytes()


def test_uform_labels_names_clap_and_takes_labels_differing_in_case(clap: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``uform labels`` said it needs 'a converted CLIP or SigLIP' (its help line and the error of a
    model without labels), though a converted CLAP labels recordings. Both now name CLAP and
    Chinese-CLIP. And as docs/cli.md says, CLAP's RoBERTa tokenizer keeps the case: 'A dog' and
    'a dog' are two labels to it (CLIP's refusal of the pair does not apply), each printed."""
    from uform.cli import main

    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at the terminal's width: one line a command
    assert main(["--help"]) == 0
    help_line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("labels"))
    assert help_line.rstrip().endswith("(a converted CLIP, SigLIP, Chinese-CLIP or CLAP)"), help_line
    assert main(["labels", str(tmp_path), "--labels", "a,b"]) == 2
    assert "zero-shot labels need a converted CLIP, SigLIP, Chinese-CLIP or CLAP (uform convert, docs/models.md)" in capsys.readouterr().err
    wav = write(tmp_path / "park.wav", _signal(2, 48000, 5), 48000, "pcm_s16le")
    assert main(["labels", str(wav), "--labels", "A dog,a dog", "-m", str(clap["file"])]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{wav}  (softmax)" and sorted(line.split(None, 1)[1] for line in out[1:]) == ["A dog", "a dog"]


def test_an_m4a_recording_is_read_by_the_commands(clap: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An M4A (AAC in MP4: a phone's voice memo, a music library's file) was 'unknown file type
    '.m4a'' to ``uform encode``, ``search``, ``labels`` and ``index``, and passed over in a folder
    ('files of unknown type'), though ``audio_encode`` reads it and ``uform serve`` takes
    ``input_audio`` of format ``m4a``. It is now an audio extension: a folder's M4A is encoded,
    its row ``audio_encode``'s of the file, and found by ``uform search``."""
    from uform.cli import main

    folder = tmp_path / "memos"
    folder.mkdir()
    memo = write(folder / "memo.m4a", _signal(3, 44100, 7), 44100, "aac", "mp4")
    write(folder / "park.wav", _signal(2, 48000, 8), 48000, "pcm_s16le")
    assert main(["encode", str(folder), "-o", str(tmp_path / "rows"), "-m", str(clap["file"]), "--quantization", "f32"]) == 0
    err = capsys.readouterr().err
    assert "passed over" not in err and "failed" not in err, err
    rows = np.load(tmp_path / "rows.npy")
    records = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [(r["modality"], Path(r["path"]).name) for r in records] == [("audio", "memo.m4a"), ("audio", "park.wav")]
    model = uform.Model.load_ram(clap["file"], quantization=Scalar.F32)
    np.testing.assert_array_equal(rows[0], model.audio_encode([memo], Arena()).embeddings[0])
    assert main(["search", "a dog barking", str(memo), "-m", str(clap["file"])]) == 0
    assert capsys.readouterr().out.split()[-1] == str(memo)


def test_a_fusion_truncation_on_an_unfused_clap_says_what_to_set(clap: dict[str, Any], tmp_path: Path) -> None:
    """An unfused CLAP saved beside ``ClapFeatureExtractor()`` (whose default truncation is
    'fusion', four mel channels that transformers' own get_audio_features of this model fails on)
    was refused with the reason alone. The refusal now says what to set, and the source converts
    once it is set: to the file the test's rand_trunc source gives."""
    import shutil

    source = tmp_path / "unfused"
    shutil.copytree(clap["directory"], source)
    transformers.ClapFeatureExtractor().save_pretrained(source)  # the default: truncation 'fusion'
    settings = source / "preprocessor_config.json"
    with pytest.raises(ConvertError, match=r"ClapFeatureExtractor\(\) saves 'fusion' by default: set truncation to 'rand_trunc' in the file, as laion/clap-htsat-unfused's is$"):
        convert(source, tmp_path / "a.safetensors", dtype="f32", name=clap["directory"].name)
    assert not (tmp_path / "a.safetensors").exists()
    settings.write_text(settings.read_text().replace('"truncation": "fusion"', '"truncation": "rand_trunc"'))
    convert(source, tmp_path / "a.safetensors", dtype="f32", name=clap["directory"].name)
    assert (tmp_path / "a.safetensors").read_bytes() == clap["file"].read_bytes()
