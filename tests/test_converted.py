"""Checkpoint format version 2: CLIP and SigLIP towers (transformers' classes, random weights)
as uform files, against transformers on the same inputs, on every backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uform
from uform import Arena, Scalar
from uform.core import safetensors

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from v2ckpt import VOCAB, clip_file, dumps, siglip_file, word_tokenizer  # noqa: E402

TEXTS = ["a cat on the mat", "dog", "red blue sky !", "", "the the the the the the the the the the the the the the the the the the"]
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}


def _clip() -> Any:
    torch.manual_seed(0)
    text = SMALL | {"vocab_size": len(VOCAB), "max_position_embeddings": 16, "bos_token_id": 1, "eos_token_id": 3, "pad_token_id": 0}
    cfg = transformers.CLIPConfig(text_config=text, vision_config=SMALL | {"image_size": 32, "patch_size": 8}, projection_dim=32)
    model = transformers.CLIPModel(cfg).eval()
    with torch.no_grad():  # the zero-initialised norms and biases made visible
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name or "class_embedding" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _siglip() -> Any:
    torch.manual_seed(1)
    text = SMALL | {"vocab_size": len(VOCAB), "max_position_embeddings": 16, "projection_size": 64}
    model = transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=SMALL | {"image_size": 32, "patch_size": 8})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    model = _clip()
    return model, clip_file(model, tmp_path_factory.mktemp("clip") / "clip.safetensors")


@pytest.fixture(scope="module")
def siglip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    model = _siglip()
    return model, siglip_file(model, tmp_path_factory.mktemp("siglip") / "siglip.safetensors")


def _ids(texts: list[str], bos: bool = True, context: int = 16, pad_to: int | None = None) -> tuple[Any, Any]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(word_tokenizer(bos))
    tok.enable_truncation(context)
    rows = [e.ids for e in tok.encode_batch(texts)]
    width = pad_to or max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids, mask


def _pixels(count: int, size: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def _normalised(x: Any) -> np.ndarray:
    x = np.asarray(x.detach().numpy() if hasattr(x, "detach") else x, np.float64)
    x = getattr(x, "pooler_output", x)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _features(out: Any) -> Any:
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _hf_image(model: Any, pixels: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    x = (pixels.astype(np.float32) / 255 - np.float32(mean)) / np.float32(std)
    with torch.no_grad():
        return _normalised(_features(model.get_image_features(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2).contiguous())))


def _cos(a: Any, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1)


CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def test_clip_float32_equals_transformers(clip: tuple[Any, Path]) -> None:
    model, path = clip
    m = uform.Model.load_ram(path, quantization=Scalar.F32)
    ids, mask = _ids(TEXTS)
    with torch.no_grad():
        want = _normalised(_features(model.get_text_features(input_ids=ids, attention_mask=mask)))
    got = m.text_encode(TEXTS, Arena()).embeddings
    assert _cos(got, want).min() >= 0.99999
    pixels = _pixels(5)
    got = m.image_encode_pixels(list(pixels), Arena()).embeddings
    assert _cos(got, _hf_image(model, pixels, CLIP_MEAN, CLIP_STD)).min() >= 0.99999


def test_source_is_shown(clip: tuple[Any, Path], tiny_text: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = uform.Model.load_ram(clip[1], quantization=Scalar.F32)
    assert m.source == {"family": "clip", "name": "random-clip", "architecture": "CLIPModel", "converter": "tests/v2ckpt.py"}
    assert uform.Model.load_ram(tiny_text).source is None
    from uform.cli import main

    assert main(["describe", "--model", str(clip[1])]) == 0
    assert "source                     clip random-clip (CLIPModel), converted by tests/v2ckpt.py" in capsys.readouterr().out


def test_a_source_name_that_is_not_printable_is_shown_escaped(clip: tuple[Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from uform.cli import main

    path = clip_file(clip[0], tmp_path / "odd.safetensors", name="x\x1b[2J\nsource  forged")  # a file from someone else
    assert main(["describe", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    assert "source                     clip x\\x1b[2J\\nsource  forged (CLIPModel)" in out
    assert "\x1b" not in out and "\nsource  forged" not in out


def test_siglip_float32_equals_transformers(siglip: tuple[Any, Path]) -> None:
    model, path = siglip
    m = uform.Model.load_ram(path, quantization=Scalar.F32)
    ids, _ = _ids(TEXTS, bos=False, pad_to=16)  # padding="max_length", no attention mask: as trained
    with torch.no_grad():
        want = _normalised(_features(model.get_text_features(input_ids=ids)))
    got = m.text_encode(TEXTS, Arena()).embeddings
    assert _cos(got, want).min() >= 0.99999
    pixels = _pixels(5, seed=1)
    got = m.image_encode_pixels(list(pixels), Arena()).embeddings
    assert _cos(got, _hf_image(model, pixels, [0.5] * 3, [0.5] * 3)).min() >= 0.99999


# uform's own towers keep BF16 > 0.9999 of float32 and E4M3 a mean >= 0.995, min >= 0.98 (test_e4m3.py);
# a converted F32 file's BF16 load rounds its weights too, and stays within the same bounds
@pytest.mark.parametrize("quantization,bound,mean", [(Scalar.BF16, 0.9999, 0.9999), (Scalar.E4M3, 0.98, 0.995)])
def test_low_precision_loads_within_bounds(clip: tuple[Any, Path], siglip: tuple[Any, Path], quantization: Scalar, bound: float, mean: float) -> None:
    for _, path in (clip, siglip):
        ref = uform.Model.load_ram(path, quantization=Scalar.F32)
        low = uform.Model.load_ram(path, quantization=quantization)
        pixels = list(_pixels(4, seed=2))
        for verb, items in (("text_encode", TEXTS), ("image_encode_pixels", pixels)):
            want = np.asarray(getattr(ref, verb)(items, Arena()).embeddings, np.float64)
            got = getattr(low, verb)(items, Arena()).embeddings
            cos = _cos(got, want)
            assert cos.min() >= bound and cos.mean() >= mean, (path.name, verb, cos.min(), cos.mean())


def test_every_cpu_class_runs_a_converted_file(clip: tuple[Any, Path], siglip: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each class this machine runs, with each kernel variant the class may take (the cpu
    backend's graphs below x86-64-v3, then the op library's avx2, avx2-split, avx512,
    avx512-bf16 and amx variants, with the fused attention and epilogues)."""
    from uform.plugins import e4m3
    from uform.plugins.cpu import machine_classes

    runs = [(cls, variant) for cls in machine_classes() for variant in e4m3.CHOICES.get(cls, (None,))]
    runs = [(cls, v) for cls, v in runs if v is None or v in e4m3.library().runnable]
    pixels = list(_pixels(3, seed=4))
    for _, path in (clip, siglip):
        ref = uform.Model.load_ram(path, quantization=Scalar.F32)
        want = {verb: np.asarray(getattr(ref, verb)(items, Arena()).embeddings, np.float64) for verb, items in (("text_encode", TEXTS), ("image_encode_pixels", pixels))}
        for cls, variant in runs:
            if variant is not None and len(e4m3.CHOICES[cls]) > 1:
                monkeypatch.setenv(e4m3.AVX2_KERNELS if variant.startswith("avx2") else e4m3.AVX512_KERNELS, variant)
            for quantization, bound in ((Scalar.BF16, 0.9999), (Scalar.E4M3, 0.98)):
                m = uform.Model.load_ram(path, quantization=quantization, cpu_class=cls)
                assert variant is None or variant in m.compute, (m.compute, variant)
                for verb, items in (("text_encode", TEXTS), ("image_encode_pixels", pixels)):
                    cos = _cos(getattr(m, verb)(items, Arena()).embeddings, want[verb])
                    assert cos.min() >= bound, (path.name, cls, variant, quantization, m.backend, m.compute, verb, cos.min())
            monkeypatch.delenv(e4m3.AVX2_KERNELS, raising=False)
            monkeypatch.delenv(e4m3.AVX512_KERNELS, raising=False)


