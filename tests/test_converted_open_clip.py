"""open_clip's text cleaning in a converted open_clip file (``towers.text.clean``): open_clip's
tokenizers run ftfy's ``fix_text``, unescape HTML entities twice, fold whitespace and (its
SimpleTokenizer) lower-case before the BPE; the converted file's tokenizer.json (transformers'
CLIP tokenizer) does only the last two, so without the cleaning 21 of these 55 texts got other
ids than open_clip's (cosine down to 0.25 against ``encode_text``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf_models
import uform
from uform import Arena, Scalar
from uform.convert import convert
from uform.core import safetensors
from uform.core.errors import CheckpointError, UnsupportedError
from uform.plugins.media.text import HeldTokenizer, read

open_clip = pytest.importorskip("open_clip")
torch = pytest.importorskip("torch")
pytest.importorskip("ftfy")

# What ftfy and the HTML unescaping rewrite: mojibake, entities (doubly escaped too), curly
# quotes, fullwidth and halfwidth forms, ligatures, control and terminal escapes, a byte-order
# mark, C1 controls read as Windows-1252, Unicode whitespace Python's str.split folds
CLEANED = hf_models.CORPUS + [
    "caf\u00c3\u00a9 cr\u00c3\u00a8me", "don\u00e2\u20ac\u2122t stop", "the \u00e2\u20ac\u0153quoted\u00e2\u20ac\x9d word",
    "Tom &amp; Jerry", "5 &lt; 6 &gt; 4", "&quot;hi&quot; &#39;there&#39; &#x263a;", "&amp;amp;", "fish &amp chips",
    "&nbsp;space", "<b>bold</b> &amp; more", "it\u2019s \u201cquoted\u201d", "\u2018single\u2019",
    "\uff46\uff55\uff4c\uff4c width \uff1a", "\ufb01sh \ufb02y", "\uff8a\uff9d\uff76\uff78 \uff76\uff80\uff76\uff85",
    "ctrl\x1c\x1d\x1e\x1fchars", "tab\x0bvt\x0cff", "\x85nel", "bom\ufeffin", "\x1b[31mred\x1b[0m", "e\u0301 combining",
    "line\u2028sep\u2029para", "nbsp\u00a0here", "zero\u200bwidth", "\u3000ideographic space", "\r\nwindows\rmac",
]


def _ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """open_clip's ids, its zero padding taken off."""
    return [[int(i) for i in row if i] for row in tokenizer(texts).numpy()]


