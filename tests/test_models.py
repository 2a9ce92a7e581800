"""A converted CLIP and SigLIP (small geometries, random weights, the real CLIP BPE vocabulary,
a SigLIP SentencePiece model; converted once per module) run by uform: embeddings against
transformers' ``get_text_features`` / ``get_image_features`` through each family's own
tokenizer, token ids, BF16 and E4M3 loads, zero-shot labels, and what uform does with any
checkpoint (load_ram_buffer, describe, search, index, serve, Ray, export)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uform
from uform import Arena, Scalar

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")

import hf_models  # noqa: E402

from uform.cli import main  # noqa: E402
from uform.convert import convert  # noqa: E402

# What BF16 and E4M3 loads keep on these random towers (measured least cosines, CLIP / SigLIP: BF16
# 0.99998 / 0.99993, E4M3 0.9988 / 0.9963 over the corpus and 6 pictures; uform keeps 0.999 / 0.99 for its own).
BOUND = {Scalar.F32: 0.99999, Scalar.BF16: 0.9995, Scalar.E4M3: 0.99}


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = hf_models.make_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")
    out = d.parent / "clip.safetensors"
    convert(d, out, dtype="f32")
    return d, out


@pytest.fixture(scope="module")
def siglip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = hf_models.make_siglip(tmp_path_factory.mktemp("siglip") / "tiny-siglip")
    out = d.parent / "siglip.safetensors"
    convert(d, out, dtype="f32")
    return d, out


def unit(x: Any) -> np.ndarray:
    a = np.asarray(x, np.float64)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def pictures(count: int, size: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (count, 4, 4, 3)).astype(np.float32)
    smooth = np.repeat(np.repeat(base, size // 4, axis=1), size // 4, axis=2)
    return np.clip(smooth + rng.normal(0, 30, smooth.shape), 0, 255).astype(np.uint8)


def reference(
    family: str, directory: Path, texts: list[str], pixels: np.ndarray, mean: list[float], std: list[float], tokenizer: Any = None
) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """transformers' text and image features (float32) and the family tokenizer's ids
    (``tokenizer``'s where given, else AutoTokenizer's)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(directory).eval()
    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(directory)
    tok.padding_side = "right"  # as SigLIP was trained (a Gemma tokenizer defaults to the left: docs/models.md)
    context = model.config.text_config.max_position_embeddings
    padding: Any = "max_length" if family == "siglip" else True
    enc = tok(texts, padding=padding, truncation=True, max_length=context, return_tensors="pt")
    x = (pixels.astype(np.float32) / 255 - np.float32(mean)) / np.float32(std)
    with torch.no_grad():
        kwargs = {"input_ids": enc["input_ids"]} if family == "siglip" else dict(enc)
        text = model.get_text_features(**kwargs).pooler_output.numpy()
        image = model.get_image_features(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).pooler_output.numpy()
    ids = tok(texts, truncation=True, max_length=context)["input_ids"]
    return text, image, ids


@pytest.fixture(scope="module")
def clip_reference(clip: tuple[Path, Path]) -> tuple[np.ndarray, np.ndarray, list[list[int]], np.ndarray]:
    px = pictures(6, 32)
    return (*reference("clip", clip[0], hf_models.CORPUS, px, hf_models.CLIP_MEAN, hf_models.CLIP_STD), px)


@pytest.fixture(scope="module")
def siglip_reference(siglip: tuple[Path, Path]) -> tuple[np.ndarray, np.ndarray, list[list[int]], np.ndarray]:
    px = pictures(6, 32, seed=1)
    return (*reference("siglip", siglip[0], hf_models.CORPUS, px, [0.5] * 3, [0.5] * 3), px)


def cosines(got: Any, want: np.ndarray) -> np.ndarray:
    """Each row's cosine with its reference; each row is nearest its own reference among all
    (or one equal to it: "" and " " are the same tokens)."""
    g, w = unit(got), unit(want)
    nearest = np.argmax(g @ w.T, axis=1)
    assert np.allclose(w[nearest], w, atol=1e-6)
    return (g * w).sum(1)


