"""Converted CLIP, SigLIP and SigLIP 2 tokenizers on long texts and mixed case: the ids equal
transformers' (``truncation=True, max_length=context``) for texts of up to a megabyte, and a
long text is read only as far as its kept tokens need (docs/models.md, "Texts")."""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence
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

from uform.convert import convert  # noqa: E402
from uform.core.safetensors import parse  # noqa: E402
from uform.plugins.media.text import HeldTokenizer, read  # noqa: E402

FAMILIES = ["clip", "siglip", "siglip2"]


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    family = request.param
    d = tmp_path_factory.mktemp(family) / "source"
    if family == "clip":
        hf_models.make_clip(d)
    else:
        hf_models.make_siglip(d, gemma=family == "siglip2")
    out = d.parent / f"{family}.safetensors"
    assert convert(d, out, dtype="f32").family == family
    return family, d, out


def reference(family: str, directory: Path) -> Any:
    """transformers' tokenizer of the family: SigLIP 2's is Siglip2Tokenizer (lower-casing)."""
    from transformers import AutoTokenizer, Siglip2Tokenizer

    return Siglip2Tokenizer.from_pretrained(directory) if family == "siglip2" else AutoTokenizer.from_pretrained(directory)


def held(path: Path) -> HeldTokenizer:
    container = parse(memoryview(path.read_bytes()))
    cfg = json.loads(container.metadata["uform"])["towers"]["text"]
    return read(container.metadata, cfg["context"], cfg["vocab_size"], "towers.text")


@functools.cache
def long_texts() -> list[str]:
    """Random words, CJK, emoji, whitespace runs and punctuation, from 1 KB to 100 KB, and texts
    whose tokens come late or never (a long run of spaces or of what SigLIP removes), and one word
    of a megabyte."""
    rng = random.Random(5)
    pieces = [
        lambda: rng.choice(["the", "Quick", "brown", "FOX", "café", "naïve", "Dog's", "running"]),
        lambda: "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 6))),
        lambda: rng.choice(["🐱", "👍🏽", "👨‍👩‍👧", "🎉"]),
        lambda: rng.choice([" " * rng.randint(2, 40), "\t\n", "\u3000", "\u00a0", "\r\n\r\n"]),
        lambda: rng.choice(["!?", "...", "-", "(x)", "ＦＵＬＬ"]),
    ]
    texts = []
    for size in (1_000, 1_300, 2_500, 5_000, 20_000, 100_000):
        out, length = [], 0
        while length < size:
            out.append(rng.choice(pieces)() + (" " if rng.random() < 0.6 else ""))
            length += len(out[-1])
        texts.append("".join(out))
    return texts + [" " * 100_000 + "a Dog", "!?" * 20_000 + " a cat", "日本" * 30_000, "🐱" * 25_000, "x " * 50_000, "abcdefghij" * 100_000]