def _held(path: Path) -> tuple[dict[str, Any], HeldTokenizer]:
    container = safetensors.parse(memoryview(path.read_bytes()))
    cfg = json.loads(container.metadata["uform"])["towers"]["text"]
    return cfg, read(container.metadata, cfg["context"], cfg["vocab_size"], "towers.text", cfg.get("clean", "none"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    tmp = tmp_path_factory.mktemp("oc")
    directory, model = hf_models.make_open_clip(tmp / "oc")
    out = tmp / "oc.safetensors"
    convert(directory, out, dtype="f32")
    return model, out


def _rows(model: Any, path: Path, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """uform's unit rows of ``texts`` and open_clip's ``encode_text`` of its own ids, made unit."""
    with torch.no_grad():
        reference = model.encode_text(open_clip.get_tokenizer("ViT-B-32")(texts)).numpy()
    with uform.Model.load_ram(path, quantization=Scalar.F32) as m:
        rows = np.asarray(m.text_encode(texts, Arena()).embeddings)
    return rows, reference / np.linalg.norm(reference, axis=1, keepdims=True)


def _embeddings(model: Any, path: Path, texts: list[str]) -> np.ndarray:
    """Each text's cosine between uform's row and open_clip's."""
    rows, reference = _rows(model, path, texts)
    return np.asarray((rows * reference).sum(1))


def test_texts_get_open_clips_ids_and_embeddings_after_its_cleaning(converted: tuple[Any, Path]) -> None:
    model, path = converted
    cos = _embeddings(model, path, CLEANED)
    assert [t for t, c in zip(CLEANED, cos) if c < 0.99999] == []
    cfg, held = _held(path)
    assert cfg["clean"] == "lower"
    want = _ids(open_clip.get_tokenizer("ViT-B-32"), CLEANED)
    assert [t for t, row, ids in zip(CLEANED, held.encode(CLEANED).ids, want) if list(map(int, row)) != ids] == []
    assert [list(map(int, row)) for row in held.encode(CLEANED, count=False).ids] == want


def test_a_long_text_is_cleaned_in_the_part_read_as_open_clip_cleans_it_whole(converted: tuple[Any, Path]) -> None:
    """A long text is read in prefixes (docs/models.md); each prefix is cleaned, and the kept ids
    are open_clip's for the whole text, an entity cut at a prefix's end included."""
    model, path = converted
    texts = ["Tom &amp; Jerry &quot;caf\u00c3\u00a9&quot; \uff46\uff55\uff4c\uff4c " * 4000, "x" * 1231 + "&amp;" + " dog" * 200]
    assert _embeddings(model, path, texts).min() >= 0.99999
    _, held = _held(path)
    want = _ids(open_clip.get_tokenizer("ViT-B-32"), texts)
    assert [list(map(int, row)) for row in held.encode(texts, count=False).ids] == want
    assert [list(map(int, row)) for row in held.encode(texts, count=True).ids] == want


# open_clip's SimpleTokenizer names its special tokens <start_of_text> and <end_of_text>
# (matched in the cleaned text, so in any case); CLIP's tokenizer.json <|startoftext|> and <|endoftext|>
SPECIALS = [
    "a <|endoftext|> b", "a <end_of_text> b", "A <START_OF_TEXT> b", "x<end_of_text>y", "<|startoftext|>",
    "<|endoftext|><|endoftext|>", "<|EndOfText|> caps", "a<|startoftext|>b<|endoftext|>c", "<end_of_text>" * 80,
]


def test_the_special_tokens_are_open_clips_names(converted: tuple[Any, Path]) -> None:
    """A text holding ``<end_of_text>`` is open_clip's end token; ``<|endoftext|>`` is plain text
    there (it was the end token in uform: 'a <|endoftext|> b' gave 5 ids, open_clip 10)."""
    _, held = _held(converted[1])
    want = _ids(open_clip.get_tokenizer("ViT-B-32"), SPECIALS)
    assert [t for t, row, ids in zip(SPECIALS, held.encode(SPECIALS).ids, want) if list(map(int, row)) != ids] == []


def test_the_text_is_pooled_at_its_first_end_token_as_open_clips_argmax(converted: tuple[Any, Path]) -> None:
    """open_clip pools the text at the first of its largest id (``argmax``: the first end token);
    uform pooled the row's last token: 'a <end_of_text> b' gave cosine 0.96 to open_clip's."""
    model, path = converted
    cos = _embeddings(model, path, SPECIALS)
    assert [t for t, c in zip(SPECIALS, cos) if c < 0.99999] == []
    assert _held(path)[0]["end_token"] == "max"


def test_an_hf_tokenizer_open_clip_folder_cleans_without_lower_casing(tmp_path: Path) -> None:
    """open_clip's HFTokenizer (``hf_tokenizer_name``) cleans with ``whitespace``: ftfy and the
    entities, no lower-casing of its own."""
    from transformers import CLIPTokenizer

    directory, _ = hf_models.make_open_clip(tmp_path / "oc")
    hf_models.clip_vocab_files(tmp_path / "bpe")
    CLIPTokenizer(str(tmp_path / "bpe" / "vocab.json"), str(tmp_path / "bpe" / "merges.txt")).save_pretrained(directory)
    cfg = json.loads((directory / "open_clip_config.json").read_text())
    cfg["model_cfg"]["text_cfg"]["hf_tokenizer_name"] = str(directory)
    (directory / "open_clip_config.json").write_text(json.dumps(cfg))
    convert(directory, tmp_path / "hf.safetensors", dtype="f32")
    written = safetensors.parse(memoryview((tmp_path / "hf.safetensors").read_bytes())).metadata["uform"]
    assert json.loads(written)["towers"]["text"].get("clean") == "whitespace"
    _, held = _held(tmp_path / "hf.safetensors")
    theirs = open_clip.tokenizer.HFTokenizer(str(directory), context_length=77)
    texts = ["Tom &amp; JERRY", "caf\u00c3\u00a9", "\uff46\uff55\uff4c\uff4c", "it\u2019s"]
    want = [[int(i) for i in row][: [int(i) for i in row].index(49407) + 1] for row in theirs(texts).numpy()]
    assert [list(map(int, row)) for row in held.encode(texts).ids] == want


def test_the_exported_text_tower_says_how_its_ids_are_made_and_gives_text_encodes_rows(converted: tuple[Any, Path], tmp_path: Path) -> None:
    """``uform export``'s text.json names the cleaning and the cut at the first end token; ids made
    so (held tokenizer, ``ended``) through the exported tower give ``text_encode``'s rows."""
    import onnxruntime as ort

    from uform.exporters.towers import export_towers
    from uform.plugins.media.text import ended

    _, path = converted
    out = export_towers(path, tmp_path / "towers", quantization="f32")
    said = json.loads((tmp_path / "towers" / "text.json").read_text())["preprocessing"]
    assert said.startswith("the text cleaned first as open_clip does (ftfy.fix_text, HTML entities unescaped twice, whitespace runs folded to one space, lower-cased), then token ids")
    assert "; each row cut after its first largest id; right-padded with 49407" in said
    texts = ["Tom &amp; Jerry", "a <end_of_text> b", "caf\u00c3\u00a9"]
    ids, lengths = ended(_held(path)[1].encode(texts).ids, "max")
    feed = np.full((len(ids), int(lengths.max())), 49407, np.int64)
    for i, row in enumerate(ids):
        feed[i, : len(row)] = row
    session = ort.InferenceSession(str(out["text"]), providers=["CPUExecutionProvider"])
    got = session.run(None, {"bytes": feed, "lengths": lengths})[0]
    with uform.Model.load_ram(path, quantization=Scalar.F32) as m:
        want = np.asarray(m.text_encode(texts, Arena()).embeddings)
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    assert (got * want).sum(1).min() >= 0.99999


def _rewrite(path: Path, out: Path, clean: str, tower: str = "text") -> Path:
    c = safetensors.parse(memoryview(path.read_bytes()))
    config = json.loads(c.metadata["uform"])
    config["towers"][tower]["clean"] = clean
    if tower != "text":
        config["towers"][tower]["tokenizer"] = "bytes"
    safetensors.write(out, {n: np.array(c.array(n)) for n in c.entries}, dict(c.metadata) | {"uform": json.dumps(config)})
    return out


def test_a_clean_field_uform_lacks_is_refused_by_name(converted: tuple[Any, Path], tmp_path: Path) -> None:
    bad = _rewrite(converted[1], tmp_path / "bad.safetensors", "canonicalize")
    with pytest.raises(CheckpointError, match=r"towers.text.clean: expected one of 'none', 'lower', 'whitespace', got 'canonicalize'"):
        uform.Model.load_ram(bad)


def test_cleaning_on_a_byte_level_tower_is_refused(tiny_text: Path, tmp_path: Path) -> None:
    bad = _rewrite(tiny_text, tmp_path / "bytes.safetensors", "lower")
    with pytest.raises(CheckpointError, match=r"towers.text.clean: 'lower', but a byte-level tower reads its bytes as they are"):
        uform.Model.load_ram(bad)


def test_without_ftfy_the_load_names_the_extra(converted: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ftfy", None)
    with pytest.raises(UnsupportedError, match=r"towers.text.clean: 'lower' \(open_clip's text cleaning\) needs the ftfy library: pip install 'uform\[models\]'"):
        uform.Model.load_ram(converted[1])


def main() -> None:
    """The figures docs/models.md gives: ids and text cosines against open_clip with the cleaning
    and without it (``clean`` "none"), and what it costs the tokenizer (``python tests/test_converted_open_clip.py``)."""
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as tmp:
        directory, model = hf_models.make_open_clip(Path(tmp) / "oc")
        out = Path(tmp) / "oc.safetensors"
        convert(directory, out, dtype="f32")
        for clean in ("none", "lower"):
            path = out if clean == "lower" else _rewrite(out, Path(tmp) / "none.safetensors", "none")
            rows, reference = _rows(model, path, CLEANED)
            cos = (rows * reference).sum(1)
            _, held = _held(path)
            want = _ids(open_clip.get_tokenizer("ViT-B-32"), CLEANED)
            differ = sum(list(map(int, row)) != ids for row, ids in zip(held.encode(CLEANED).ids, want))
            query, long = ["a dog on a beach"], "a dog on a beach, " * 64000
            start = time.perf_counter()
            for _ in range(2000):
                held.encode(query, count=False)
            per = (time.perf_counter() - start) / 2000
            start = time.perf_counter()
            held.encode([long], count=True)
            whole = time.perf_counter() - start
            print(f"clean {clean}: {differ}/{len(CLEANED)} texts' ids differ from open_clip's, text min cos {cos.min():.8f}, "
                  f"max abs difference {np.abs(rows - reference).max():.3g}; tokenizer: 16-character query {per * 1e6:.0f} us, 1.15 MB text read whole {whole:.2f} s")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()


def test_an_image_size_that_is_not_a_whole_number_of_patches_converts_and_equals_encode_image(tmp_path: Path) -> None:
    """open_clip's ``conv1`` (stride P, no padding) takes 4x4 patches of 8 over the first 32 of 36
    rows and columns and leaves the last 4 out: the converter writes ``patch_remainder: drop``
    (before, the file was refused: 'image_size 36, patch_size 8 ... are not supported')."""
    from v2ckpt import dumps

    geometry = {**hf_models.OPEN_CLIP_SMALL, "vision_cfg": {**hf_models.OPEN_CLIP_SMALL["vision_cfg"], "image_size": 36}}
    directory, model = hf_models.make_open_clip(tmp_path / "oc36", geometry)
    out = tmp_path / "oc36.safetensors"
    convert(directory, out, dtype="f32")
    image = dumps(out)["towers"]["image"]
    assert (image["image_size"], image["patch_size"], image["patch_remainder"]) == (36, 8, "drop")
    px = np.random.default_rng(0).integers(0, 256, (4, 36, 36, 3), dtype=np.uint8)
    x = (px.astype(np.float32) / 255 - np.float32(hf_models.CLIP_MEAN)) / np.float32(hf_models.CLIP_STD)
    with torch.no_grad():
        want = model.encode_image(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).numpy().astype(np.float64)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    edged = px.copy()
    edged[:, 32:] = 255 - edged[:, 32:]  # the 4 rows and 4 columns no patch covers
    edged[:, :, 32:] = 0
    with uform.Model.load_ram(out, quantization=Scalar.F32) as m:
        got = np.asarray(m.image_encode_pixels(list(px), Arena()).embeddings, np.float64)
        assert np.array_equal(np.asarray(m.image_encode_pixels(list(edged), Arena()).embeddings), got.astype(np.float32))
    assert (got * want).sum(1).min() >= 0.999999
    assert np.abs(got - want).max() < 1e-5
