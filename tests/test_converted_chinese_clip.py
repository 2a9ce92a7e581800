"""``uform convert`` of a transformers ``ChineseCLIPModel`` (random weights at
chinese-clip-vit-base-patch16's geometry, depth cut to 2: tests/chinese_clip_models.py) against
``get_text_features`` with ``BertTokenizer`` (``padding=True, truncation=True``) and
``get_image_features`` with ``ChineseCLIPImageProcessorPil``, at F32, BF16 and E4M3; its WordPiece
tokenizer against transformers' ``BertTokenizer`` and the Python ``BertTokenizerLegacy``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uform
from uform import Arena, Scalar
from uform.convert import ConvertError, convert
from uform.core import safetensors

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
Image = pytest.importorskip("PIL.Image")

from chinese_clip_models import SMALL, TEXTS, make_chinese_clip, vocabulary  # noqa: E402

SHAPES = [(224, 224), (300, 200), (97, 311), (640, 480), (5, 7)]  # width, height
MORE_TEXTS = TEXTS + [
    "猫" * 600, "ＡＢＣ　全角空格", "Ça va? Ñandú!", "##s and ## alone", "[CLS][SEP]", "tab\tcat\x0bvertical\x0cform",
    "CafÉ", "a\u0301 combining", "🐱🐱🐱", "一 二 三", "中\u3000文", "(猫)", "dogs", "playing", "x" * 101, "x" * 100,
]  # fmt: skip


@pytest.fixture(scope="module")
def cclip(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = make_chinese_clip(tmp_path_factory.mktemp("cclip") / "source")
    out = directory.parent / "cclip.safetensors"
    conversion = convert(directory, out, dtype="f32")
    return {
        "directory": directory, "file": out, "conversion": conversion,
        "model": transformers.ChineseCLIPModel.from_pretrained(str(directory)).eval(),
        "tokenizer": transformers.BertTokenizer.from_pretrained(str(directory)),
    }  # fmt: skip


def _stored(path: Path) -> dict[str, Any]:
    return json.loads(safetensors.parse(memoryview(path.read_bytes())).metadata["uform"])  # type: ignore[no-any-return]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(np.asarray(a, np.float64) * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _nearest_own(got: np.ndarray, want: np.ndarray) -> bool:
    scores = np.asarray(got, np.float64) @ (want / np.linalg.norm(want, axis=1, keepdims=True)).T
    return bool((scores.argmax(axis=1) == np.arange(len(got))).all())


def _pictures(folder: Path, shapes: list[tuple[int, int]] = SHAPES) -> list[Path]:
    rng = np.random.default_rng(7)
    paths = []
    for i, (w, h) in enumerate(shapes):
        base = rng.integers(0, 256, (max(2, h // 8), max(2, w // 8), 3), dtype=np.uint8)
        paths.append(folder / f"p{i}_{w}x{h}.png")
        Image.fromarray(base).resize((w, h), Image.Resampling.BICUBIC).save(paths[-1])
    return paths


def _text_reference(cclip: dict[str, Any], texts: list[str]) -> np.ndarray:
    inputs = cclip["tokenizer"](texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return cclip["model"].get_text_features(**inputs).pooler_output.numpy()  # type: ignore[no-any-return]


def _image_reference(model: Any, directory: Path, paths: list[Path]) -> np.ndarray:
    from transformers.models.chinese_clip.image_processing_pil_chinese_clip import ChineseCLIPImageProcessorPil

    pixels = ChineseCLIPImageProcessorPil.from_pretrained(str(directory))(images=[Image.open(p) for p in paths], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model.get_image_features(pixel_values=pixels).pooler_output.numpy()  # type: ignore[no-any-return]


def test_the_conversion_says_what_it_wrote(cclip: dict[str, Any]) -> None:
    c = cclip["conversion"]
    assert (c.family, c.architecture) == ("chinese_clip", "ChineseCLIPModel")
    assert any("tokenizer.json made from vocab.txt" in n and "equal to BertTokenizer" in n for n in c.notes)


def test_texts_equal_get_text_features(cclip: dict[str, Any]) -> None:
    from uform.plugins.text import TextEncodeStats

    want = _text_reference(cclip, TEXTS)
    stats = TextEncodeStats()
    with uform.Model.load_ram(cclip["file"], quantization=Scalar.F32) as model:
        got = np.asarray(model.text_encode(TEXTS, Arena(), stats=stats).embeddings)
    assert _cos(got, want).min() >= 0.99999
    assert _nearest_own(got, want)
    assert stats.truncated_items == 1  # the 700 Han characters, cut at 512 tokens as truncation=True cuts them


def test_images_equal_get_image_features_with_a_square_resize(cclip: dict[str, Any], tmp_path: Path) -> None:
    paths = _pictures(tmp_path)
    want = _image_reference(cclip["model"], cclip["directory"], paths)
    with uform.Model.load_ram(cclip["file"], quantization=Scalar.F32) as model:
        got = np.asarray(model.image_encode([str(p) for p in paths], Arena()).embeddings)
    assert _cos(got, want).min() >= 0.99999
    assert _nearest_own(got, want)
    assert _stored(cclip["file"])["towers"]["image"]["resize"] == "square"


@pytest.mark.parametrize("quantization,bound,mean", [(Scalar.BF16, 0.9999, 0.9999), (Scalar.E4M3, 0.98, 0.995)])
def test_bf16_and_e4m3_stay_within_the_bounds_of_uforms_towers(cclip: dict[str, Any], tmp_path: Path, quantization: Scalar, bound: float, mean: float) -> None:
    paths = _pictures(tmp_path)
    want_text, want_image = _text_reference(cclip, TEXTS), _image_reference(cclip["model"], cclip["directory"], paths)
    with uform.Model.load_ram(cclip["file"], quantization=quantization) as model:
        for got, want in ((model.text_encode(TEXTS, Arena()).embeddings, want_text), (model.image_encode([str(p) for p in paths], Arena()).embeddings, want_image)):
            cos = _cos(np.asarray(got), want)
            assert cos.min() >= bound and cos.mean() >= mean


def test_token_ids_equal_berttokenizers(cclip: dict[str, Any]) -> None:
    """The file's tokenizer, truncating at the tower's context (512), gives the ids of transformers'
    BertTokenizer (the fast one AutoTokenizer picks) and of the Python BertTokenizerLegacy."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    from uform.plugins.media.text import HeldTokenizer

    held = HeldTokenizer(safetensors.parse(memoryview(cclip["file"].read_bytes())).metadata["tokenizer"], 512, len(vocabulary()), "towers.text")
    ours = [row.tolist() for row in held.encode(MORE_TEXTS).ids]
    slow = BertTokenizerLegacy.from_pretrained(str(cclip["directory"]))
    for theirs in (cclip["tokenizer"], slow):
        want = [theirs(t, truncation=True, max_length=512)["input_ids"] for t in MORE_TEXTS]
        assert {t: (o, w) for t, o, w in zip(MORE_TEXTS, ours, want) if o != w} == {}
    unk, cls, sep = (slow.convert_tokens_to_ids(t) for t in ("[UNK]", "[CLS]", "[SEP]"))
    assert ours[MORE_TEXTS.index("x" * 101)] == [cls, unk, sep]  # a word past 100 characters is [UNK]
    assert ours[MORE_TEXTS.index("playing")] == [cls, *slow.convert_tokens_to_ids(["play", "##ing"]), sep]
    assert len(ours[MORE_TEXTS.index("猫" * 600)]) == 512 and ours[MORE_TEXTS.index("猫" * 600)][-1] == sep


