"""The uform command, in-process through ``uform.cli.main``: every command, the encode output
read back against the API, bad files reported and passed over, errors as one line with exit
status 2, and the model defaulting to the shipped checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import media
import media_audio
import uform
from ckpt import make_checkpoint
from uform.cli import main
from uform.cli.encode import read_saved


def picture(rgb: tuple[int, int, int], size: int = 40) -> np.ndarray:
    return np.full((size, size, 3), rgb, np.uint8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Media in nested folders: 3 images, 2 clips, 2 recordings, and a file of no media type."""
    root = tmp_path_factory.mktemp("media")
    (root / "pictures" / "deeper").mkdir(parents=True)
    (root / "clips").mkdir()
    (root / "sounds").mkdir()
    Image.fromarray(picture((220, 20, 20))).save(root / "pictures" / "red.png")
    Image.fromarray(picture((20, 20, 220))).save(root / "pictures" / "blue.jpg")
    Image.fromarray(picture((20, 200, 20))).save(root / "pictures" / "deeper" / "green.webp")
    (root / "clips" / "grey.mp4").write_bytes(media.clip(frames=8))
    (root / "clips" / "grey.webm").write_bytes(media.clip("libvpx", "webm", frames=8))
    media_audio.write(root / "sounds" / "a440.wav", media_audio.tone(1.2, 16000), 16000, "pcm_s16le")
    media_audio.write(root / "sounds" / "chord.flac", media_audio.tone(1.2, 16000, (330.0, 440.0)), 16000, "flac")
    (root / "notes.txt").write_text("not media")
    return root


MEDIA = ["clips/grey.mp4", "clips/grey.webm", "pictures/blue.jpg", "pictures/deeper/green.webp", "pictures/red.png",
         "sounds/a440.wav", "sounds/chord.flac"]  # fmt: skip


def embed(model: uform.Model, verb: str, values: list[str], **kwargs: object) -> np.ndarray:
    return np.array(getattr(model, verb)(values, uform.Arena(), **kwargs).embeddings)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"uform {uform.__version__}"


