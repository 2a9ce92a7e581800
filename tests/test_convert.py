"""``uform convert`` on small CLIP and SigLIP models made here (transformers' classes, random
weights, no download): the file it writes (config, tensor names, shapes, dtypes, the tokenizer)
and the math of that file (tests/v2_reference.py, numpy) against transformers' features.
Refusals: tests/test_convert_refusals.py; other sources: tests/test_convert_sources.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

import hf_models  # noqa: E402
import v2_reference as ref  # noqa: E402

from uform.cli import main  # noqa: E402
from uform.convert import convert  # noqa: E402
from convert_folders import copy, header, safetensors_file  # noqa: E402


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_models.make_siglip(tmp_path_factory.mktemp("siglip") / "tiny-siglip")


@pytest.fixture(scope="module")
def siglip_file(siglip_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out") / "siglip.safetensors"
    convert(siglip_dir, out, dtype="f32")
    return out


def test_clip_file_config_and_tensors(clip_file: Path, clip_dir: Path) -> None:
    cfg, entries, meta = header(clip_file)
    g = hf_models.CLIP_SMALL
    assert cfg["format_version"] == 2 and cfg["dimensions"] == g["projection_dim"] and cfg["context"] == 77
    assert cfg["source"]["family"] == "clip" and cfg["source"]["name"] == "tiny-clip" and cfg["source"]["architecture"] == "CLIPModel"
    assert cfg["labels"] == {"kind": "softmax", "scale": pytest.approx(np.exp(4.0)), "bias": 0.0}
    text, image = cfg["towers"]["text"], cfg["towers"]["image"]
    assert cfg["towers"]["video"] == {"from": "image", "frames": 8}
    assert {k: text[k] for k in ("activation", "class_token", "pooling", "projection", "tokenizer", "vocab_size", "context", "mask", "pad_to_context", "pad_id")} == {
        "activation": "quick_gelu", "class_token": False, "pooling": "last_token", "projection": "linear", "tokenizer": "tokenizer.json",
        "vocab_size": 49408, "context": 77, "mask": "causal", "pad_to_context": False, "pad_id": 49407,
    }  # fmt: skip
    assert {k: image[k] for k in ("class_token", "ln_pre", "pooling", "projection", "image_size", "patch_size", "resize", "interpolation")} == {
        "class_token": True, "ln_pre": True, "pooling": "class", "projection": "linear", "image_size": 32, "patch_size": 8,
        "resize": "shorter_side_crop", "interpolation": "bicubic",
    }  # fmt: skip
    assert image["mean"] == pytest.approx([0.48145466, 0.4578275, 0.40821073]) and image["std"] == pytest.approx([0.26862954, 0.26130258, 0.27577711])
    w, m, d = 64, 128, 48
    shapes = {name: e["shape"] for name, e in entries.items()}
    assert shapes["text.embed.weight"] == [49408, w] and shapes["text.pos.weight"] == [77, w] and "text.cls" not in shapes
    assert shapes["image.patch.weight"] == [w, 3 * 8 * 8] and shapes["image.patch.bias"] == [w] and shapes["image.pos.weight"] == [17, w]
    assert shapes["image.ln_pre.weight"] == [w] and shapes["image.cls"] == [w]
    assert shapes["text.blocks.1.attn.qkv.weight"] == [3 * w, w] and shapes["image.blocks.1.mlp.fc1.weight"] == [m, w]
    assert shapes["text.projection.weight"] == [d, w] and shapes["image.projection.weight"] == [d, w]
    assert "text.projection.bias" not in shapes and not any(n.startswith("video.") for n in shapes)
    assert {e["dtype"] for e in entries.values()} == {"F32"}
    source = json.loads((clip_dir / "tokenizer.json").read_text())
    assert json.loads(meta["tokenizer"]) == source  # the source's tokenizer.json, as it was


def test_siglip_file_config_and_tensors(siglip_file: Path) -> None:
    cfg, entries, meta = header(siglip_file)
    assert cfg["source"]["family"] == "siglip" and cfg["dimensions"] == 64 and cfg["context"] == 16
    assert cfg["labels"] == {"kind": "sigmoid", "scale": pytest.approx(np.exp(2.3)), "bias": pytest.approx(-1.5)}
    text, image = cfg["towers"]["text"], cfg["towers"]["image"]
    assert (text["pooling"], text["mask"], text["pad_to_context"], text["pad_id"], text["projection"], text["activation"]) == (
        "final_position", "none", True, 1, "linear_bias", "gelu_tanh")  # fmt: skip
    assert (image["pooling"], image["projection"], image["class_token"], image["ln_pre"], image["resize"]) == ("attention", "none", False, False, "square")
    assert image["mean"] == [0.5] * 3 and image["layer_norm_eps"] == 1e-6
    shapes = {name: e["shape"] for name, e in entries.items()}
    assert shapes["image.pos.weight"] == [16, 64] and "image.cls" not in shapes and "image.projection.weight" not in shapes
    assert shapes["image.pool.probe"] == [64] and shapes["image.pool.attn.qkv.weight"] == [192, 64] and shapes["image.pool.mlp.fc2.weight"] == [64, 128]
    assert shapes["text.projection.bias"] == [64] and shapes["text.pos.weight"] == [16, 64]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_clip_file_math_equals_transformers(clip_file: Path, clip_dir: Path) -> None:
    """The file's tensors under the format's math (numpy, float64) give CLIPModel's features."""
    import torch
    from transformers import AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(clip_dir).eval()
    tok = AutoTokenizer.from_pretrained(clip_dir)
    texts = hf_models.CORPUS[:6] + ["a very long caption " * 30]
    enc = tok(texts, padding=True, truncation=True, max_length=77, return_tensors="pt")
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want_text = model.get_text_features(**enc).pooler_output.numpy()
        want_image = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
    ids = [[int(i) for i, keep in zip(row, mask) if keep] for row, mask in zip(enc["input_ids"], enc["attention_mask"])]
    read = ref.read(clip_file)
    assert cosines(ref.text(read, ids), want_text).min() > 0.999999
    assert cosines(ref.image(read, pixels.numpy()), want_image).min() > 0.999999


