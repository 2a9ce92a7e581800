"""Where a converted CLIP pools its text (``towers.text.end_token``): transformers' CLIP at the
first ``eos_token_id`` (or, where that is 2, the first of the row's largest id), open_clip at
``argmax``; uform pooled the row's last token, so a text holding the end token's own string
(``a <|endoftext|> b``: the end token in the middle) got cosine 0.96 to transformers'."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf_models
import uform
from uform import Arena, Scalar
from uform.convert import convert
from uform.core import safetensors
from uform.core.errors import CheckpointError
from uform.plugins.media.text import ended

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TEXTS = ["a <|endoftext|> b", "a photo <|endoftext|> of a dog <|startoftext|> x", "<|endoftext|>", "<|endoftext|>" * 90, "a dog", ""]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_models.make_clip(tmp_path_factory.mktemp("clip") / "clip")


def _reference(directory: Path, texts: list[str]) -> np.ndarray:
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.CLIPModel.from_pretrained(directory).eval()
    with torch.no_grad():
        out = model.get_text_features(**tok(texts, padding=True, truncation=True, max_length=77, return_tensors="pt"))
    want = np.asarray(getattr(out, "pooler_output", out))
    return want / np.linalg.norm(want, axis=1, keepdims=True)


@pytest.mark.parametrize("eos", [49407, 2], ids=["eos_token_id", "legacy argmax"])
def test_the_text_is_pooled_where_transformers_pools_it(clip_dir: Path, tmp_path: Path, eos: int) -> None:
    directory = tmp_path / "clip"
    shutil.copytree(clip_dir, directory)
    cfg = json.loads((directory / "config.json").read_text())
    cfg["text_config"]["eos_token_id"] = eos
    (directory / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "clip.safetensors"
    convert(directory, out, dtype="f32")
    want = _reference(directory, TEXTS)
    with uform.Model.load_ram(out, quantization=Scalar.F32) as m:
        got = np.asarray(m.text_encode(TEXTS, Arena()).embeddings)
    cos = (got * want).sum(1)
    assert [t[:40] for t, c in zip(TEXTS, cos) if c < 0.99999] == []
    written = json.loads(safetensors.parse(memoryview(out.read_bytes())).metadata["uform"])["towers"]["text"]
    assert written["end_token"] == ("max" if eos == 2 else 49407)


def test_rows_are_cut_after_their_first_end_token() -> None:
    rows = [np.array([5, 9, 3, 9, 1]), np.array([5, 3, 1]), np.array([], np.int64), np.array([9, 9])]
    cut, lengths = ended(rows, 9)
    assert [r.tolist() for r in cut] == [[5, 9], [5, 3, 1], [], [9]] and lengths.tolist() == [2, 3, 0, 1]
    cut, lengths = ended(rows, "max")
    assert [r.tolist() for r in cut] == [[5, 9], [5], [], [9]] and lengths.tolist() == [2, 1, 0, 1]


@pytest.mark.parametrize(
    "change,message",
    [
        ({"end_token": "first"}, r"towers.text.end_token: expected 'last', 'max' or a token id below vocab_size 49408, got 'first'"),
        ({"end_token": 49408}, r"towers.text.end_token: expected 'last', 'max' or a token id below vocab_size 49408, got 49408"),
        ({"end_token": True}, r"got True"),
        ({"end_token": "max", "mask": "none"}, r"towers.text.end_token: 'max' needs tokenizer 'tokenizer.json', pooling 'last_token' and mask 'causal'"),
    ],
)
def test_a_bad_end_token_is_refused_by_name(clip_dir: Path, tmp_path: Path, change: dict[str, Any], message: str) -> None:
    out = tmp_path / "clip.safetensors"
    convert(clip_dir, out, dtype="f32")
    c = safetensors.parse(memoryview(out.read_bytes()))
    config = json.loads(c.metadata["uform"])
    config["towers"]["text"].update(change)
    bad = tmp_path / "bad.safetensors"
    safetensors.write(bad, {n: np.array(c.array(n)) for n in c.entries}, dict(c.metadata) | {"uform": json.dumps(config)})
    with pytest.raises(CheckpointError, match=message):
        uform.Model.load_ram(bad)


def _with_end(path: Path, out: Path, end: Any) -> Path:
    c = safetensors.parse(memoryview(path.read_bytes()))
    config = json.loads(c.metadata["uform"])
    config["towers"]["text"]["end_token"] = end
    safetensors.write(out, {n: np.array(c.array(n)) for n in c.entries}, dict(c.metadata) | {"uform": json.dumps(config)})
    return out


def main() -> None:
    """The figures docs/models.md gives (``python tests/test_converted_end_token.py``): text
    cosine and max abs difference to transformers' CLIP (TEXTS) and open_clip (its SPECIALS),
    pooling the row's last token (``end_token`` "last", as before) and as converted."""
    import tempfile

    import open_clip

    from test_converted_open_clip import SPECIALS

    def row(name: str, got: np.ndarray, want: np.ndarray) -> None:
        cos = (got * want).sum(1)
        print(f"{name}: min cos {cos.min():.6f}, max abs difference {np.abs(got - want).max():.3g}")

    with tempfile.TemporaryDirectory() as tmp:
        for eos in (49407, 2):
            directory = hf_models.make_clip(Path(tmp) / f"clip{eos}")
            cfg = json.loads((directory / "config.json").read_text())
            cfg["text_config"]["eos_token_id"] = eos
            (directory / "config.json").write_text(json.dumps(cfg))
            out = Path(tmp) / f"clip{eos}.safetensors"
            convert(directory, out, dtype="f32")
            want = _reference(directory, TEXTS)
            for end, path in (("last", _with_end(out, Path(tmp) / "last.safetensors", "last")), ("as converted", out)):
                with uform.Model.load_ram(path, quantization=Scalar.F32) as m:
                    row(f"transformers CLIP, eos_token_id {eos}, end_token {end}", np.asarray(m.text_encode(TEXTS, Arena()).embeddings), want)
        directory, model = hf_models.make_open_clip(Path(tmp) / "oc")
        out = Path(tmp) / "oc.safetensors"
        convert(directory, out, dtype="f32")
        with torch.no_grad():
            want = model.encode_text(open_clip.get_tokenizer("ViT-B-32")(SPECIALS)).numpy()
        want /= np.linalg.norm(want, axis=1, keepdims=True)
        for end, path in (("last", _with_end(out, Path(tmp) / "last.safetensors", "last")), ("as converted", out)):
            with uform.Model.load_ram(path, quantization=Scalar.F32) as m:
                row(f"open_clip, end_token {end}", np.asarray(m.text_encode(SPECIALS, Arena()).embeddings), want)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    main()
