"""Real checkpoints' geometries converted and run: SigLIP so400m-patch14-384 (image 384 with
patches of 14: transformers' stride-14 convolution takes 27×27 patches over 378 pixels and
leaves the last 6 rows and columns out; uform's ``patch_remainder: drop``), at its real widths
(hidden 1152, MLP 4304, 16 heads of 72, text context 64) with fewer layers and random weights,
against transformers' ``SiglipModel``: pixels, files, video (the mean of its 384-pixel frames), the
index, the server and the exported image tower in ONNX Runtime.

``python tests/test_converted_geometry.py`` prints the F32 max abs differences docs/models.md gives.
"""

from __future__ import annotations

import base64
import io
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

from v2ckpt import dumps  # noqa: E402

from uform.cli import main  # noqa: E402
from uform.convert import convert  # noqa: E402

# google/siglip-so400m-patch14-384's config.json, with 2 vision layers and 1 text layer (27 each in the Hub's)
SO400M_384: dict[str, Any] = {
    "text": {"hidden_size": 1152, "num_hidden_layers": 1, "num_attention_heads": 16, "intermediate_size": 4304, "max_position_embeddings": 64},
    "vision": {"hidden_size": 1152, "num_hidden_layers": 2, "num_attention_heads": 16, "intermediate_size": 4304, "image_size": 384, "patch_size": 14},
}
BOUND = {Scalar.F32: 0.99999, Scalar.BF16: 0.9995, Scalar.E4M3: 0.99}  # tests/test_models.py's
TEXTS = ["a photo of a cat", "A Photo Of A DOG!", "two dogs, running; on the beach...", "naïve café", "x", "a very long caption " * 30]