def test_a_buffer_load_equals_a_file_load(clip: tuple[Any, Path]) -> None:
    for quantization in (Scalar.F32, Scalar.BF16):
        a = uform.Model.load_ram(clip[1], quantization=quantization).text_encode(TEXTS, Arena()).embeddings
        b = uform.Model.load_ram_buffer(clip[1].read_bytes(), quantization=quantization).text_encode(TEXTS, Arena()).embeddings
        assert np.array_equal(np.asarray(a), np.asarray(b)), quantization


def test_stored_f16_and_bf16_files_load(clip: tuple[Any, Path], tmp_path: Path) -> None:
    import ml_dtypes

    model, path = clip
    want = np.asarray(uform.Model.load_ram(path, quantization=Scalar.F32).text_encode(TEXTS, Arena()).embeddings, np.float64)
    for dtype, name in ((np.float16, "F16"), (ml_dtypes.bfloat16, "BF16")):
        other = clip_file(model, tmp_path / f"{name}.safetensors", dtype=dtype)
        assert {e.dtype for e in safetensors.parse(memoryview(other.read_bytes())).entries.values()} == {name}
        got = uform.Model.load_ram(other, quantization=Scalar.F32).text_encode(TEXTS, Arena()).embeddings
        assert _cos(got, want).min() >= (0.9999 if name == "F16" else 0.999)
        for quantization in (Scalar.BF16, Scalar.E4M3):  # F16 rounded to BF16 at load, packed from there
            got = uform.Model.load_ram(other, quantization=quantization).text_encode(TEXTS, Arena()).embeddings
            assert _cos(got, want).min() >= 0.98, (name, quantization)