def test_new_then_similarity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.safetensors"
    assert main(["new", str(out), "--preset", "tiny", "--seed", "3", "--modalities", "text"]) == 0
    assert "preset tiny, seed 3, towers text, 88,704 parameters" in capsys.readouterr().out
    for argv in (["similarity", str(out), "a cat", "a dog", "a cat"], ["similarity", "--model", str(out), "a cat", "a dog", "a cat"]):
        assert main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[1].startswith("a cat") and lines[1].split()[2] == "1.000"  # the diagonal
        assert lines[1].split()[2:] == lines[3].split()[2:]  # the same text twice: the same row
        assert "3 texts, 32 dimensions" in lines[-1]


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    assert main(["similarity", str(bad), "a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uform: error: ") and err.count("\n") == 1
    assert err.endswith("not a valid safetensors checkpoint: header is not JSON (Expecting property name enclosed in double quotes at column 2)\n")
    assert main(["new", str(tmp_path / "x.safetensors"), "--modalities", "smell"]) == 2
    assert "no installed plugin provides the modalities ['smell']" in capsys.readouterr().err
    assert main(["describe", "--model", str(tmp_path / "missing.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uform: error: ") and "missing.safetensors" in err and err.count("\n") == 1


def test_describe(tiny_all: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", "--model", str(tiny_all), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    model = uform.Model.load_ram(tiny_all)
    d = model.describe()
    assert info["model"] == str(tiny_all)
    assert info["dimensions"] == d.dimensions and info["memory_usage"] == d.memory_usage and info["quantization"] == d.quantization.value
    assert info["backend"] == model.backend and info["compute"] == model.compute and info["gpu_class"] is None
    assert main(["describe", "--model", str(tiny_all), "--quantization", "f32"]) == 0
    text = capsys.readouterr().out
    assert f"dimensions                 {d.dimensions}\n" in text and "quantization               f32\n" in text


def test_the_model_defaults_to_the_shipped_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    path = uform.default_checkpoint()
    assert path.name == "default.safetensors" and path.is_file() and path.parent == Path(uform.__file__).parent / "data"
    assert main(["describe", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(path)
    with uform.Model.load_ram() as model:
        assert model.describe() == uform.Model.load_ram(path).describe()


def test_a_missing_default_checkpoint_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import uform.model

    monkeypatch.setattr(uform.model, "DEFAULT_CHECKPOINT", tmp_path / "gone.safetensors")
    with pytest.raises(FileNotFoundError, match="gone.safetensors is missing from this install of uform"):
        uform.Model.load_ram()
    assert main(["describe"]) == 2
    assert "is missing from this install of uform" in capsys.readouterr().err


def test_encode_texts_and_a_folder_reads_back_to_the_api(tiny_all: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "emb"
    assert main(["encode", "--model", str(tiny_all), "a red circle", str(folder), "two blue squares", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "9 rows of 32 f32 (2 texts, 3 images, 2 videos, 2 recordings)" in stdout and "passed over 1 entry of the folders" in stdout
    saved = read_saved(out)
    paths = [str(folder / m) for m in MEDIA]
    assert [r.get("text") or r.get("path") for r in saved.rows] == ["a red circle", *paths, "two blue squares"]
    assert [r["row"] for r in saved.rows] == list(range(9))
    assert [r["modality"] for r in saved.rows] == ["text", "video", "video", "image", "image", "image", "audio", "audio", "text"]
    assert saved.manifest["skipped"] == [{"path": str(folder / "notes.txt"), "reason": "unknown extension"}]
    assert saved.manifest["failed"] == [] and saved.manifest["model_sha256"]
    model = uform.Model.load_ram(tiny_all)
    np.testing.assert_array_equal(saved.embeddings[[0, 8]], embed(model, "text_encode", ["a red circle", "two blue squares"]))
    np.testing.assert_array_equal(saved.embeddings[1:3], embed(model, "video_encode", paths[:2]))
    np.testing.assert_array_equal(saved.embeddings[3:6], embed(model, "image_encode", paths[2:5]))
    np.testing.assert_array_equal(saved.embeddings[6:8], embed(model, "audio_encode", paths[5:]))


@pytest.mark.parametrize("scalar", ["i8", "bf16", "b1", "e4m3"])
def test_encode_output_scalars_read_back_to_the_api(scalar: str, tiny_all: Path, folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "emb.npy"  # the suffix is dropped
    assert main(["encode", "-q", "--model", str(tiny_all), "a cat", str(folder / "pictures"), "--out", str(out), "--outputs-scalar", scalar]) == 0
    saved = read_saved(tmp_path / "emb")
    model = uform.Model.load_ram(tiny_all)
    texts = model.text_encode(["a cat"], uform.Arena(), outputs_scalar=uform.Scalar(scalar))
    images = model.image_encode([str(folder / m) for m in MEDIA[2:5]], uform.Arena(), outputs_scalar=uform.Scalar(scalar))
    assert saved.embeddings.dtype == texts.embeddings.dtype
    np.testing.assert_array_equal(saved.embeddings, np.concatenate([np.array(texts.embeddings), np.array(images.embeddings)]))
    if scalar == "i8":
        assert saved.scales is not None
        np.testing.assert_array_equal(saved.scales, np.concatenate([np.array(texts.embedding_scales), np.array(images.embedding_scales)]))
    else:
        assert saved.scales is None


def test_encode_matryoshka_dimensions(tiny_all: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = ["a cat", "a dog", "the stock market"]
    assert main(["encode", "--model", str(tiny_all), *texts, "--out", str(tmp_path / "e"), "--dimensions", "8"]) == 0
    full = embed(uform.Model.load_ram(tiny_all), "text_encode", texts)
    prefix = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    saved = read_saved(tmp_path / "e")
    assert saved.embeddings.shape == (3, 8) and saved.manifest["dimensions"] == 8 and saved.manifest["model_dimensions"] == 32
    np.testing.assert_allclose(saved.embeddings, prefix, rtol=1e-6, atol=1e-7)
    assert main(["encode", "--model", str(tiny_all), "-q", "a cat", "--out", str(tmp_path / "b"), "--dimensions", "8", "--outputs-scalar", "b1"]) == 0
    assert read_saved(tmp_path / "b").embeddings.shape == (1, 1)
    capsys.readouterr()
    assert main(["encode", "--model", str(tiny_all), "a", "--out", str(tmp_path / "x"), "--dimensions", "33"]) == 2
    assert capsys.readouterr().err.strip() == "uform: error: --dimensions must be between 1 and the model's 32; got 33"


def bad_folder(folder: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The media folder plus files that cannot be read, and the reason each must be reported with."""
    bad = tmp_path / "mixed"
    bad.mkdir()
    for m in MEDIA:
        target = bad / m
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((folder / m).read_bytes())
    reasons = {}
    (bad / "pictures" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(200))
    reasons["pictures/corrupt.png"] = "cannot decode the image"
    (bad / "clips" / "corrupt.mp4").write_bytes(os.urandom(300))
    reasons["clips/corrupt.mp4"] = "not an MP4 or WebM file"
    (bad / "sounds" / "empty.wav").write_bytes(b"")
    reasons["sounds/empty.wav"] = "the file is empty"
    os.mkfifo(bad / "sounds" / "pipe.wav")
    reasons["sounds/pipe.wav"] = "is not a regular file"
    os.symlink(bad / "nowhere.png", bad / "pictures" / "dangling.png")  # a name whose file is gone
    reasons["pictures/dangling.png"] = "no such file"
    os.symlink("loop.jpg", bad / "pictures" / "loop.jpg")  # a link to itself: opening it raises ELOOP
    reasons["pictures/loop.jpg"] = "cannot read the file (Too many levels of symbolic links)"
    return bad, reasons


def test_encode_reports_bad_files_and_goes_on(tiny_all: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad, reasons = bad_folder(folder, tmp_path)
    out = tmp_path / "emb"
    assert main(["encode", "--model", str(tiny_all), "a cat", str(bad), "--out", str(out)]) == 1
    captured = capsys.readouterr()
    failed = [line for line in captured.err.splitlines() if line.startswith("uform: failed: ")]
    assert len(failed) == len(reasons)
    for name, reason in reasons.items():
        assert any(line.startswith(f"uform: failed: file {bad / name}: ") and reason in line for line in failed), (name, failed)
    assert f"{len(reasons)} failed" in captured.out and "8 rows of 32 f32 (1 text, 3 images, 2 videos, 2 recordings)" in captured.out
    saved = read_saved(out)
    assert {f["path"]: f["reason"] for f in saved.manifest["failed"]}.keys() == {str(bad / n) for n in reasons}
    assert [r.get("path") for r in saved.rows[1:]] == [str(bad / m) for m in MEDIA]
    model = uform.Model.load_ram(tiny_all)
    np.testing.assert_array_equal(saved.embeddings[3:6], embed(model, "image_encode", [str(bad / m) for m in MEDIA[2:5]]))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000 anyway (the dangling link and the link loop stand for it)")
def test_encode_reports_an_unreadable_file(tiny_all: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked.png"
    locked.write_bytes((folder / "pictures" / "red.png").read_bytes())
    locked.chmod(0)
    assert main(["encode", "--model", str(tiny_all), str(locked), str(folder / "pictures" / "blue.jpg"), "--out", str(tmp_path / "e")]) == 1
    assert f"uform: failed: file {locked}: cannot read the file (Permission denied)" in capsys.readouterr().err
    assert len(read_saved(tmp_path / "e").rows) == 1


def test_a_folder_deeper_than_python_s_recursion_is_walked(tiny_all: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1,200 levels (2,400 characters of path, under PATH_MAX): os.walk's recursion raised RecursionError, a traceback."""
    deep = bottom = tmp_path / "deep"
    deep.mkdir()
    for _ in range(1200):  # os.makedirs recurses too
        bottom = bottom / "d"
        bottom.mkdir()
    bottom = bottom / "red.png"
    bottom.write_bytes((folder / "pictures" / "red.png").read_bytes())
    (deep / "d" / "top.jpg").write_bytes((folder / "pictures" / "blue.jpg").read_bytes())
    try:
        assert main(["search", "red", str(deep), "-m", str(tiny_all), "--json", "-k", "0"]) == 0
        assert sorted(r["path"] for r in json.loads(capsys.readouterr().out)) == [str(bottom), str(deep / "d" / "top.jpg")]
    finally:  # bottom up: shutil.rmtree (pytest's clean-up) recurses as well
        bottom.unlink()
        (deep / "d" / "top.jpg").unlink()
        for level in [bottom.parent, *bottom.parent.parents][:1200]:
            level.rmdir()


def test_encode_many_bad_items_fall_back_to_one_at_a_time(tiny_all: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = [str(folder / m) for m in MEDIA[2:5]]
    corrupt = []
    for i in range(5):
        (tmp_path / f"bad{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
        corrupt.append(str(tmp_path / f"bad{i}.png"))
    mixed = [corrupt[0], good[0], corrupt[1], corrupt[2], good[1], corrupt[3], good[2], corrupt[4]]
    assert main(["encode", "--model", str(tiny_all), *mixed, "--out", str(tmp_path / "e")]) == 1
    assert capsys.readouterr().err.count("uform: failed: ") == 5
    saved = read_saved(tmp_path / "e")
    assert [r["path"] for r in saved.rows] == good
    np.testing.assert_array_equal(saved.embeddings, embed(uform.Model.load_ram(tiny_all), "image_encode", good))


def test_encode_arguments(tiny_all: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "e")
    assert main(["encode", "--model", str(tiny_all), "missing.jpg", "a cat", "--text", "missing.jpg", "--out", out]) == 1
    assert "uform: failed: file missing.jpg: no such file (to encode it as a text, pass it with --text)" in capsys.readouterr().err
    assert [r["text"] for r in read_saved(out).rows] == ["a cat", "missing.jpg"]
    assert main(["encode", "--model", str(tiny_all), str(folder / "notes.txt"), "--out", out]) == 1
    assert "uform: failed: file " + str(folder / "notes.txt") + ": unknown file type '.txt'" in capsys.readouterr().err
    assert main(["encode", "--model", str(tiny_all), "--out", out]) == 2
    assert "uform: error: nothing to encode" in capsys.readouterr().err
    assert main(["encode", "--model", str(tiny_all), "caf\udce9", "a cat", "--out", out]) == 1  # a Latin-1 argument, as Python decodes it
    assert "uform: failed: text 'caf\\xe9': " in capsys.readouterr().err
    assert [r["text"] for r in read_saved(out).rows] == ["a cat"]
    assert main(["encode", "--model", str(tiny_all), "a", "--out", str(tmp_path / "no" / "e")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_encode_with_a_model_missing_a_tower(tiny_text: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["encode", "--model", str(tiny_text), "a cat", str(folder / "pictures" / "red.png"), "--out", str(tmp_path / "e")]) == 1
    assert "image_encode needs the 'image' tower, which this checkpoint does not have" in capsys.readouterr().err
    assert len(read_saved(tmp_path / "e").rows) == 1


def test_search_ranks_by_the_query(tiny_all: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad, reasons = bad_folder(folder, tmp_path)
    assert main(["search", "a red square", str(bad), "--model", str(tiny_all), "--json", "--top", "0"]) == 1
    captured = capsys.readouterr()
    ranked = json.loads(captured.out)
    assert sorted(r["path"] for r in ranked) == sorted(str(bad / m) for m in MEDIA)
    assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)
    model = uform.Model.load_ram(tiny_all)
    query = embed(model, "text_encode", ["a red square"])[0]
    images = [str(bad / m) for m in MEDIA[2:5]]
    expected = dict(zip(images, embed(model, "image_encode", images) @ query))
    for r in ranked:
        if r["path"] in expected:
            assert r["score"] == pytest.approx(float(expected[r["path"]]), abs=1e-6)
    assert captured.err.count("uform: failed: ") == len(reasons)

    assert main(["search", "a red square", str(bad / "pictures"), "--model", str(tiny_all), "-k", "2"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].split()[0] == "1" and lines[1].split()[0] == "2"
    assert lines[0].split()[2] == max(expected, key=lambda p: expected[p])


def test_search_a_saved_encode_output(tiny_all: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "a tone", str(folder), "--model", str(tiny_all), "--json", "--top", "0"]) == 0
    direct = json.loads(capsys.readouterr().out)
    for scalar in ("f32", "i8", "b1"):
        out = tmp_path / scalar
        assert main(["encode", "-q", "--model", str(tiny_all), "a text row", str(folder), "--out", str(out), "--outputs-scalar", scalar]) == 0
        capsys.readouterr()
        assert main(["search", "a tone", f"{out}.npy", "--model", str(tiny_all), "--json", "--top", "0"]) == 0
        ranked = json.loads(capsys.readouterr().out)
        assert sorted(r["path"] for r in ranked) == sorted(r["path"] for r in direct)  # media rows only
        if scalar == "f32":
            assert ranked == direct
            assert main(["search", "a tone", str(out), "--model", str(tiny_all), "--json", "--top", "0"]) == 0  # the prefix
            assert json.loads(capsys.readouterr().out) == direct
    other = tmp_path / "other.safetensors"
    make_checkpoint(other, "tiny", 1, None)
    assert main(["search", "a tone", str(tmp_path / "f32.jsonl"), "--model", str(other)]) == 2
    assert "was made with the model" in capsys.readouterr().err


def test_search_errors(tiny_all: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("x")
    assert main(["search", "a cat", str(tmp_path), "--model", str(tiny_all)]) == 2
    assert "uform: error: nothing to search: no images, videos or recordings under" in capsys.readouterr().err
    assert main(["search", "a cat", str(tmp_path / "nowhere"), "--model", str(tiny_all), "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == [] and f"uform: failed: file {tmp_path / 'nowhere'}: no such file or folder" in captured.err


def test_progress_bars_only_on_a_terminal(tiny_all: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["encode", "--model", str(tiny_all), str(folder), "--out", str(tmp_path / "e")]
    assert main(argv) == 0
    assert "encoding" not in capsys.readouterr().err  # stderr is not a terminal here
    monkeypatch.setattr("uform.cli.common.bars_enabled", lambda quiet: not quiet)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "loading tiny-all.safetensors" in err and "encoding" in err and "/7 [" in err and "recordings" in err
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["new", str(tmp_path / "n.safetensors"), "--modalities", "text"]) == 0
    assert "initialising" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "n.safetensors"), str(tmp_path / "onnx")]) == 0
    captured = capsys.readouterr()
    assert "exporting" in captured.err and "text: " in captured.out


def test_search_modalities(tiny_all: Path, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "a tone", str(folder), "--model", str(tiny_all), "--json", "--modalities", "audio,video"]) == 0
    assert sorted(r["path"] for r in json.loads(capsys.readouterr().out)) == sorted(str(folder / m) for m in MEDIA if m.startswith(("sounds", "clips")))
    assert main(["search", "a tone", str(folder), "--model", str(tiny_all), "--modalities", "text"]) == 2
    assert "uform: error: --modalities must name image, video or audio" in capsys.readouterr().err


def test_search_ranks_a_file_under_two_paths_once(tiny_all: Path, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder named twice, or a file and its folder: each of its files was two hits of one score."""
    pictures = folder / "pictures"
    args = [str(pictures), f"{pictures}/./", str(pictures / "red.png"), "--model", str(tiny_all), "--json", "-k", "0"]
    assert main(["search", "a red square", *args]) == 0
    paths = [r["path"] for r in json.loads(capsys.readouterr().out)]
    assert sorted(paths) == sorted(str(folder / m) for m in MEDIA if m.startswith("pictures"))


def test_demo_media_then_encode(tiny_all: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo = tmp_path / "demo"
    assert main(["demo-media", str(demo), "--per-modality", "2"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote 6 files to {demo} (2 audio, 2 image, 2 video) and their captions in {demo}/captions.jsonl"
    captions = [json.loads(line) for line in (demo / "captions.jsonl").read_text().splitlines()]
    assert len(captions) == 6 and all((demo / c["path"]).is_file() for c in captions)
    assert main(["encode", "--model", str(tiny_all), str(demo), "--out", str(tmp_path / "e")]) == 0  # captions.jsonl is passed over
    assert "6 rows of 32 f32 (2 images, 2 videos, 2 recordings)" in capsys.readouterr().out
    assert main(["demo-media", str(demo), "--per-modality", "0"]) == 2


def test_demo_media_and_evaluate_name_a_bad_seed_and_an_empty_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--seed -1 was numpy's "expected non-negative integer", naming no option; DIR '' wrote the media into the current folder."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo-media", "demo", "--seed", "-1"]) == 2
    assert capsys.readouterr().err == "uform: error: --seed must be 0 or more; got -1\n"
    assert main(["evaluate", "--model", "missing.safetensors", "--seed", "-1"]) == 2  # refused before the model is loaded
    assert capsys.readouterr().err == "uform: error: --seed must be 0 or more; got -1\n"
    assert main(["demo-media", "", "--per-modality", "1"]) == 2
    assert capsys.readouterr().err == "uform: error: DIR is empty: name the folder to write into\n"
    assert list(tmp_path.iterdir()) == []


def test_evaluate(tiny_all: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--model", str(tiny_all), "--count", "3", "--questions", "4", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    held = uform.Model.load_ram(tiny_all).describe().quantization.value  # bf16, or f32 where the op library cannot serve
    assert figures["items"] == 3 and figures["questions"] == 4 and figures["quantization"] == held
    assert all(0 <= figures[k] <= 1 for k in ("image_recall_at_1", "video_recall_at_5", "audio_recall_at_1", "choose_accuracy", "choose_ece"))
    assert main(["evaluate", "--model", str(tiny_all), "--count", "3", "--questions", "4", "--quantization", "f32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"model {tiny_all} (f32 weights, cpu backend)"
    assert lines[1].split() == ["task", "recall@1", "recall@5", "queries"] and lines[2].startswith("text→image")
    assert lines[5].split() == ["accuracy", "ECE", "questions"] and lines[6].split()[0] == "text_choose"
    assert main(["evaluate", "--model", str(tiny_all), "--count", "0"]) == 2


def test_search_finds_the_demo_media_by_their_captions_on_the_default_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo = tmp_path / "demo"
    assert main(["demo-media", str(demo)]) == 0
    captions = {str(demo / c["path"]): c for c in map(json.loads, (demo / "captions.jsonl").read_text().splitlines())}
    capsys.readouterr()
    assert main(["search", "a red circle", str(demo), "--json", "-k", "3"]) == 0  # every modality ranked together
    assert [captions[r["path"]]["caption"] for r in json.loads(capsys.readouterr().out)] == ["a red circle"] * 3
    assert main(["encode", "-q", str(demo), "--out", str(tmp_path / "demo-emb"), "--outputs-scalar", "i8"]) == 0
    capsys.readouterr()
    for modality in ("image", "video", "audio"):
        for path, c in captions.items():
            if c["modality"] != modality:
                continue
            for where in (str(demo), str(tmp_path / "demo-emb.npy")):
                assert main(["search", c["caption"], where, "--json", "-k", "3", "--modalities", modality]) == 0
                found = [captions[r["path"]]["caption"] for r in json.loads(capsys.readouterr().out)]
                assert c["caption"] in found, (path, found)