@pytest.mark.parametrize("quantization", [Scalar.F32, Scalar.BF16, Scalar.E4M3])
def test_clip_embeddings_equal_transformers(clip: tuple[Path, Path], clip_reference: Any, quantization: Scalar) -> None:
    text, image, _, px = clip_reference
    with uform.Model.load_ram(clip[1], quantization=quantization) as m:
        t = m.text_encode(hf_models.CORPUS, Arena()).embeddings
        assert cosines(t, text).min() >= BOUND[quantization]
        i = m.image_encode_pixels(list(px), Arena()).embeddings
        assert cosines(i, image).min() >= BOUND[quantization]
        if quantization == Scalar.F32:
            assert m.backend == "cpu"


@pytest.mark.parametrize("quantization", [Scalar.F32, Scalar.BF16, Scalar.E4M3])
def test_siglip_embeddings_equal_transformers(siglip: tuple[Path, Path], siglip_reference: Any, quantization: Scalar) -> None:
    text, image, _, px = siglip_reference
    with uform.Model.load_ram(siglip[1], quantization=quantization) as m:
        assert cosines(m.text_encode(hf_models.CORPUS, Arena()).embeddings, text).min() >= BOUND[quantization]
        assert cosines(m.image_encode_pixels(list(px), Arena()).embeddings, image).min() >= BOUND[quantization]


def test_bf16_stored_file_loads_within_the_bf16_bound(clip: tuple[Path, Path], clip_reference: Any, tmp_path: Path) -> None:
    out = tmp_path / "bf16.safetensors"
    convert(clip[0], out)  # the default: BF16 weights, half the file
    text, image, _, px = clip_reference
    with uform.Model.load_ram(out, quantization=Scalar.F32) as m:
        assert cosines(m.text_encode(hf_models.CORPUS, Arena()).embeddings, text).min() >= BOUND[Scalar.BF16]
        assert cosines(m.image_encode_pixels(list(px), Arena()).embeddings, image).min() >= BOUND[Scalar.BF16]


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_token_ids_equal_the_family_tokenizer(family: str, request: pytest.FixtureRequest) -> None:
    """The held tokenizer (as text_encode runs it) gives the Hugging Face tokenizer's ids,
    truncated at the context, over punctuation, Unicode, emoji, whitespace runs and long texts,
    and each text's length before truncation (counted from the pieces truncation cut, across
    many pieces too); text_encode's stats count tokens and truncation in those ids."""
    from transformers import AutoTokenizer

    from uform.core.safetensors import parse
    from uform.plugins.media.text import read

    directory, path = request.getfixturevalue(family)
    _, _, ids, _ = request.getfixturevalue(f"{family}_reference")
    container = parse(memoryview(path.read_bytes()))
    cfg = json.loads(container.metadata["uform"])["towers"]["text"]
    tokenizer = read(container.metadata, cfg["context"], cfg["vocab_size"], "towers.text")
    held = tokenizer.encode(hf_models.CORPUS)
    assert [list(map(int, row)) for row in held.ids] == ids
    texts = hf_models.CORPUS + [text * 37 for text in hf_models.CORPUS[:12]] + ["word " * 3000, "日本" * 900]
    whole = AutoTokenizer.from_pretrained(directory)(texts, truncation=False)["input_ids"]
    assert tokenizer.encode(texts).full.tolist() == [len(row) for row in whole]
    stats = uform.TextEncodeStats()
    with uform.Model.load_ram(path, quantization=Scalar.F32) as m:
        m.text_encode(hf_models.CORPUS, Arena(), stats=stats)
    assert stats.tokens == sum(len(r) for r in ids) and stats.truncated_items == sum(int(n > cfg["context"]) for n in held.full)
    assert stats.truncated_items >= 1