def test_token_stats_and_truncation_count_model_tokens(clip: tuple[Any, Path]) -> None:
    _, path = clip
    m = uform.Model.load_ram(path, quantization=Scalar.F32)
    stats = uform.TextEncodeStats()
    m.text_encode(["a b", "the " * 20], Arena(), stats=stats)
    # "a b" is 4 tokens with <bos> and <eos>; 20 words are 22 tokens, cut to the context of 16
    assert (stats.tokens, stats.truncated_items, stats.truncated_tokens) == (4 + 16, 1, 22 - 16)
    assert stats.padding_tokens == 16 - 4


def test_token_ids_equal_transformers_truncation() -> None:
    from transformers import PreTrainedTokenizerFast

    from uform.plugins.media.text import HeldTokenizer

    text = word_tokenizer()
    ours = HeldTokenizer(text, 16, len(VOCAB), "towers.text")
    theirs = PreTrainedTokenizerFast(tokenizer_object=__import__("tokenizers").Tokenizer.from_str(text))
    corpus = ["", "a", "cat  \t on\n\nthe mat", "🐈 on the mat ,", "Ünïcödé dog", "the " * 14, "the " * 15, "a " * 40]
    got = ours.encode(corpus)
    want = theirs(corpus, truncation=True, max_length=16)["input_ids"]
    assert [list(i) for i in got.ids] == want
    assert list(got.full) == [len(i) for i in theirs(corpus)["input_ids"]]  # before truncation


def test_texts_of_no_tokens_still_embed(clip: tuple[Any, Path], tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    bare = Tokenizer.from_str(word_tokenizer())
    bare.post_processor = None  # no special tokens: an empty text is no token at all
    path = _rewrite(clip[1], tmp_path / "bare.safetensors", lambda c: None, {"tokenizer": bare.to_str()})
    m = uform.Model.load_ram(path, quantization=Scalar.F32)
    for texts in (["", ""], ["", "a cat"]):
        rows = np.asarray(m.text_encode(texts, Arena()).embeddings)
        assert rows.shape == (2, 32) and np.allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)


def test_bytes_that_are_not_utf8_name_the_item(clip: tuple[Any, Path]) -> None:
    m = uform.Model.load_ram(clip[1], quantization=Scalar.F32)
    with pytest.raises(uform.InputError, match=r"item 1: bytes are not UTF-8 \(invalid start byte at byte 2\)"):
        m.text_encode([b"ok", b"ab\xff"], Arena())
    assert np.allclose(m.text_encode([b"a cat"], Arena()).embeddings, m.text_encode(["a cat"], Arena()).embeddings)


def test_a_released_memoryview_names_its_item_through_the_held_tokenizer(clip: tuple[Any, Path]) -> None:
    m = uform.Model.load_ram(clip[1], quantization=Scalar.F32)
    view = memoryview(b"a dog")
    view.release()
    with pytest.raises(uform.InputError, match=r"item 1: the memoryview was released"):
        m.text_encode([b"a cat", view], Arena())


