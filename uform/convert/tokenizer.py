"""The tokenizer a converted file holds: a Hugging Face ``tokenizer.json``, checked to parse.

A source with ``tokenizer.json`` gives it as it is. A CLIP source with only the slow
tokenizer's files (``vocab.json``, ``merges.txt``) gets the fast tokenizer transformers builds
from them (transformers is needed at convert time then, never at run time). SigLIP (v1)
ships only a SentencePiece ``spiece.model``, which transformers' tokenizer canonicalises in
Python (lower case, ASCII punctuation removed, whitespace runs folded) before SentencePiece:
:mod:`uform.convert.spiece` writes the same as a ``tokenizer.json`` and keeps it only where it
gives the slow tokenizer's ids on a corpus, else the conversion is refused. A BERT source
(Chinese-CLIP) with only ``vocab.txt`` gets its WordPiece tokenizer from :mod:`uform.convert.wordpiece`,
kept the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from uform.core import jsontext

from .sources import ConvertError, read_json


def tokenizer_json(directory: Path, family: str, vocab: int, notes: list[str]) -> tuple[str, int]:
    """The tokenizer's JSON text and the pad token's id, checked against the embedding's ``vocab`` rows."""
    path = directory / "tokenizer.json"
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConvertError(f"{path}: cannot be read ({exc})") from None
    elif (directory / "spiece.model").is_file():
        from .spiece import siglip_tokenizer

        text = siglip_tokenizer(directory, notes)
    elif (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
        text = _from_transformers(directory)
        notes.append("tokenizer.json made by transformers' fast tokenizer from vocab.json and merges.txt")
    elif (directory / "vocab.txt").is_file():
        from .wordpiece import wordpiece_tokenizer

        text = wordpiece_tokenizer(directory, notes)
    else:
        raise ConvertError(f"{directory}: no tokenizer: expected tokenizer.json (or vocab.json and merges.txt, spiece.model, or vocab.txt)")
    tokenizer = parse(text, str(path))
    fits(tokenizer, vocab, str(path), "config.json text_config.vocab_size")
    return text, _pad_id(directory, tokenizer, family)


def fits(tokenizer: Any, vocab: int, where: str, why: str) -> None:
    """Every id ``tokenizer`` gives is a row of the ``vocab``-row text embedding: its token count,
    and its largest id (a vocabulary's ids need not be 0…N-1: a token numbered past the
    embedding converted, and its first text failed in ONNX Runtime's Gather)."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab:
        raise ConvertError(f"{where}: the tokenizer has {size} tokens, more than the {vocab} rows of the text embedding ({why})")
    token, top = max(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1], default=("", -1))
    if top >= vocab:
        raise ConvertError(f"{where}: the tokenizer's token {token!r} has id {top}, past the {vocab} rows of the text embedding ({why})")


def parse(text: str, where: str) -> Any:
    """A ``tokenizers.Tokenizer`` of ``text``; a file that does not parse is refused naming it."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConvertError(f"{where}: checking the tokenizer needs the tokenizers library: pip install 'uform[convert]'") from None
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 - the Rust library's errors are plain exceptions
        raise ConvertError(f"{where}: the tokenizer does not parse ({exc})") from None


def lowercased(text: str, where: str) -> str:
    """``text``'s tokenizer with the text lower-cased before its own normalizer, as transformers'
    ``Siglip2Tokenizer`` makes SigLIP 2's Gemma tokenizer."""
    from tokenizers import normalizers

    tokenizer = parse(text, where)
    own = jsontext.loads(text).get("normalizer")  # parsed above: JSON already
    if isinstance(own, dict) and (own.get("type") == "Lowercase" or (own.get("normalizers") or [{}])[0].get("type") == "Lowercase"):
        return text  # lower-cased already (Siglip2Tokenizer's save_pretrained)
    normalizer = tokenizer.normalizer
    tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizer]) if normalizer is not None else normalizers.Lowercase()
    return str(tokenizer.to_str())


def _from_transformers(directory: Path) -> str:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConvertError(f"{directory}: has no tokenizer.json; making one from vocab.json and merges.txt needs transformers (pip install transformers)") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001
        raise ConvertError(f"{directory}: transformers cannot read the tokenizer ({type(exc).__name__}: {exc})") from None
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ConvertError(f"{directory}: transformers gives no fast tokenizer for {type(tok).__name__}; add a tokenizer.json")
    return str(backend.to_str())


def _pad_id(directory: Path, tokenizer: Any, family: str) -> int:
    """The pad token's id: ``tokenizer_config.json``'s ``pad_token``, else config.json's
    ``text_config.pad_token_id``, else (CLIP, where padding is masked anyway) 0."""
    token: Any = None
    path = directory / "tokenizer_config.json"
    if path.is_file():
        token = read_json(path).get("pad_token")
        if isinstance(token, dict):
            token = token.get("content")
    if isinstance(token, str):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    text_cfg = read_json(directory / "config.json").get("text_config") if (directory / "config.json").is_file() else None
    pad = text_cfg.get("pad_token_id") if isinstance(text_cfg, dict) else None
    if isinstance(pad, int) and pad >= 0:
        return pad
    if family == "siglip":
        raise ConvertError(f"{directory}: no pad token (tokenizer_config.json pad_token, config.json text_config.pad_token_id); SigLIP pads every text with it")
    return 0