def test_clip_labels_are_softmax_over_scaled_cosines(clip: tuple[Path, Path], tmp_path: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    labels = ["a photo of a cat", "a photo of a dog", "a diagram"]
    px = pictures(2, 32, seed=5)
    with uform.Model.load_ram(clip[1], quantization=Scalar.F32) as m:
        assert m.labels == {"kind": "softmax", "scale": pytest.approx(np.exp(4.0)), "bias": 0.0}
        got = m.label_probabilities(m.image_encode_pixels(list(px), Arena()).embeddings, labels)
    model = AutoModel.from_pretrained(clip[0]).eval()
    enc = AutoTokenizer.from_pretrained(clip[0])(labels, padding=True, return_tensors="pt")
    x = (px.astype(np.float32) / 255 - np.float32(hf_models.CLIP_MEAN)) / np.float32(hf_models.CLIP_STD)
    with torch.no_grad():
        out = model(**enc, pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2).contiguous())
    want = out.logits_per_image.softmax(dim=1).numpy()
    assert got.shape == (2, 3) and np.allclose(got.sum(1), 1, atol=1e-6)
    np.testing.assert_allclose(got, want, atol=2e-4)
    with uform.Model.load_ram(clip[1], quantization=Scalar.F32) as m:  # a set's order is its own: no column would be sure
        with pytest.raises(TypeError, match="labels must be a sequence, got a set, whose order is its own"):
            m.label_probabilities(np.eye(1, m.describe().dimensions, dtype=np.float32), set(labels))  # type: ignore[arg-type]