def test_a_center_crop_processor_is_clips_shorter_side_and_crop(tmp_path: Path) -> None:
    """transformers' defaults (no preprocessor_config.json): the shorter side to the size, the central square."""
    directory = make_chinese_clip(tmp_path / "crop", SMALL, processor={"do_center_crop": True, "size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}})
    convert(directory, tmp_path / "crop.safetensors", dtype="f32")
    paths = _pictures(tmp_path, [(32, 32), (48, 32), (32, 71), (64, 45)])
    want = _image_reference(transformers.ChineseCLIPModel.from_pretrained(str(directory)).eval(), directory, paths)
    with uform.Model.load_ram(tmp_path / "crop.safetensors", quantization=Scalar.F32) as model:
        got = np.asarray(model.image_encode([str(p) for p in paths], Arena()).embeddings)
    assert _cos(got, want).min() >= 0.99999
    assert _stored(tmp_path / "crop.safetensors")["towers"]["image"]["resize"] == "shorter_side_crop"


def test_the_server_index_and_export_work_on_it(cclip: dict[str, Any], tmp_path: Path) -> None:
    import httpx
    import onnxruntime as ort
    import tokenizers

    from serving import thread_server
    from uform.cli import main
    from uform.index import Index
    from uform.serve import ServeConfig

    folder = tmp_path / "pictures"
    folder.mkdir()
    paths = _pictures(folder, SHAPES[:3])
    texts = ["一只猫的照片", "红色的大狗在海滩上跑"]
    with uform.Model.load_ram(cclip["file"]) as model:
        want = np.asarray(model.text_encode(texts, Arena()).embeddings)
        rows = np.asarray(model.image_encode([str(p) for p in paths], Arena()).embeddings)
        with thread_server(model, ServeConfig(model_id="cclip")) as (url, _):
            answer = httpx.post(url + "/v1/embeddings", json={"input": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    np.testing.assert_array_equal(np.array([d["embedding"] for d in answer.json()["data"]], np.float32), want)
    with Index(tmp_path / "pictures.index", checkpoint=str(cclip["file"])) as index:
        index.update([folder])
        hits = index.search(texts[0], k=3, modalities=["image"])
    assert [Path(h.path).name for h in hits] == [paths[i].name for i in np.argsort(-(rows @ want[0]))]
    out = tmp_path / "exported"
    assert main(["export", str(cclip["file"]), str(out), "-q"]) == 0
    ids = tokenizers.Tokenizer.from_file(str(out / "text.tokenizer.json")).encode(texts[1]).ids
    got = ort.InferenceSession(str(out / "text.onnx")).run(None, {"bytes": np.array([ids], np.int64), "lengths": np.array([len(ids)], np.int64)})[0]
    assert _cos(got, want[1:]).min() >= 0.99999


def _source(cclip: dict[str, Any], tmp_path: Path) -> Path:
    source = tmp_path / "source"
    shutil.copytree(cclip["directory"], source, ignore=shutil.ignore_patterns("model.safetensors"))
    (source / "model.safetensors").symlink_to(cclip["directory"] / "model.safetensors")
    return source


@pytest.mark.parametrize(
    "file,edit,message",
    [
        ("preprocessor_config.json", lambda c: c.update(size={"shortest_edge": 224}), r"preprocessor_config\.json: size \{'shortest_edge': 224\} without a center crop is not supported"),
        ("tokenizer_config.json", lambda c: c.update(unk_token="[NOPE]"), r"vocab\.txt: the unk_token '\[NOPE\]' is not in the vocabulary"),
        ("tokenizer_config.json", lambda c: c.update(do_basic_tokenize=False), r"tokenizer_config\.json: do_basic_tokenize false is not supported"),
        ("config.json", lambda c: c["text_config"].update(position_embedding_type="relative_key"), r"text_config: position_embedding_type 'relative_key' is not supported"),
    ],
)
def test_what_uform_cannot_run_is_refused_by_name_and_nothing_is_written(cclip: dict[str, Any], tmp_path: Path, file: str, edit: Any, message: str) -> None:
    source = _source(cclip, tmp_path)
    cfg = json.loads((source / file).read_text())
    edit(cfg)
    (source / file).write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match=message):
        convert(source, tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


def test_a_checkpoints_text_pooler_is_left_out_as_get_text_features_leaves_it(cclip: dict[str, Any], tmp_path: Path) -> None:
    """Some checkpoints carry ``text_model.pooler`` (a BERT's); ChineseCLIPModel builds none and loads it nowhere."""
    from safetensors.numpy import load_file, save_file

    source = tmp_path / "source"
    shutil.copytree(cclip["directory"], source)
    tensors = load_file(str(source / "model.safetensors"))
    tensors |= {"text_model.pooler.dense.weight": np.zeros((768, 768), np.float32), "text_model.pooler.dense.bias": np.zeros(768, np.float32)}
    save_file(tensors, str(source / "model.safetensors"), metadata={"format": "pt"})
    conversion = convert(source, tmp_path / "out.safetensors", dtype="f32")
    assert any("text_model.pooler left out" in n for n in conversion.notes)
    with uform.Model.load_ram(tmp_path / "out.safetensors") as a, uform.Model.load_ram(cclip["file"]) as b:
        np.testing.assert_array_equal(a.text_encode(TEXTS[:3], Arena()).embeddings, b.text_encode(TEXTS[:3], Arena()).embeddings)


def test_a_pytorch_bin_source_with_buffers_and_sub_config_dicts_converts_alike(cclip: dict[str, Any], tmp_path: Path) -> None:
    """A source as a transformers 4 of 2022 wrote it: ``pytorch_model.bin`` holding the embeddings'
    ``position_ids`` and ``token_type_ids`` buffers, and a config.json whose sub-configs are
    ``text_config_dict`` and ``vision_config_dict`` (``ChineseCLIPConfig`` builds from those, the
    ``*_config`` left at the defaults): the same file's tensors and config."""
    from safetensors.numpy import load_file

    source = tmp_path / "source"
    shutil.copytree(cclip["directory"], source, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = {k: torch.from_numpy(v.copy()) for k, v in load_file(str(cclip["directory"] / "model.safetensors")).items()}
    tensors |= {
        "text_model.embeddings.position_ids": torch.arange(512)[None], "text_model.embeddings.token_type_ids": torch.zeros(1, 512, dtype=torch.long),
        "vision_model.embeddings.position_ids": torch.arange(197)[None],
    }  # fmt: skip
    torch.save(tensors, source / "pytorch_model.bin")
    cfg = json.loads((source / "config.json").read_text())
    cfg |= {"text_config_dict": cfg.pop("text_config"), "vision_config_dict": cfg.pop("vision_config"), "text_config": {"hidden_size": 8}}
    (source / "config.json").write_text(json.dumps(cfg))
    convert(source, tmp_path / "out.safetensors", dtype="f32")
    ours, theirs = (safetensors.parse(memoryview(p.read_bytes())) for p in (tmp_path / "out.safetensors", cclip["file"]))
    assert _stored(tmp_path / "out.safetensors")["towers"] == _stored(cclip["file"])["towers"]
    assert {n: (e.dtype, e.shape) for n, e in ours.entries.items()} == {n: (e.dtype, e.shape) for n, e in theirs.entries.items()}
    with uform.Model.load_ram(tmp_path / "out.safetensors") as a, uform.Model.load_ram(cclip["file"]) as b:
        np.testing.assert_array_equal(a.text_encode(TEXTS[:3], Arena()).embeddings, b.text_encode(TEXTS[:3], Arena()).embeddings)


def test_a_source_with_its_own_tokenizer_json_gives_the_same_ids(cclip: dict[str, Any], tmp_path: Path) -> None:
    """A source saved by transformers' fast BertTokenizer (a tokenizer.json beside vocab.txt) is taken as it is."""
    source = _source(cclip, tmp_path)
    cclip["tokenizer"].save_pretrained(str(source))
    assert (source / "tokenizer.json").is_file()
    conversion = convert(source, tmp_path / "out.safetensors", dtype="f32")
    assert not any("made from vocab.txt" in n for n in conversion.notes)
    with uform.Model.load_ram(tmp_path / "out.safetensors") as a, uform.Model.load_ram(cclip["file"]) as b:
        np.testing.assert_array_equal(a.text_encode(MORE_TEXTS, Arena()).embeddings, b.text_encode(MORE_TEXTS, Arena()).embeddings)


def test_uform_convert_help_names_the_families_it_converts(capsys: pytest.CaptureFixture[str]) -> None:
    from uform.cli import main

    assert main(["convert", "--help"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "Convert a CLIP, SigLIP, Chinese-CLIP or CLAP checkpoint into one uform file" in said


def test_label_probabilities_of_a_picture_equal_logits_per_image(cclip: dict[str, Any], tmp_path: Path) -> None:
    from transformers.models.chinese_clip.image_processing_pil_chinese_clip import ChineseCLIPImageProcessorPil

    labels = ["杰尼龟", "妙蛙种子", "小火龙", "皮卡丘"]
    paths = _pictures(tmp_path, SHAPES[:2])
    inputs = cclip["tokenizer"](labels, padding=True, return_tensors="pt")
    pixels = ChineseCLIPImageProcessorPil.from_pretrained(str(cclip["directory"]))(images=[Image.open(p) for p in paths], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        want = cclip["model"](**inputs, pixel_values=pixels).logits_per_image.softmax(-1).numpy()
    with uform.Model.load_ram(cclip["file"], quantization=Scalar.F32) as model:
        got = model.label_probabilities(model.image_encode([str(p) for p in paths], Arena()).embeddings, labels)
    np.testing.assert_allclose(got, want, atol=1e-5)
