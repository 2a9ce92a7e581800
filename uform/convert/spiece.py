"""SigLIP's SentencePiece tokenizer (``spiece.model``) as a ``tokenizer.json``.

transformers' ``SiglipTokenizer`` is a slow, Python tokenizer: it lower-cases the text,
removes ASCII punctuation (Python's ``string.punctuation``), folds whitespace runs to one
space and strips the end, then runs SentencePiece on ``"▁" + text`` and appends ``</s>``.
Here the same steps are written as ``tokenizers`` normalizers before the SentencePiece
model's own (its precompiled character map, transformers' public converter reads it), and
the result is kept only where it gives ``SiglipTokenizer``'s ids on :data:`CHECK_TEXTS` (the
conversion is refused otherwise). Needs transformers, sentencepiece and protobuf at convert
time, never at run time.
"""

from __future__ import annotations

import functools
import re
import string
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .sources import ConvertError

CHECK_TEXTS = [
    "a photo of a cat", "A Photo Of A DOG!", "two dogs, running; on the beach...", "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\nand    runs", "naïve café déjà vu — crème brûlée", "ÀÉÎÕÜ ß æ ø å ñ ç", "日本語のテキスト",
    "emoji 🐱🐶 🎉", "(parens) [brackets] {braces} <angles> \"quotes\" 'single' `back`", "user@example.com 3.14 1,000",
    "can't won't", "", " ", "x", "ＦＵＬＬＷＩＤＴＨ！", "\u00a0non-breaking\u2003em space", "under_score and ▁ mark",
]  # fmt: skip


@functools.cache
def _python_whitespace() -> str:
    """A regex class of what Python's ``\\s`` matches in a str pattern (``re.sub(r"\\s+", ...)``):
    found by the pattern itself over every code point at once, in one string (a match per code
    point took 0.7 s)."""
    every = np.arange(sys.maxunicode + 1, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    spaces = re.findall(r"\s", every)
    return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in spaces) + "]+"


def siglip_tokenizer(directory: Path, notes: list[str]) -> str:
    path = directory / "spiece.model"
    try:
        from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors
        from transformers import SiglipTokenizer
        from transformers.convert_slow_tokenizer import SpmConverter
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as exc:
        raise ConvertError(
            f"{path}: making a tokenizer.json from SigLIP's SentencePiece model needs transformers, sentencepiece and protobuf "
            f"at convert time (pip install transformers sentencepiece protobuf): {exc}"
        ) from None
    try:
        slow = SiglipTokenizer.from_pretrained(str(directory))
        proto: Any = getattr(sentencepiece_model_pb2, "ModelProto")()
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # noqa: BLE001 - the libraries' errors vary
        raise ConvertError(f"{path}: the SentencePiece model does not load ({type(exc).__name__}: {exc})") from None
    if proto.trainer_spec.model_type != 1:  # UNIGRAM
        raise ConvertError(f"{path}: a SentencePiece model of type {proto.trainer_spec.model_type} (not unigram) is not supported")
    vocab = [(piece.piece, piece.score) for piece in proto.pieces]
    build: Any = SpmConverter.build_tokenizer_from_spm_proto
    built: Any = build(proto, vocab)
    if built is None:
        raise ConvertError(f"{path}: transformers' converter gives no tokenizer for this SentencePiece model")
    tok: Any = Tokenizer.from_str(built.to_str())
    punctuation = "[" + re.escape(string.punctuation) + "]"
    steps: list[Any] = [normalizers.Replace("▁", " ")]  # SiglipTokenizer.tokenize reads the marker as a space
    steps += [normalizers.Lowercase()] if getattr(slow, "do_lower_case", True) else []
    steps += [
        normalizers.Replace(Regex(punctuation), ""),
        normalizers.Replace(Regex(_python_whitespace()), " "),
        normalizers.Replace(Regex("^ +| +$"), ""),
    ]
    charsmap = proto.normalizer_spec.precompiled_charsmap
    if charsmap:
        steps.append(normalizers.Precompiled(charsmap))
    steps += [normalizers.Replace(Regex("^ +| +$"), ""), normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(" ", "▁"), normalizers.Prepend("▁")]
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    eos = slow.eos_token
    eos_id = slow.convert_tokens_to_ids(eos)
    tok.post_processor = processors.TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, eos_id)])
    specials = [t for t in slow.all_special_tokens]
    tok.add_special_tokens(specials)
    for text in CHECK_TEXTS:
        want = slow(text)["input_ids"]
        got = tok.encode(text).ids
        if want != got:
            raise ConvertError(
                f"{path}: the tokenizer.json made from it gives other ids than SiglipTokenizer for {text!r} "
                f"({got} against {want}); add a tokenizer.json to the source"
            )
    notes.append(f"tokenizer.json made from spiece.model (SiglipTokenizer's canonicalisation as normalizers), equal to SiglipTokenizer on {len(CHECK_TEXTS)} texts")
    return str(tok.to_str())