def test_siglip_labels_are_sigmoids_with_the_bias(siglip: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    from PIL import Image
    from transformers import AutoModel, AutoTokenizer

    labels = ["a photo of a cat", "two dogs"]
    px = pictures(1, 32, seed=6)
    path = tmp_path / "p.png"
    Image.fromarray(px[0]).save(path)
    with uform.Model.load_ram(siglip[1], quantization=Scalar.F32) as m:
        got = m.image_labels([str(path)], labels)
    model = AutoModel.from_pretrained(siglip[0]).eval()
    enc = AutoTokenizer.from_pretrained(siglip[0])(labels, padding="max_length", max_length=16, return_tensors="pt")
    x = (px.astype(np.float32) / 255 - 0.5) / 0.5
    with torch.no_grad():
        out = model(input_ids=enc["input_ids"], pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2).contiguous())
    np.testing.assert_allclose(got, torch.sigmoid(out.logits_per_image).numpy(), atol=2e-4)
    assert main(["labels", str(path), "--labels", ",".join(labels), "-m", str(siglip[1]), "--quantization", "f32", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["modality"] == "image" and row["labels"] == {t: pytest.approx(float(p), abs=1e-5) for t, p in zip(labels, got[0])}


def test_label_probabilities_at_the_config_bounds_are_exact_limits_without_warnings() -> None:
    """A file's labels may hold a scale up to 1e6 and a bias of ±1e6: the softmax and the sigmoids
    stay finite there, at their limits, and say nothing (no overflow warning)."""
    import warnings

    from uform.core.labels import probabilities

    items = np.array([[1.0, 0.0], [0.0, 1.0]])
    texts = np.array([[1.0, 0.0], [0.6, 0.8], [-1.0, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        soft = probabilities({"kind": "softmax", "scale": 1e6}, items, texts)
        sig = probabilities({"kind": "sigmoid", "scale": 1e6, "bias": -1e6}, items, texts)
    np.testing.assert_array_equal(soft, [[1, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(sig, [[0.5, 0, 0], [0, 0, 0]])  # 1e6 * 1 - 1e6 = 0; 1e6 * 0.8 - 1e6 < -709: exp past float64
    assert probabilities({"kind": "sigmoid", "scale": 10.0, "bias": -5.0}, items, texts)[0, 0] == np.float32(1 / (1 + np.exp(-5.0)))


def test_labels_refused_without_labels(tiny_model: uform.Model, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(uform.UnsupportedError, match="this model has no labels"):
        tiny_model.label_probabilities(np.zeros((1, tiny_model.describe().dimensions), np.float32), ["a"])
    assert main(["labels", str(tmp_path), "--labels", "a,b"]) == 2
    assert "has no labels" in capsys.readouterr().err
    assert main(["labels", str(tmp_path), "--labels", "a,b, a", "--label", "b"]) == 2
    assert "label texts given more than once: 'a', 'b'" in capsys.readouterr().err
    assert main(["labels", str(tmp_path), "--labels", "a", "--label", "  "]) == 2
    assert "--label: a label text is empty (or only spaces)" in capsys.readouterr().err


def test_labels_the_model_reads_as_one_text_are_refused_by_name(
    clip: tuple[Path, Path], siglip: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both families lower-case a text: 'A cat' beside 'a cat' is a copy, whose softmax split the
    cat's probability in two (0.367, 0.367 against 0.266 for a dog) where it was refused only
    spelled alike; a label that is not UTF-8 is named, before any media is encoded."""
    from PIL import Image

    path = tmp_path / "p.png"
    Image.fromarray(pictures(1, 32, seed=7)[0]).save(path)
    for model in (clip[1], siglip[1]):
        assert main(["labels", str(path), "--labels", "A cat,a dog", "--label", "a cat", "-m", str(model)]) == 2
        assert capsys.readouterr().err == "uform: error: label texts 'A cat' and 'a cat' are the same text to this model (the same tokens); give one of them\n"
    assert main(["labels", str(path), "--labels", "a cat,a dog", "--label", "caf\udce9", "-m", str(clip[1])]) == 2
    assert capsys.readouterr().err == "uform: error: label 'caf\\xe9' is not valid UTF-8 (a command-line argument in another encoding)\n"
    with uform.Model.load_ram(clip[1]) as m:
        with pytest.raises(ValueError, match=r"^labels\[1\]: text is not encodable as UTF-8 \(surrogates not allowed at 3\)$"):
            m.image_labels([str(path)], ["a dog", "caf\udce9"])


def test_labels_names_print_as_names_do_with_their_bytes_in_json(
    clip: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file name that is not UTF-8, or holds a line break, prints escaped ("Names printed"), with
    its exact bytes as path_hex in --json (valid UTF-8 JSON); a label's line break prints as \\n."""
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    os_name = b"odd/r\xffd.png".decode("utf-8", "surrogateescape")
    Path("odd").mkdir()
    Image.fromarray(pictures(1, 32, seed=8)[0]).save("odd/a.png")
    for name in (os_name, "odd/two\nlines.png"):
        Path(name).write_bytes(Path("odd/a.png").read_bytes())
    model = ["-m", str(clip[1]), "--quantization", "f32"]
    assert main(["labels", "odd", "--labels", "a cat,a dog", "--json", *model]) == 0
    rows = json.loads(capsys.readouterr().out.encode("utf-8"))
    assert [(r["path"], r.get("path_hex")) for r in rows] == [
        ("odd/a.png", None), ("odd/r\\xffd.png", "6f64642f72ff642e706e67"), ("odd/two\\nlines.png", "6f64642f74776f0a6c696e65732e706e67")
    ]  # fmt: skip
    assert rows[0]["labels"] == rows[1]["labels"] == rows[2]["labels"]
    assert main(["labels", "odd/a.png", "--label", "a cat", "--label", "two\nlines", "-k", "0", *model]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "odd/a.png  (softmax)" and sorted(line.split("  ")[-1] for line in out[1:]) == ["a cat", "two\\nlines"]


def test_load_ram_buffer_describe_and_what_a_family_cannot_do(clip: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    data = clip[1].read_bytes()
    with uform.Model.load_ram(clip[1]) as a, uform.Model.load_ram_buffer(data) as b:
        texts = ["a cat", "a dog"]
        assert np.array_equal(a.text_encode(texts, Arena()).embeddings, b.text_encode(texts, Arena()).embeddings)
        assert b.source == {"family": "clip", "name": "tiny-clip", "architecture": "CLIPModel", "converter": a.source["converter"]}  # type: ignore[index]
        d = a.describe()
        assert (d.dimensions, d.context, d.token_width, d.choice_temperature_groups) == (48, 77, 0, 0)
        with pytest.raises(uform.UnsupportedError):
            a.text_choose(["is it? "], "yn", Arena())
        with pytest.raises((uform.UnsupportedError, ValueError)):
            a.text_encode(texts, Arena(), outputs=uform.Outputs.TOKENS)
        with pytest.raises(uform.UnsupportedError, match="audio"):
            a.audio_encode_samples([np.zeros(1600, np.float32)], 16000, Arena())
        from media import clip as make_clip

        video = np.asarray(a.video_encode([make_clip(frames=10, size=(48, 40))], Arena()).embeddings)
        assert video.shape == (1, 48) and abs(float(np.linalg.norm(video)) - 1) < 1e-5
    assert main(["describe", "-m", str(clip[1]), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["dimensions"] == 48 and "image" in info["modalities"] and "video" in info["modalities"]
    for suite in ("own", "foreign"):  # refused before any work (it failed at the recordings, after the pictures and clips)
        assert main(["evaluate", "-m", str(clip[1]), "--suite", suite]) == 2
        assert capsys.readouterr().err == (
            "uform: error: the evaluation measures text_encode, image_encode, video_encode, audio_encode, text_choose; this model "
            "lacks audio_encode, text_choose (it has the towers image, text, video): it is for models trained by uform's recipe\n"
        )


def test_search_index_and_search_index_on_a_folder(clip: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "photos"
    folder.mkdir()
    for i, p in enumerate(pictures(4, 64, seed=9)):
        Image.fromarray(p).save(folder / f"p{i}.{'png' if i % 2 else 'jpg'}")
    model = ["-m", str(clip[1]), "--quantization", "f32"]
    assert main(["search", "a photo of a cat", str(folder), "--json", *model]) == 0
    ranked = json.loads(capsys.readouterr().out)
    with uform.Model.load_ram(clip[1], quantization=Scalar.F32) as m:
        q = np.array(m.text_encode(["a photo of a cat"], Arena()).embeddings[0])
        e = np.array(m.image_encode([str(folder / r["path"].rsplit("/", 1)[1]) for r in ranked], Arena()).embeddings)
    assert [r["score"] for r in ranked] == pytest.approx(list(e @ q), abs=1e-5) and len(ranked) == 4
    assert main(["index", "photos", "--into", "idx", *model]) == 0
    capsys.readouterr()
    assert main(["search", "a photo of a cat", "--index", "idx", "--json", *model]) == 0
    indexed = json.loads(capsys.readouterr().out)
    assert [r["path"].rsplit("/", 1)[1] for r in indexed] == [r["path"].rsplit("/", 1)[1] for r in ranked]


def test_recordings_in_the_folders_are_passed_over_not_failed(clip: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A CLIP has no audio tower: the music beside the photos was a failure per file (exit 1,
    and every index run listed each again); now one line, exit 0, and a recording named on the
    command line still fails with the verb's reason."""
    import wave

    from PIL import Image

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "home"
    folder.mkdir()
    for i, p in enumerate(pictures(2, 64, seed=3)):
        Image.fromarray(p).save(folder / f"p{i}.png")
    for name in ("a.wav", "b.wav"):
        with wave.open(str(folder / name), "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(np.zeros(1600, np.int16).tobytes())
    model = ["-m", str(clip[1]), "--quantization", "f32"]
    line = "uform: passed over 2 recordings in the folders: the model has no audio tower\n"
    assert main(["search", "a cat", "home", "--json", *model]) == 0
    out = capsys.readouterr()
    assert out.err == line and sorted(r["path"] for r in json.loads(out.out)) == ["home/p0.png", "home/p1.png"]
    assert main(["labels", "home", "--labels", "a cat,a dog", "--json", *model]) == 0
    out = capsys.readouterr()
    assert out.err == line and len(json.loads(out.out)) == 2
    assert main(["encode", "home", "--out", "enc", *model]) == 0
    assert "passed over 2 recordings in the folders: the model has no audio tower (listed in enc.json)" in capsys.readouterr().out
    assert {"path": "home/a.wav", "reason": "the model has no audio tower"} in json.loads(Path("enc.json").read_text())["skipped"]
    for _ in range(2):  # the second run reads the recorded pass-over: no line per file, no failure
        assert main(["index", "home", "--into", "idx", *model]) == 0
        out = capsys.readouterr()
        assert out.err == line and "0 failed, 0 failed before" in out.out
    assert main(["search", "a cat", "home", "--modalities", "audio", *model]) == 2
    assert capsys.readouterr().err == "uform: error: nothing to search: passed over 2 recordings in the folders: the model has no audio tower\n"
    assert main(["search", "a cat", "home/a.wav", "home/p0.png", *model]) == 1  # named: the verb's reason, as before
    assert "failed: file home/a.wav: audio_encode needs the 'audio' tower" in capsys.readouterr().err


def test_serve_names_the_model_and_ray_encodes_it(clip: tuple[Path, Path]) -> None:
    pytest.importorskip("uvicorn")
    import httpx
    from serving import thread_server

    from uform.ray import Encoder
    from uform.serve.config import ServeConfig

    with uform.Model.load_ram(clip[1]) as m:
        with thread_server(m, ServeConfig(model_id="tiny-clip")) as (url, _):
            card = httpx.get(url + "/v1/models").json()["data"][0]
            assert card["id"] == "tiny-clip" and card["dimensions"] == 48 and "image" in card["modalities"]
            assert card["source"]["family"] == "clip" and card["source"]["name"] == "tiny-clip"
            got = httpx.post(url + "/v1/embeddings", json={"input": ["a cat", "naïve café 🐱"], "model": "tiny-clip"}).json()
        want = np.array(m.text_encode(["a cat", "naïve café 🐱"], Arena()).embeddings)
        assert np.allclose([row["embedding"] for row in got["data"]], want, atol=1e-6)
        enc = Encoder(str(clip[1]), "text", "caption", threads=1)
        try:
            out = enc({"caption": np.array(["a cat", "naïve café 🐱"], dtype=object)})
            assert np.array_equal(out["embedding"], want)
        finally:
            enc.close()


def test_exported_towers_run_in_onnx_runtime(clip: tuple[Path, Path], siglip: tuple[Path, Path], tmp_path: Path) -> None:
    import onnxruntime as ort

    from uform.exporters.towers import export_towers

    for path, family in ((clip[1], "clip"), (siglip[1], "siglip")):
        written = export_towers(path, tmp_path / family, "f32")
        with uform.Model.load_ram(path, quantization=Scalar.F32) as m:
            px = pictures(2, 32, seed=7)
            session = ort.InferenceSession(str(written["image"]), providers=["CPUExecutionProvider"])
            (got,) = session.run(["embeddings"], {"pixels": px})
            assert (unit(got) * unit(m.image_encode_pixels(list(px), Arena()).embeddings)).sum(1).min() >= 0.99999


def test_open_clip_checkpoint_equals_open_clip(tmp_path: Path) -> None:
    """open_clip's own files (open_clip_config.json + open_clip_pytorch_model.bin, no
    tokenizer.json): the converted file gives open_clip's encode_text / encode_image. The
    tokenizer is OpenAI's CLIP BPE as transformers runs it, after open_clip's cleaning (ftfy,
    HTML entities: towers.text.clean), so every corpus text agrees, the fullwidth colon
    ftfy rewrites included (tests/test_converted_open_clip.py holds the texts cleaning changes)."""
    pytest.importorskip("open_clip")
    import open_clip
    import torch

    directory, model = hf_models.make_open_clip(tmp_path / "oc")
    out = tmp_path / "oc.safetensors"
    done = convert(directory, out, dtype="f32")
    assert (done.family, done.architecture) == ("open_clip", "open_clip ViT (width 64, patch 8, 2 layers)")
    ids = open_clip.get_tokenizer("ViT-B-32")(hf_models.CORPUS)
    px = pictures(4, 32, seed=8)
    x = (px.astype(np.float32) / 255 - np.float32(hf_models.CLIP_MEAN)) / np.float32(hf_models.CLIP_STD)
    with torch.no_grad():
        text = model.encode_text(ids).numpy()
        image = model.encode_image(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).numpy()
    with uform.Model.load_ram(out, quantization=Scalar.F32) as m:
        got = np.asarray(m.text_encode(hf_models.CORPUS, Arena()).embeddings)
        assert cosines(m.image_encode_pixels(list(px), Arena()).embeddings, image).min() >= 0.99999
    agree = (unit(got) * unit(text)).sum(1) >= 0.99999
    assert [t for t, ok in zip(hf_models.CORPUS, agree) if not ok] == []


def test_the_readme_converts_a_clip_from_the_cache_and_searches_a_folder(clip: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """README's "Real models" commands run as written, offline, on a Hugging Face cache holding
    a small CLIP under OpenAI's Hub id, and on a folder standing for ~/Pictures."""
    import shlex
    import shutil

    from PIL import Image

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("## Real models: CLIP, SigLIP, Chinese-CLIP and CLAP", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.removeprefix("pip install -e '.[convert]' && ") for line in block.strip().splitlines()]
    assert [shlex.split(line)[:2] for line in lines] == [["uform", "convert"], ["uform", "search"], ["uform", "labels"]]
    repo = tmp_path / "hub" / "models--openai--clip-vit-base-patch32"
    shutil.copytree(clip[0], repo / "snapshots" / ("1" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1" * 40)
    pictures_dir = tmp_path / "Pictures"
    pictures_dir.mkdir()
    for i, p in enumerate(pictures(3, 48, seed=4)):
        Image.fromarray(p).save(pictures_dir / ("dog.jpg" if i == 0 else f"p{i}.png"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for line in lines:
        args = [a.replace("~", str(tmp_path)) for a in shlex.split(line)[1:]]
        assert main(args) == 0, line
    out = capsys.readouterr().out
    assert "from openai/clip-vit-base-patch32" in out and "(softmax)" in out and "a dog" in out
    assert len([line for line in out.splitlines() if line.strip().startswith(("1 ", "2 ", "3 "))]) == 3


def test_siglip2_with_a_gemma_tokenizer_json(tmp_path: Path) -> None:
    """SigLIP 2 at a fixed resolution: model_type "siglip" with a Gemma tokenizer.json (lower-cased
    first, as SigLIP 2 was trained; the family recorded as siglip2): ids equal transformers'
    Siglip2Tokenizer's, embeddings transformers'."""
    from transformers import Siglip2Tokenizer

    d = hf_models.make_siglip(tmp_path / "tiny-siglip2", gemma=True)
    out = tmp_path / "siglip2.safetensors"
    assert convert(d, out, dtype="f32").family == "siglip2"
    px = pictures(3, 32, seed=2)
    siglip2 = Siglip2Tokenizer.from_pretrained(d)
    text, image, ids = reference("siglip", d, hf_models.CORPUS, px, [0.5] * 3, [0.5] * 3, siglip2)
    from uform.core.safetensors import parse
    from uform.plugins.media.text import read

    container = parse(memoryview(out.read_bytes()))
    cfg = json.loads(container.metadata["uform"])["towers"]["text"]
    assert cfg["pad_id"] == 0
    tokenizer = read(container.metadata, cfg["context"], cfg["vocab_size"], "towers.text")
    held = tokenizer.encode(hf_models.CORPUS)
    assert [list(map(int, row)) for row in held.ids] == ids
    texts = hf_models.CORPUS + ["word " * 300, "日本" * 90]  # lengths before the cut, counted from its pieces (no special tokens here)
    full = tokenizer.encode(texts).full
    assert full is not None and full.tolist() == [len(row) for row in siglip2(texts, truncation=False)["input_ids"]]
    with uform.Model.load_ram(out, quantization=Scalar.F32) as m:
        assert cosines(m.text_encode(hf_models.CORPUS, Arena()).embeddings, text).min() >= 0.99999
        assert cosines(m.image_encode_pixels(list(px), Arena()).embeddings, image).min() >= 0.99999


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_preprocessing_equals_the_family_image_processor(family: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A converted file's preprocessing (its resize, rounding, crop and filter fields) on photos of
    8 aspect ratios: equal to transformers' PIL image processor, level for level, and within one
    level of what AutoImageProcessor.from_pretrained(dir) gives (transformers 5: torchvision's)."""
    import transformers
    from media import pattern
    from PIL import Image
    from transformers import AutoImageProcessor

    from uform.core.safetensors import parse
    from uform.plugins.media.frames import Pixels
    from uform.plugins.media.image import decode
    from uform.plugins.media.files import sources

    directory, path = request.getfixturevalue(family)
    cfg = json.loads(parse(memoryview(path.read_bytes())).metadata["uform"])["towers"]["image"]
    fit = Pixels.read(cfg, "image").fit
    pil = (transformers.CLIPImageProcessorPil if family == "clip" else transformers.SiglipImageProcessorPil).from_pretrained(directory)
    default = AutoImageProcessor.from_pretrained(directory)
    worst = {"pil": 0.0, "default": 0.0}
    for w, h in [(640, 480), (480, 640), (1024, 768), (1920, 1080), (500, 500), (1200, 300), (300, 1200), (45, 61)]:
        photo = Image.fromarray(pattern(h, w, seed=w + h))
        data = tmp_path / f"{w}x{h}.png"
        photo.save(data)
        ours = decode(sources([data.read_bytes()], "bytes")[0], fit)[0].astype(np.float64)
        for name, processor in (("pil", pil), ("default", default)):
            x = processor(images=[photo], return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
            theirs = (x * np.array(processor.image_std) + np.array(processor.image_mean)) * 255
            worst[name] = max(worst[name], float(np.abs(ours - theirs).max()))
    assert worst["pil"] < 0.01 and worst["default"] <= 1.01, worst


def test_a_laion_style_clip_with_exact_gelu_and_patch_14(tmp_path: Path) -> None:
    """LAION's CLIPs (ViT-H/14, ViT-bigG/14) use exact GELU and 14-pixel patches: any geometry the
    config expresses converts, and gives transformers' embeddings on the float32 path."""
    geometry = {**hf_models.CLIP_SMALL, "vision": {**hf_models.CLIP_SMALL["vision"], "image_size": 28, "patch_size": 14}}
    d = hf_models.make_clip(tmp_path / "laion-style", geometry, seed=3, act="gelu")
    out = tmp_path / "laion.safetensors"
    convert(d, out, dtype="f32")
    px = pictures(3, 28, seed=3)
    text, image, _ = reference("clip", d, hf_models.CORPUS, px, hf_models.CLIP_MEAN, hf_models.CLIP_STD)
    with uform.Model.load_ram(out, quantization=Scalar.F32) as m:
        assert cosines(m.text_encode(hf_models.CORPUS, Arena()).embeddings, text).min() >= 0.99999
        assert cosines(m.image_encode_pixels(list(px), Arena()).embeddings, image).min() >= 0.99999
    with uform.Model.load_ram(out, quantization=Scalar.E4M3) as m:
        assert cosines(m.image_encode_pixels(list(px), Arena()).embeddings, image).min() >= BOUND[Scalar.E4M3]