def test_siglip_file_math_equals_transformers(siglip_file: Path, siglip_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, SiglipModel

    model = SiglipModel.from_pretrained(siglip_dir).eval()
    tok = AutoTokenizer.from_pretrained(siglip_dir)
    texts = hf_models.CORPUS[:6] + ["a very long caption " * 30]
    enc = tok(texts, padding="max_length", truncation=True, max_length=16, return_tensors="pt")
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want_text = model.get_text_features(input_ids=enc["input_ids"]).pooler_output.numpy()
        want_image = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
    eos = tok.eos_token_id
    ids = [row[: row.index(eos) + 1] for row in enc["input_ids"].tolist()]  # the file pads with its pad_id itself
    read = ref.read(siglip_file)
    assert cosines(ref.text(read, ids), want_text).min() > 0.999999
    assert cosines(ref.image(read, pixels.numpy()), want_image).min() > 0.999999


def test_siglip_tokenizer_json_gives_siglip_tokenizer_ids(siglip_file: Path, siglip_dir: Path) -> None:
    """SigLIP ships only spiece.model: the tokenizer.json made at convert time gives
    SiglipTokenizer's ids on a corpus it was not checked on at convert time."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    _, _, meta = header(siglip_file)
    made = Tokenizer.from_str(meta["tokenizer"])
    slow = AutoTokenizer.from_pretrained(siglip_dir)
    rng = np.random.default_rng(0)
    alphabet = list("abc XYZ.,!?;:'\"-_()[]{}\t\n éüß日本🐱😀▁ＡＢ！") + ["  ", "   ", "\u3000"]
    alphabet += ["\ufeff", "\u200b", "\u00ad", "\x01", "\x7f"]  # what SentencePiece's normaliser removes
    dropped = ["\ufeffa photo of a cat", "\u200b dog", "\x01 \x7f", "a\u200b \ufeff"]  # removed at the start: no space left before the text
    texts = hf_models.CORPUS + dropped + ["".join(rng.choice(alphabet, size=int(rng.integers(0, 40)))) for _ in range(200)]
    for text in texts:
        assert made.encode(text).ids == slow(text)["input_ids"], text


def test_bf16_is_the_default_and_rounds_the_source(clip_dir: Path, clip_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "bf16.safetensors"
    done = convert(clip_dir, out)
    assert done.dtype == "bf16" and done.family == "clip" and done.bytes == out.stat().st_size
    _, entries, _ = header(out)
    assert {e["dtype"] for e in entries.values()} == {"BF16"}
    import ml_dtypes

    full, half = ref.read(clip_file)[1], ref.read(out)[1]
    name = "image.blocks.0.mlp.fc1.weight"
    assert np.array_equal(half[name], full[name].astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64))
    assert list(tmp_path.iterdir()) == [out]  # no temporary left


def test_cli_convert_writes_and_says_what(clip_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.safetensors"
    assert main(["convert", str(clip_dir), str(out), "--dtype", "f16", "--name", "my/clip", "--frames", "4"]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}: clip (CLIPModel) from my/clip" in said and "f16" in said
    cfg, entries, _ = header(out)
    assert cfg["source"]["name"] == "my/clip" and cfg["towers"]["video"]["frames"] == 4
    assert {e["dtype"] for e in entries.values()} == {"F16"}


def test_the_streamed_file_is_what_the_core_writer_writes(clip_file: Path, clip_dir: Path, tmp_path: Path) -> None:
    """The conversion writes tensor by tensor; its bytes are those uform.core.safetensors.write
    gives the same tensors and metadata (so the container needs no second writer's rules)."""
    from uform.core import safetensors
    from uform.core.checkpoint import CheckpointFile

    for dtype in ("f32", "bf16"):
        out = tmp_path / f"{dtype}.safetensors"
        convert(clip_dir, out, dtype=dtype, name="tiny-clip")
        with CheckpointFile(out) as f:
            tensors = {name: np.array(f.array(name)) for name in f.entries}
            metadata = dict(f.metadata)
        again = tmp_path / f"{dtype}-again.safetensors"
        safetensors.write(again, tensors, metadata)
        assert again.read_bytes() == out.read_bytes()


def test_a_safetensors_source_needs_neither_torch_nor_transformers(clip_dir: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "c.safetensors"
    code = (
        "import sys; from uform.convert import convert; "
        f"convert({str(clip_dir)!r}, {str(out)!r}); "
        "print(sorted(m for m in ('torch', 'transformers', 'sentencepiece') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]" and out.is_file()


def test_a_bf16_source_converts_to_every_dtype(clip_dir: Path, tmp_path: Path) -> None:
    """A BF16-stored source: F32 and BF16 outputs hold its values exactly, F16 to F16's rounding."""
    import ml_dtypes

    from uform.core import safetensors

    d = copy(clip_dir, tmp_path)
    with safetensors_file(d / "model.safetensors") as tensors:
        safetensors.write(d / "model.safetensors", {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}, {"format": "pt"})
    read = {}
    for dtype in ("f32", "f16", "bf16"):
        convert(d, tmp_path / f"{dtype}.safetensors", dtype=dtype)
        read[dtype] = ref.read(tmp_path / f"{dtype}.safetensors")[1]
    for name, value in read["f32"].items():
        assert np.array_equal(value, read["bf16"][name]), name
        assert np.allclose(value, read["f16"][name], rtol=2e-3, atol=1e-6), name