def test_video_from_image_is_the_mean_of_its_frames(clip: tuple[Any, Path]) -> None:
    from media import clip as make_clip

    from uform.plugins.media.video import sample
    from uform.plugins.media.frames import Pixels
    from uform.plugins.media.files import sources

    _, path = clip
    m = uform.Model.load_ram(path, quantization=Scalar.F32)
    picture = _pixels(1, 48, seed=3)[0][:, :, :]
    data = make_clip(frames=12, size=(64, 48), picture=np.ascontiguousarray(np.broadcast_to(picture[:48, :48].mean(), (48, 64, 3)).astype(np.uint8)))
    got = np.asarray(m.video_encode([data], Arena()).embeddings)
    frames, _ = sample(sources([data], "bytes")[0], 2, Pixels.read(dumps(path)["towers"]["image"], "image").fit)
    rows = np.asarray(m.image_encode_pixels(list(frames), Arena()).embeddings, np.float64).mean(axis=0)
    assert _cos(got, (rows / np.linalg.norm(rows))[None]).min() >= 0.999999


def _rewrite(path: Path, out: Path, change: Any, metadata: dict[str, str] | None = None) -> Path:
    c = safetensors.parse(memoryview(path.read_bytes()))
    config = dumps(path)
    change(config)
    meta = dict(c.metadata) | {"uform": json.dumps(config)} | (metadata or {})
    safetensors.write(out, {n: np.array(c.array(n)) for n in c.entries}, meta)
    return out


@pytest.mark.parametrize(
    "change,metadata,message",
    [
        (lambda c: c.update(format_version=1), None, r"config field labels: needs format_version 2 \(the file says 1\)"),
        (lambda c: c["towers"]["text"].update(mask="sideways"), None, r"towers.text.mask: expected one of 'padding', 'causal', 'none', got 'sideways'"),
        (lambda c: c["towers"]["text"].update(pooling="class"), None, "towers.text.pooling: 'class' needs a class token"),
        (lambda c: c["towers"]["text"].update(vocab_size=5), None, "towers.text.vocab_size: 5, but the tokenizer has"),
        (lambda c: c["towers"]["video"].update({"from": "audio"}), None, "towers.video.from: a video tower can be made of 'image' only"),
        (lambda c: None, {"tokenizer": "{not json"}, r'__metadata__\["tokenizer"\] is not a tokenizer.json'),
        (lambda c: c["towers"]["image"].update(mask="causal"), None, "config field towers.image.mask: not a field of an image tower"),
        (lambda c: c["towers"]["text"].update(resize="square"), None, "config field towers.text.resize: not a field of a text tower"),
    ],
)
def test_bad_v2_configs_are_refused_by_name(clip: tuple[Any, Path], tmp_path: Path, change: Any, metadata: Any, message: str) -> None:
    bad = _rewrite(clip[1], tmp_path / "bad.safetensors", change, metadata)
    with pytest.raises(uform.CheckpointError, match=message):
        uform.Model.load_ram(bad, quantization=Scalar.F32)


def test_export_of_a_converted_file(clip: tuple[Any, Path], tmp_path: Path) -> None:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from uform.exporters.towers import export_towers

    m = uform.Model.load_ram(clip[1], quantization=Scalar.F32)
    pixels = _pixels(3, seed=5)
    want = np.asarray(m.image_encode_pixels(list(pixels), Arena()).embeddings, np.float64)
    sizes = {}
    for quantization in ("f32", "bf16"):
        out = export_towers(clip[1], tmp_path / quantization, quantization=quantization)
        sizes[quantization] = out["image"].stat().st_size
        got = ort.InferenceSession(str(out["image"])).run(None, {"pixels": pixels})[0]
        assert _cos(got, want).min() >= (0.99999 if quantization == "f32" else 0.9999)
    assert sizes["bf16"] < 0.6 * sizes["f32"]  # an F32 file's weights rounded to BF16
    folder = tmp_path / "f32"
    held = Tokenizer.from_file(str(folder / "text.tokenizer.json"))
    assert held.encode("a cat").ids == [1, 4, 12, 3]
    text = json.loads((folder / "text.json").read_text())
    assert text["preprocessing"].startswith("token ids of text.tokenizer.json (tokenizers library, special tokens added, truncated to 16 tokens)")
    video = json.loads((folder / "video.json").read_text())
    assert video["inputs"] == [{"name": "frame_embeddings", "dtype": "float32", "shape": ["batch", 2, 32]}]