@pytest.fixture(scope="module")
def so400m(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = hf_models.make_siglip(tmp_path_factory.mktemp("so400m") / "siglip-so400m-patch14-384", SO400M_384)
    out = d.parent / "so400m.safetensors"
    convert(d, out, dtype="f32")
    return d, out


def pictures(count: int, size: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (count, 4, 4, 3)).astype(np.float32)
    smooth = np.repeat(np.repeat(base, size // 4, axis=1), size // 4, axis=2)
    return np.clip(smooth + rng.normal(0, 30, smooth.shape), 0, 255).astype(np.uint8)


def features(directory: Path, texts: list[str], pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers' float32 text features (input_ids padded to 64, as SigLIP was trained) and image features."""
    import torch
    from transformers import AutoTokenizer, SiglipModel

    model = SiglipModel.from_pretrained(directory).eval()
    ids = AutoTokenizer.from_pretrained(directory)(texts, padding="max_length", truncation=True, max_length=64, return_tensors="pt")["input_ids"]
    x = (pixels.astype(np.float32) / 255 - 0.5) / 0.5
    with torch.no_grad():
        text = model.get_text_features(input_ids=ids).pooler_output.numpy()
        image = model.get_image_features(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).pooler_output.numpy()
    return text, image


@pytest.fixture(scope="module")
def reference(so400m: tuple[Path, Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    px = pictures(4, 384)
    return (*features(so400m[0], TEXTS, px), px)


def unit(x: Any) -> np.ndarray:
    a = np.asarray(x, np.float64)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def cosines(got: Any, want: np.ndarray) -> np.ndarray:
    g, w = unit(got), unit(want)
    assert (np.argmax(g @ w.T, axis=1) == np.arange(len(w))).all()  # each row nearest its own reference
    return (g * w).sum(1)


def test_the_file_says_the_last_rows_and_columns_are_left_out(so400m: tuple[Path, Path]) -> None:
    image = dumps(so400m[1])["towers"]["image"]
    assert (image["image_size"], image["patch_size"], image["patch_remainder"], image["width"], image["heads"]) == (384, 14, "drop", 1152, 16)


@pytest.mark.parametrize("quantization", [Scalar.F32, Scalar.BF16, Scalar.E4M3])
def test_so400m_patch14_384_equals_transformers(so400m: tuple[Path, Path], reference: Any, quantization: Scalar) -> None:
    text, image, px = reference
    with uform.Model.load_ram(so400m[1], quantization=quantization) as m:
        assert cosines(m.text_encode(TEXTS, Arena()).embeddings, text).min() >= BOUND[quantization]
        got = np.asarray(m.image_encode_pixels(list(px), Arena()).embeddings)
        assert cosines(got, image).min() >= BOUND[quantization]
        edged = px.copy()
        edged[:, 378:, :, :] = 255 - edged[:, 378:, :, :]  # the 6 rows and 6 columns no patch covers
        edged[:, :, 378:, :] = 0
        assert np.array_equal(np.asarray(m.image_encode_pixels(list(edged), Arena()).embeddings), got)


def test_image_files_video_index_and_server_on_so400m(so400m: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """image_encode of PNG files of other sizes equals transformers on the processor's pixels
    (a square bicubic resize to 384, SiglipImageProcessorPil); a video is the mean of its
    frames' image embeddings; index and search, and the server's image_url, give the same rows."""
    from PIL import Image
    from transformers import SiglipImageProcessorPil

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "photos"
    folder.mkdir()
    shapes = [(500, 300), (300, 700), (384, 384)]
    for i, (w, h) in enumerate(shapes):
        Image.fromarray(pictures(1, 400, seed=5 + i)[0]).resize((w, h)).save(folder / f"p{i}.png")
    files = [str(folder / f"p{i}.png") for i in range(len(shapes))]
    processor = SiglipImageProcessorPil.from_pretrained(so400m[0])
    fitted = np.stack([np.asarray(Image.open(f).convert("RGB").resize((384, 384), Image.Resampling.BICUBIC)) for f in files])
    expected = processor([Image.open(f).convert("RGB") for f in files], return_tensors="np")["pixel_values"]
    assert np.abs(((fitted.astype(np.float32) / 255 - 0.5) / 0.5).transpose(0, 3, 1, 2) - expected).max() < 1e-5
    _, image = features(so400m[0], ["x"], fitted)
    with uform.Model.load_ram(so400m[1], quantization=Scalar.F32) as m:
        rows = np.asarray(m.image_encode(files, Arena()).embeddings)
        assert cosines(rows, image).min() >= 0.99999
        from media import clip as make_clip

        from uform.plugins.media.files import sources
        from uform.plugins.media.frames import Pixels
        from uform.plugins.media.video import sample

        frame = np.ascontiguousarray(np.asarray(Image.open(files[0]).convert("RGB").resize((64, 48))))
        data = make_clip(frames=12, size=(64, 48), picture=frame)
        video = np.asarray(m.video_encode([data], Arena()).embeddings)
        frames, _ = sample(sources([data], "bytes")[0], 8, Pixels.read(dumps(so400m[1])["towers"]["image"], "image").fit)
        assert frames.shape == (8, 384, 384, 3)
        mean = np.asarray(m.image_encode_pixels(list(frames), Arena()).embeddings, np.float64).mean(axis=0)
        assert (unit(video) @ (mean / np.linalg.norm(mean))).item() >= 0.999999
        query = np.asarray(m.text_encode(["a photo of a cat"], Arena()).embeddings)[0]
    model = ["-m", str(so400m[1]), "--quantization", "f32"]
    assert main(["index", "photos", "--into", "idx", *model]) == 0
    capsys.readouterr()
    assert main(["search", "a photo of a cat", "--index", "idx", "--json", *model]) == 0
    ranked = json.loads(capsys.readouterr().out)
    assert [r["score"] for r in ranked] == pytest.approx(sorted(rows @ query, reverse=True), abs=1e-5)

    pytest.importorskip("uvicorn")
    import httpx
    from serving import thread_server

    from uform.serve.config import ServeConfig

    png = base64.b64encode(Path(files[1]).read_bytes()).decode()
    with uform.Model.load_ram(so400m[1], quantization=Scalar.F32) as m, thread_server(m, ServeConfig(model_id="so400m")) as (url, _):
        got = httpx.post(url + "/v1/embeddings", json={"input": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}]}, timeout=120)
        assert got.status_code == 200, got.text
        assert np.allclose(got.json()["data"][0]["embedding"], rows[1], atol=1e-5)


def test_the_exported_image_tower_takes_384_pixels_in_onnx_runtime(so400m: tuple[Path, Path], reference: Any, tmp_path: Path) -> None:
    import onnxruntime as ort

    from uform.exporters.towers import export_towers

    _, image, px = reference
    written = export_towers(so400m[1], tmp_path / "towers", "f32")
    session = ort.InferenceSession(str(written["image"]), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1:] == [384, 384, 3]
    (got,) = session.run(["embeddings"], {"pixels": px})
    assert cosines(got, image).min() >= 0.99999


def test_a_size_patches_do_not_divide_is_refused_unless_the_file_says_drop(so400m: tuple[Path, Path], tmp_path: Path) -> None:
    from uform.core import safetensors

    c = safetensors.parse(memoryview(so400m[1].read_bytes()))
    config = dumps(so400m[1])
    del config["towers"]["image"]["patch_remainder"]
    out = tmp_path / "exact.safetensors"
    safetensors.write(out, {n: np.array(c.array(n)) for n in c.entries}, dict(c.metadata) | {"uform": json.dumps(config)})
    with pytest.raises(uform.CheckpointError, match=r"towers.image.patch_size: 14 does not divide image_size 384 \(patch_remainder 'drop' leaves the last 6 rows and columns out\)"):
        uform.Model.load_ram(out)


if __name__ == "__main__":  # the F32 max abs differences docs/models.md gives
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = hf_models.make_siglip(Path(tmp) / "siglip-so400m-patch14-384", SO400M_384)
        convert(d, Path(tmp) / "so400m.safetensors", dtype="f32")
        text, image = features(d, TEXTS, pictures(4, 384))
        for q in (Scalar.F32, Scalar.BF16, Scalar.E4M3):
            with uform.Model.load_ram(Path(tmp) / "so400m.safetensors", quantization=q) as m:
                t, i = np.asarray(m.text_encode(TEXTS, Arena()).embeddings), np.asarray(m.image_encode_pixels(list(pictures(4, 384)), Arena()).embeddings)
            print(f"{q.name}: text min cos {cosines(t, text).min():.6f} max abs {np.abs(t - unit(text)).max():.2e}; "
                  f"image min cos {cosines(i, image).min():.6f} max abs {np.abs(i - unit(image)).max():.2e}")  # fmt: skip
