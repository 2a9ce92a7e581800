"""``uform convert`` on small CLIP and SigLIP models made here (transformers' classes, random
weights, no download): the file it writes (config, tensor names, shapes, dtypes, the tokenizer),
the math of that file (tests/v2_reference.py, numpy) against transformers' features, and every
refusal writing nothing."""

from __future__ import annotations

import json
import re
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

import hf_models  # noqa: E402
import v2_reference as ref  # noqa: E402

from uform.cli import main  # noqa: E402
from uform.convert import ConvertError, convert  # noqa: E402


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_models.make_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_models.make_siglip(tmp_path_factory.mktemp("siglip") / "tiny-siglip")


@pytest.fixture(scope="module")
def clip_file(clip_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out") / "clip.safetensors"
    convert(clip_dir, out, dtype="f32")
    return out


@pytest.fixture(scope="module")
def siglip_file(siglip_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out") / "siglip.safetensors"
    convert(siglip_dir, out, dtype="f32")
    return out


def header(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    h = json.loads(data[8 : 8 + n])
    meta = h.pop("__metadata__")
    return json.loads(meta["uform"]), h, meta


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


# -- refusals: a clear error each, nothing written ------------------------------------------


@pytest.mark.parametrize("name", ["", "  ", "a\nb", "evil\x1b[31m", 7])
def test_a_name_that_is_empty_or_not_printable_is_refused(clip_dir: Path, tmp_path: Path, name: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """--name '' was taken as no name (the directory's recorded), a control character recorded and
    printed as it is (an escape sequence reached the terminal of whoever ran uform describe)."""
    out = tmp_path / "c.safetensors"
    with pytest.raises(ValueError, match="name must be some printable text .*, got " + re.escape(repr(name))):
        convert(clip_dir, out, name=name)
    if isinstance(name, str):
        assert main(["convert", str(clip_dir), str(out), "--name", name]) == 2
        assert "name must be some printable text" in capsys.readouterr().err
    assert not out.exists()


def copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def refused(source: Path | str, tmp_path: Path, match: str) -> None:
    out = tmp_path / "out" / "x.safetensors"
    out.parent.mkdir(exist_ok=True)
    with pytest.raises(ConvertError, match=match):
        convert(source, out)
    assert list(out.parent.iterdir()) == []


def edit_config(directory: Path, change: Any) -> None:
    path = directory / "config.json"
    cfg = json.loads(path.read_text())
    change(cfg)
    path.write_text(json.dumps(cfg))


def test_missing_source_and_missing_files(clip_dir: Path, tmp_path: Path) -> None:
    refused(tmp_path / "nowhere", tmp_path, "no such directory, and not a Hugging Face Hub id")
    d = copy(clip_dir, tmp_path)
    (d / "model.safetensors").rename(d / "elsewhere.bin")
    refused(d, tmp_path, "no weights: expected model.safetensors")
    (d / "elsewhere.bin").rename(d / "model.safetensors")
    (d / "tokenizer.json").unlink()
    refused(d, tmp_path, "no tokenizer")
    (d / "config.json").unlink()
    refused(d, tmp_path, "no config.json")


def test_hub_id_offline_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    refused("nobody-here/no-such-model", tmp_path, "not in the local Hugging Face cache, and HF_HUB_OFFLINE forbids a download")


def test_a_config_nested_past_the_stack_is_refused_by_name(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    (d / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(d, tmp_path, r"config.json: cannot be read as JSON \(nested too deeply\)")


def test_unsupported_architectures_are_named(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    edit_config(d, lambda c: c.update(model_type="blip", architectures=["BlipModel"]))
    refused(d, tmp_path, r"architecture BlipModel \(model_type 'blip'\) is not supported; supported: CLIPModel .*SiglipModel")
    edit_config(d, lambda c: c.update(model_type="siglip2", architectures=["Siglip2Model"]))
    refused(d, tmp_path, r"Siglip2Model \(SigLIP 2 NaFlex, variable resolution\) is not supported")


def test_shapes_that_disagree_with_the_config(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    edit_config(d, lambda c: c["vision_config"].update(intermediate_size=96))
    refused(d, tmp_path, r"tensor 'vision_model.encoder.layers.0.mlp.fc1.weight' has shape \[128, 64\], but the config says \[96, 64\]")
    edit_config(d, lambda c: c["vision_config"].update(intermediate_size=128, hidden_act="relu"))
    refused(d, tmp_path, "hidden_act 'relu' is not supported")


@pytest.mark.parametrize(
    ("section", "key", "value", "match"),
    [
        ("vision_config", "patch_size", 0, r"config.json vision_config: field 'patch_size' is 0, not a positive integer"),
        ("vision_config", "num_attention_heads", 0, r"vision_config: field 'num_attention_heads' is 0, not a positive integer"),
        ("text_config", "hidden_size", 64.5, r"text_config: field 'hidden_size' is 64.5, not a positive integer"),
        ("text_config", "num_hidden_layers", -1, r"text_config: field 'num_hidden_layers' is -1, not a positive integer"),
        ("text_config", "layer_norm_eps", "abc", r"text_config: field 'layer_norm_eps' is 'abc', not a positive number"),
        ("text_config", "hidden_act", ["gelu"], r"text_config: hidden_act \['gelu'\] is not supported"),
        ("vision_config", "image_size", 4, r"vision_config.image_size 4 is not a multiple of patch_size 8"),
        ("", "text_config", [64], r"config.json: field 'text_config' is \[64\], not an object"),
    ],
)
def test_config_fields_of_the_wrong_kind_are_refused_by_name(clip_dir: Path, tmp_path: Path, section: str, key: str, value: Any, match: str) -> None:
    d = copy(clip_dir, tmp_path)
    edit_config(d, lambda c: (c[section] if section else c).update({key: value}))
    refused(d, tmp_path, match)


def test_what_a_load_would_refuse_is_refused_before_writing(clip_dir: Path, tmp_path: Path) -> None:
    """Fields inside the source's own bounds but outside a uform file's: the converted config
    and tensors pass the load's own checks before a byte is written."""
    from uform.core import safetensors

    d = copy(clip_dir, tmp_path)
    path = d / "preprocessor_config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps(cfg | {"image_std": [0, 0.2, 0.2]}))
    refused(d, tmp_path, r"image_std \[0, 0.2, 0.2\] is not a list of 3 finite numbers above 0")
    path.write_text(json.dumps(cfg | {"image_std": [1e-7, 0.2, 0.2]}))
    refused(d, tmp_path, r"the converted file would not load \(config field towers.image.std: 1e-07 is not a number in \[1e-06, 1000.0\]\); nothing was written")
    path.write_text(json.dumps(cfg))
    edit_config(d, lambda c: c["text_config"].update(layer_norm_eps=0.5))
    refused(d, tmp_path, r"would not load \(config field towers.text.layer_norm_eps: expected a number in \[1e-12, 0.01\], got 0.5\)")
    edit_config(d, lambda c: c["text_config"].update(layer_norm_eps=1e-5))
    with safetensors_file(d / "model.safetensors") as tensors:
        tensors["logit_scale"] = np.full_like(tensors["logit_scale"], 800.0)
        safetensors.write(d / "model.safetensors", tensors, {"format": "pt"})
    refused(d, tmp_path, r"tensor 'logit_scale' holds 800, whose exp \(the labels' scale\) is past 1e\+06")


def test_nan_weights_are_refused(clip_dir: Path, tmp_path: Path) -> None:
    from uform.core import safetensors

    d = copy(clip_dir, tmp_path)
    with safetensors_file(d / "model.safetensors") as tensors:
        tensors["vision_model.post_layernorm.bias"][3] = np.nan
        safetensors.write(d / "model.safetensors", tensors, {"format": "pt"})
    refused(d, tmp_path, r"vision_model.post_layernorm.bias.*NaN")


def test_unknown_tensors_are_refused(clip_dir: Path, tmp_path: Path) -> None:
    from uform.core import safetensors

    d = copy(clip_dir, tmp_path)
    with safetensors_file(d / "model.safetensors") as tensors:
        tensors["vision_model.extra.layer_scale"] = np.ones(64, np.float32)
        safetensors.write(d / "model.safetensors", tensors, {"format": "pt"})
    refused(d, tmp_path, "tensors this conversion does not know: vision_model.extra.layer_scale")


def test_a_tokenizer_that_does_not_parse(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    refused(d, tmp_path, "tokenizer.json: the tokenizer does not parse")


def test_a_tokenizer_with_ids_past_the_embedding_is_refused(clip_dir: Path, tmp_path: Path) -> None:
    """A tokenizer.json of 49,408 tokens whose 'dog</w>' is numbered 60000 converted (its count
    fits the 49,408 rows), and text_encode(['a dog']) then failed in ONNX Runtime ('indices
    element out of data bounds, idx=60000'); one token more than the rows is refused too."""
    d = copy(clip_dir, tmp_path)
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["model"]["vocab"]["dog</w>"] = 60000
    (d / "tokenizer.json").write_text(json.dumps(tok))
    refused(d, tmp_path, r"tokenizer.json: the tokenizer's token 'dog</w>' has id 60000, past the 49408 rows of the text embedding \(config.json text_config.vocab_size\)$")
    tok["model"]["vocab"]["dog</w>"] = 1929
    tok["added_tokens"].append({"id": 49408, "content": "<extra>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    (d / "tokenizer.json").write_text(json.dumps(tok))
    refused(d, tmp_path, r"tokenizer.json: the tokenizer has 49409 tokens, more than the 49408 rows of the text embedding \(config.json text_config.vocab_size\)$")


def test_an_out_that_cannot_be_written(clip_dir: Path, clip_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The one writer of outputs (uform.core.files): a missing folder, a read-only file and a link
    to /dev/full are refused naming OUT, before any work; the old file stays, nothing is left."""
    from uform.core.files import OutputError

    old = tmp_path / "old.safetensors"
    shutil.copy(clip_file, old)
    old.chmod(0o444)
    (tmp_path / "full.safetensors").symlink_to("/dev/full")
    before = snapshot(tmp_path)
    for out, why in (("no-such-dir/x.safetensors", f"no such folder {tmp_path}/no-such-dir"),
                     ("old.safetensors", "read-only; left as it was"),
                     ("full.safetensors", "not a regular file \\(/dev/full\\); not replaced")):  # fmt: skip
        with pytest.raises(OutputError, match=f"^{tmp_path}/{out}: {why}"):
            convert(clip_dir, tmp_path / out, force=True)
        assert main(["convert", str(clip_dir), str(tmp_path / out), "--force"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"uform: error: {tmp_path}/{out}: ") and "Traceback" not in err, err
    with pytest.raises(ConvertError, match="is a directory"):
        convert(clip_dir, tmp_path)
    assert snapshot(tmp_path) == before


def test_an_out_in_a_read_only_folder(clip_dir: Path, tmp_path: Path) -> None:
    """Root runs the command without the capability that overrides permission bits (``setpriv``,
    as tests/test_index_cli.py does), so the refusal is the one a user gets."""
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to bind")
    (tmp_path / "ro").mkdir(mode=0o555)
    try:
        run = subprocess.run([*(drop if os.geteuid() == 0 else []), sys.executable, "-m", "uform.cli", "convert", str(clip_dir), "ro/x.safetensors"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert (run.returncode, run.stdout) == (2, "") and run.stderr == "uform: error: ro/x.safetensors: cannot be written (Permission denied)\n"
    assert list((tmp_path / "ro").iterdir()) == []


LIMITED = """
import resource, sys
from uform.cli import main
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(main(sys.argv[2:]))
"""


def test_a_conversion_under_a_file_size_limit_keeps_the_old_out(clip_dir: Path, clip_file: Path, tmp_path: Path) -> None:
    """``ulimit -f 64; uform convert SRC OUT`` (OUT an earlier conversion): one line naming OUT,
    status 2, the old file byte for byte, no temporary file left."""
    out = tmp_path / "x.safetensors"
    shutil.copy(clip_file, out)
    before = snapshot(tmp_path)
    assert out.stat().st_size > 64 * 1024
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-c", LIMITED, str(64 * 1024), "convert", str(clip_dir), str(out), "--dtype", "f32"],
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 2 and run.stdout == "", (run.stdout, run.stderr)
    assert run.stderr == f"uform: error: {out}: not written (File too large); the old file is as it was\n"
    assert snapshot(tmp_path) == before


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too: a temporary left behind shows) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def test_a_refused_conversion_keeps_the_old_out(clip_dir: Path, clip_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "kept.safetensors"
    shutil.copy(clip_file, out)
    before = out.read_bytes()
    d = copy(clip_dir, tmp_path)
    edit_config(d, lambda c: c["text_config"].update(hidden_size=32))
    with pytest.raises(ConvertError):
        convert(d, out)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["kept.safetensors", d.name]


class safetensors_file:
    """The float32 tensors of a safetensors file, as a dict to edit (a context manager)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> dict[str, np.ndarray]:
        from uform.core.checkpoint import CheckpointFile

        with CheckpointFile(self.path) as f:
            return {name: np.array(f.array(name)) for name in f.entries}

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_a_pytorch_bin_source_converts_to_the_same_file(clip_dir: Path, clip_file: Path, tmp_path: Path, zipped: bool) -> None:
    """``pytorch_model.bin`` (read by torch with weights_only=True) gives the same tensors as
    model.safetensors, in torch's zip format (mapped) and in its legacy format (torch < 1.6,
    or ``_use_new_zipfile_serialization=False``: torch cannot map it, so it is read whole)."""
    import torch

    d = copy(clip_dir, tmp_path)
    with safetensors_file(d / "model.safetensors") as tensors:
        state = {k: torch.from_numpy(v) for k, v in tensors.items()}
        torch.save(state, d / "pytorch_model.bin", _use_new_zipfile_serialization=zipped)
    (d / "model.safetensors").unlink()
    out = tmp_path / "bin.safetensors"
    convert(d, out, dtype="f32", name="tiny-clip")
    assert out.read_bytes() == clip_file.read_bytes()


def test_an_open_clip_training_checkpoint_converts_as_its_weights(tmp_path: Path) -> None:
    """open_clip's training writes ``epoch_N.pt``: the weights under ``state_dict``, named
    ``module.…`` where it ran under DistributedDataParallel, beside the optimizer's state.
    Saved as open_clip_pytorch_model.bin it converts to the bytes its bare weights give."""
    pytest.importorskip("open_clip")
    import torch

    d, model = hf_models.make_open_clip(tmp_path / "oc")
    plain = tmp_path / "plain.safetensors"
    convert(d, plain, dtype="f32", name="oc")
    state = {f"module.{k}": v for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters()).state_dict()
    torch.save({"epoch": 3, "name": "run", "state_dict": state, "optimizer": optimizer}, d / "open_clip_pytorch_model.bin")
    trained = tmp_path / "trained.safetensors"
    convert(d, trained, dtype="f32", name="oc")
    assert trained.read_bytes() == plain.read_bytes()


def test_open_clip_variants_are_refused_by_field(tmp_path: Path) -> None:
    pytest.importorskip("open_clip")
    d, _ = hf_models.make_open_clip(tmp_path / "oc")
    path = d / "open_clip_config.json"
    cfg = json.loads(path.read_text())
    cfg["model_cfg"]["text_cfg"]["no_causal_mask"] = True
    path.write_text(json.dumps(cfg))
    refused(d, tmp_path, r"model_cfg.text_cfg.no_causal_mask = True is not supported")
    cfg["model_cfg"]["text_cfg"].pop("no_causal_mask")
    cfg["model_cfg"]["vision_cfg"]["layers"] = [3, 4, 6, 3]
    path.write_text(json.dumps(cfg))
    refused(d, tmp_path, r"a ResNet tower is not supported")
    for edit, match in [
        (lambda m: m["vision_cfg"].update(layers=2, patch_size=0), r"patch_size 0, width 64, head_width 16 are not supported"),
        (lambda m: m["text_cfg"].update(mlp_ratio="4"), r"text_cfg: field 'mlp_ratio' is '4', not a positive number"),
        (lambda m: m.update(text_cfg="wide"), r"model_cfg: field 'text_cfg' is 'wide', not an object"),
    ]:
        changed = json.loads(json.dumps(cfg))
        changed["model_cfg"]["vision_cfg"]["layers"] = 2
        edit(changed["model_cfg"])
        path.write_text(json.dumps(changed))
        refused(d, tmp_path, match)
    path.write_text(json.dumps(cfg | {"model_cfg": {**cfg["model_cfg"], "vision_cfg": {**cfg["model_cfg"]["vision_cfg"], "layers": 2}}, "preprocess_cfg": {"mean": ["a", 1, 2]}}))
    refused(d, tmp_path, r"preprocess_cfg: mean \['a', 1, 2\] is not a list of 3 finite numbers")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clean": "canonicalize"}, r"tokenizer_kwargs.clean = 'canonicalize' is not supported \(uform converts open_clip's default SimpleTokenizer: clean = 'lower', reduction_mask = ''\)$"),
        ({"clean": "whitespace"}, r"tokenizer_kwargs.clean = 'whitespace' is not supported"),
        ({"reduction_mask": "simple"}, r"tokenizer_kwargs.reduction_mask = 'simple' is not supported"),
        ({"context_length": 32}, r"tokenizer_kwargs.context_length = 32 is not supported"),
        ({"additional_special_tokens": ["<x>"]}, r"tokenizer_kwargs.additional_special_tokens = \['<x>'\] is not supported"),
        ("lower", r"model_cfg.text_cfg.tokenizer_kwargs = 'lower' is not an object$"),
    ],
)
def test_open_clip_tokenizer_kwargs_other_than_the_default_are_refused(tmp_path: Path, kwargs: Any, match: str) -> None:
    """open_clip's tokenizer cleans the text as ``text_cfg.tokenizer_kwargs`` says (``clean``
    'canonicalize' removes punctuation, 'whitespace' keeps the case): the file's tokenizer.json
    does what the default ('lower') does, so another value was converted into other ids than
    open_clip's; each is refused by name, the default converts."""
    pytest.importorskip("open_clip")
    d, _ = hf_models.make_open_clip(tmp_path / "oc")
    path = d / "open_clip_config.json"
    cfg = json.loads(path.read_text())
    cfg["model_cfg"]["text_cfg"]["tokenizer_kwargs"] = kwargs
    path.write_text(json.dumps(cfg))
    refused(d, tmp_path, match)
    cfg["model_cfg"]["text_cfg"]["tokenizer_kwargs"] = {"clean": "lower", "reduction_mask": ""}
    path.write_text(json.dumps(cfg))
    assert convert(d, tmp_path / "default.safetensors", name="oc").family == "open_clip"


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


def test_a_hub_id_is_read_from_the_local_cache_offline(clip_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``uform convert owner/name OUT`` with HF_HUB_OFFLINE=1 reads the Hugging Face cache
    (laid out as huggingface_hub keeps it: refs/main naming a snapshot) and records the Hub id."""
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    repo = cache / "models--openai--clip-vit-base-patch32"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(clip_dir, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    out = tmp_path / "clip-b32.safetensors"
    assert main(["convert", "openai/clip-vit-base-patch32", str(out)]) == 0
    assert "from openai/clip-vit-base-patch32" in capsys.readouterr().out
    assert header(out)[0]["source"]["name"] == "openai/clip-vit-base-patch32"


def test_preprocessing_uform_lacks_is_refused(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    path = d / "preprocessor_config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps(cfg | {"crop_size": {"height": 28, "width": 28}}))
    refused(d, tmp_path, r"crop_size \{'height': 28, 'width': 28\} are not supported: uform resizes the shorter side to the tower's image_size 32")
    path.write_text(json.dumps(cfg | {"resample": 0}))
    refused(d, tmp_path, r"resample 0 is not supported; supported: 2 \(bilinear\), 3 \(bicubic\)")
    for rescale in (False, None, "no"):  # do_rescale false converted: transformers fed levels 0-255 to the mean and std, uform 0-1
        path.write_text(json.dumps(cfg | {"do_rescale": rescale}))
        refused(d, tmp_path, rf"preprocessor_config.json: do_rescale {rescale!r} is not supported; supported: true \(levels scaled by 1/255 before the mean and std\)$")
    path.unlink()  # no preprocessor_config.json: the family's defaults, said in a note
    done = convert(d, tmp_path / "defaults.safetensors")
    assert any("no preprocessor_config.json" in note for note in done.notes)
    assert header(tmp_path / "defaults.safetensors")[0]["towers"]["image"]["mean"] == pytest.approx(hf_models.CLIP_MEAN)


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


def sharded(d: Path) -> dict[str, list[str]]:
    """``d``'s model.safetensors split in two shards (every other tensor), the file removed: the
    tensors' names by shard, for an index to name."""
    from uform.core import safetensors

    with safetensors_file(d / "model.safetensors") as tensors:
        names = sorted(tensors)
        shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        for shard, part in shards.items():
            safetensors.write(d / shard, {n: tensors[n] for n in part}, {"format": "pt"})
    (d / "model.safetensors").unlink()
    return shards


def test_sharded_safetensors_convert_to_the_same_file(clip_dir: Path, clip_file: Path, tmp_path: Path) -> None:
    """Weights in shards named by model.safetensors.index.json (as large models are published)."""
    d = copy(clip_dir, tmp_path)
    shards = sharded(d)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: s for s, part in shards.items() for n in part}}))
    out = tmp_path / "sharded.safetensors"
    convert(d, out, dtype="f32", name="tiny-clip")
    assert out.read_bytes() == clip_file.read_bytes()
    (d / "model-00002-of-00002.safetensors").unlink()
    refused(d, tmp_path, "model-00002-of-00002.safetensors: missing")
    # a shard outside the directory (another model's file, the user's own) is never read
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes((d / "model-00001-of-00002.safetensors").read_bytes())
    for shard in ("../elsewhere.safetensors", str(outside), "..", 7):
        table = {n: shard if s.startswith("model-00002") else s for s, part in shards.items() for n in part}
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": table}))
        refused(d, tmp_path, rf"model.safetensors.index.json: weight_map gives '.*' the shard {re.escape(repr(shard))}, not a file name in")


def test_a_cache_with_the_weights_alone_asks_the_hub_for_the_rest(clip_dir: Path, tmp_path: Path) -> None:
    """``CLIPModel.from_pretrained`` caches config.json and the weights only: where a download
    is allowed, ``uform convert`` asks the Hub for the tokenizer and preprocessing the snapshot
    lacks (a local server stands for the Hub here and answers 404, so the conversion then names
    the missing tokenizer); a snapshot holding them is read without asking."""
    pytest.importorskip("huggingface_hub")
    import http.server
    import threading

    asked: list[str] = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            asked.append(self.path)
            self.send_error(404)

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    repo = tmp_path / "hub" / "models--openai--clip-vit-base-patch32"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(clip_dir / name, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}", "HF_HUB_DISABLE_TELEMETRY": "1"}
    run = [sys.executable, "-c", "import sys; from uform.cli import main; sys.exit(main(sys.argv[1:]))", "convert", "openai/clip-vit-base-patch32"]
    try:
        partial = subprocess.run(run + [str(tmp_path / "a.safetensors")], env=env, capture_output=True, text=True, timeout=300)
        assert partial.returncode != 0 and "no tokenizer" in partial.stderr, partial.stderr
        assert any("openai/clip-vit-base-patch32" in path for path in asked), asked
        asked.clear()
        for f in clip_dir.iterdir():
            if f.is_file() and not (snapshot / f.name).exists():
                shutil.copy(f, snapshot / f.name)
        whole = subprocess.run(run + [str(tmp_path / "b.safetensors")], env=env, capture_output=True, text=True, timeout=300)
        assert whole.returncode == 0, whole.stderr
        assert asked == []
    finally:
        server.shutdown()
        server.server_close()


def test_a_tensor_the_index_leaves_out_names_the_index(clip_dir: Path, tmp_path: Path) -> None:
    """A weight_map that leaves out a tensor its shard holds (or gives a tensor to a shard without
    it) was "SHARD1, SHARD2: tensor 'logit_scale' is missing (...)": the shards are whole, the
    index is at fault, and the error now names it."""
    d = copy(clip_dir, tmp_path)
    shards = sharded(d)
    table = {n: s for s, part in shards.items() for n in part}
    index = d / "model.safetensors.index.json"
    left, holder = "logit_scale", table["logit_scale"]
    index.write_text(json.dumps({"weight_map": {n: s for n, s in table.items() if n != left}}))
    refused(d, tmp_path, rf"^{re.escape(str(index))}: weight_map leaves out tensor '{left}', which {re.escape(holder)} holds \(the model's logit scale\)$")
    other = next(s for s in shards if s != holder)
    index.write_text(json.dumps({"weight_map": {**table, left: other}}))
    refused(d, tmp_path, rf"^{re.escape(str(index))}: weight_map gives tensor '{left}' the shard {re.escape(other)}, which does not hold it; {re.escape(holder)} does \(the model's logit scale\)$")