def test_without_the_tokenizers_library_the_error_names_the_extra(clip: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(uform.UnsupportedError, match=r"needs the tokenizers library: pip install 'uform\[models\]'"):
        uform.Model.load_ram(clip[1])


def test_a_converted_load_imports_neither_torch_nor_transformers(clip: tuple[Any, Path]) -> None:
    import subprocess
    import sys

    probe = (
        "import sys, numpy as np, uform\n"
        f"m = uform.Model.load_ram({str(clip[1])!r})\n"
        "m.text_encode(['a cat'], uform.Arena()); m.image_encode_pixels([np.zeros((40, 50, 3), np.uint8)], uform.Arena())\n"
        "print(sorted(k for k in ('torch', 'transformers', 'huggingface_hub', 'tokenizers') if k in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip().splitlines()[-1] == "['tokenizers']"


def test_the_pytorch_reference_refuses_version_2_options(clip: tuple[Any, Path]) -> None:
    from uform.exporters.reference import ReferenceModel

    with pytest.raises(uform.UnsupportedError, match="the PyTorch reference implements checkpoint format version 1; tower 'image' uses version 2's activation, layer_norm_eps, ln_pre"):
        ReferenceModel.from_checkpoint(clip[1])


def test_towers_without_a_head_refuse_its_fields(tmp_path: Path) -> None:
    from ckpt import make_checkpoint

    path = make_checkpoint(tmp_path / "v1.safetensors", modalities=["audio", "choose"])
    for tower, message in (("audio", "the audio tower takes"), ("decoder", "the byte decoder takes")):
        bad = _rewrite(path, tmp_path / f"{tower}.safetensors", lambda c: (c.update(format_version=2), c["towers"][tower].update(ln_pre=True)))
        with pytest.raises(uform.CheckpointError, match=f"config field towers.{tower}.ln_pre: {message} activation and layer_norm_eps"):
            uform.Model.load_ram(bad)
    quick = _rewrite(path, tmp_path / "quick.safetensors", lambda c: (c.update(format_version=2), c["towers"]["audio"].update(activation="quick_gelu")))
    assert uform.Model.load_ram(quick).served.modalities  # the stack's own fields are the audio tower's too


def test_v1_loads_refuse_f32_tensors(tmp_path: Path) -> None:
    from ckpt import make_checkpoint

    path = make_checkpoint(tmp_path / "v1.safetensors", modalities=["text"])
    c = safetensors.parse(memoryview(path.read_bytes()))
    tensors = {n: np.array(c.array(n)) for n in c.entries} | {"text.cls": np.zeros(64, np.float32)}
    safetensors.write(tmp_path / "f32.safetensors", tensors, dict(c.metadata))
    with pytest.raises(uform.CheckpointError, match=r"tensor 'text.cls': dtype F32, the format \(version 1\) stores BF16"):
        uform.Model.load_ram(tmp_path / "f32.safetensors")


def test_a_held_tokenizer_with_an_id_past_the_embedding_is_refused_at_load() -> None:
    """A file whose tokenizer numbers a token past the text embedding's rows (its count within
    them) loaded, and a text holding that token failed in ONNX Runtime's Gather ('indices element
    out of data bounds'); the load refuses it, naming the token and its id."""
    pytest.importorskip("tokenizers")
    import json

    from uform.core.errors import CheckpointError
    from uform.plugins.media.text import HeldTokenizer

    def word_level(vocab: dict[str, int]) -> str:
        return json.dumps({"version": "1.0", "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}, "pre_tokenizer": {"type": "Whitespace"}})

    with pytest.raises(CheckpointError, match=r"^config field towers.text.vocab_size: 10, but the tokenizer's token 'dog' has id 100$"):
        HeldTokenizer(word_level({"<unk>": 0, "a": 1, "dog": 100}), 8, 10, "towers.text")
    assert HeldTokenizer(word_level({"<unk>": 0, "a": 1, "dog": 9}), 8, 10, "towers.text").encode(["a dog"]).ids[0].tolist() == [1, 9]