class Reads:
    """A held tokenizer's library tokenizer, counting the characters it is given."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.chars = inner, 0

    def encode_batch(self, texts: Sequence[str]) -> Any:
        self.chars += sum(map(len, texts))
        return self.inner.encode_batch(texts)


def test_long_texts_give_transformers_ids_reading_what_is_kept(converted: tuple[str, Path, Path]) -> None:
    family, directory, path = converted
    tokenizer = held(path)
    texts = long_texts()
    want = reference(family, directory)(texts, truncation=True, max_length=tokenizer.context)["input_ids"]
    spy = Reads(tokenizer._cut)
    tokenizer._cut = spy
    got = tokenizer.encode(texts, count=False)
    assert [row.tolist() for row in got.ids] == want
    assert got.kept.tolist() == [len(row) for row in want]
    assert [row.tolist() for row in tokenizer.encode(texts[-1:] * 2, count=False).ids] == want[-1:] * 2
    # the megabyte word is read in its first prefixes only: 16 and 64 characters a context token
    spy.chars = 0
    tokenizer.encode([texts[-1]], count=False)
    assert spy.chars == (16 + 64) * tokenizer.context


def test_a_long_text_embeds_the_same_with_stats(converted: tuple[str, Path, Path]) -> None:
    """With stats, as without, a long text is read only as far as its kept tokens need: the
    same ids, the same embeddings (stats read every text whole: a 1.15 MB text's tokenizing took
    seconds, where the call without stats took milliseconds)."""
    _, _, path = converted
    texts = long_texts()[2:5] + ["a dog", "Ünïcödé " * 2000]
    with uform.Model.load_ram(path, quantization=Scalar.F32) as m:
        bounded = m.text_encode(texts, Arena()).embeddings
        stats = uform.TextEncodeStats()
        counted = m.text_encode(texts, Arena(), stats=stats).embeddings
    assert np.array_equal(bounded, counted)
    assert stats.truncated_items == 4


def test_stats_count_the_cut_in_the_part_read(converted: tuple[str, Path, Path]) -> None:
    """A text read whole has its cut tokens counted exactly (transformers' untruncated length
    less the context); a text read in part (its first 16, then 64 characters a context token)
    counts the tokens cut in that part, and ``truncated_unread_items`` counts it."""
    family, directory, path = converted
    context = held(path).context
    short, long = "word, " * 150, "a dog on a beach, " * 64_000  # 900 characters: read whole; 1.15 MB: read in part
    ref = reference(family, directory)
    lengths = [len(row) for row in ref([short, long[: 64 * context]], truncation=False)["input_ids"]]
    with uform.Model.load_ram(path, quantization=Scalar.F32) as m:
        stats = uform.TextEncodeStats()
        m.text_encode([short, "a dog", long], Arena(), stats=stats)
    assert (stats.truncated_items, stats.truncated_unread_items) == (2, 1)
    assert stats.truncated_tokens == lengths[0] - context + lengths[1] - context
    assert stats.tokens == 2 * context + len(ref(["a dog"])["input_ids"][0])


def test_mixed_case_texts_are_lower_cased_as_the_family_tokenizer_does(converted: tuple[str, Path, Path]) -> None:
    """SigLIP 2 was trained on lower-cased texts: its file lower-cases as transformers'
    Siglip2Tokenizer does (AutoTokenizer gives GemmaTokenizer, which does not); SigLIP (v1)
    lower-cases too; CLIP's BPE lower-cases in its normalizer."""
    family, directory, path = converted
    texts = ["A Photo Of A DOG", "ÀÉÎÕÜ Straße", "MiXeD cAsE wItH 123", "ΑΘΗΝΑ и МОСКВА"]
    tokenizer = held(path)
    want = reference(family, directory)(texts, truncation=True, max_length=tokenizer.context)["input_ids"]
    assert [row.tolist() for row in tokenizer.encode(texts).ids] == want
    with uform.Model.load_ram(path, quantization=Scalar.F32) as m:
        upper = m.text_encode(texts, Arena()).embeddings
        lower = m.text_encode([t.lower() for t in texts], Arena()).embeddings
    assert np.array_equal(upper, lower)


def test_a_siglip2_tokenizer_save_converts_as_siglip2(tmp_path: Path) -> None:
    """A SigLIP 2 directory whose tokenizer transformers' Siglip2Tokenizer saved (tokenizer_class
    Siglip2Tokenizer, its tokenizer.json lower-casing already) is SigLIP 2: recorded as such, the
    left-padding note given, lower-cased once, ids equal Siglip2Tokenizer's (it was recorded as
    siglip and its padding went unmentioned)."""
    from transformers import Siglip2Tokenizer

    d = hf_models.make_siglip(tmp_path / "source", gemma=True)
    Siglip2Tokenizer.from_pretrained(d).save_pretrained(d)
    assert json.loads((d / "tokenizer_config.json").read_text())["tokenizer_class"] == "Siglip2Tokenizer"
    done = convert(d, tmp_path / "s2.safetensors", dtype="f32")
    assert done.family == "siglip2"
    assert [n for n in done.notes if "lower-cased" in n] == [] and any("pads on the left" in n for n in done.notes)
    container = parse(memoryview((tmp_path / "s2.safetensors").read_bytes()))
    assert json.loads(container.metadata["tokenizer"])["normalizer"] == json.loads((d / "tokenizer.json").read_text())["normalizer"]
    texts = ["A Photo Of A DOG", "MiXeD cAsE wItH 123"]
    tokenizer = held(tmp_path / "s2.safetensors")
    want = Siglip2Tokenizer.from_pretrained(d)(texts, truncation=True, max_length=tokenizer.context)["input_ids"]
    assert [row.tolist() for row in tokenizer.encode(texts).ids] == want
