"""A BERT ``vocab.txt`` (WordPiece, as Chinese-CLIP's RoBERTa-wwm ships it) as a ``tokenizer.json``.

transformers' ``BertTokenizer`` runs a basic tokenization (control characters dropped, white
space made a space, each CJK character a word of its own, lower-casing and accent stripping
where ``tokenizer_config.json`` asks, punctuation split off), then a greedy longest-match
WordPiece with ``##`` continuations (a word past 100 characters, or with no piece, is
``[UNK]``), between ``[CLS]`` and ``[SEP]``. The ``tokenizers`` library has each step
(``BertNormalizer``, ``BertPreTokenizer``, ``WordPiece``): they are assembled here from the
vocabulary and the tokenizer's config, and the result is kept only where it gives the Python
``BertTokenizerLegacy``'s ids on :data:`CHECK_TEXTS` (the conversion is refused otherwise;
transformers is needed at convert time for that check, never at run time).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from .sources import ConvertError, read_json

SPECIALS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
DEFAULTS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}
CHECK_TEXTS = [
    "一只猫的照片", "杰尼龟，妙蛙种子。小火龙！皮卡丘？", "a photo of a cat", "A Photo Of A DOG!", "猫cat混合mixed文本", "ＦＵＬＬＷＩＤＴＨ！全角，标点",
    "naïve café déjà vu — crème brûlée", "ÀÉÎÕÜ ß æ ø å ñ ç", "emoji 🐱🐶 🎉 表情", "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\nand    runs", "(parens) [brackets] {braces} <angles> \"quotes\" 'single' `back`", "user@example.com 3.14 1,000",
    "unaffable playing runner's", "", " ", "x", "\u00a0non-breaking\u2003em space\u200bzero width", "控制\x00字符\x07在\ufffd这里",
    "日本語のテキスト 한국어", "[MASK] 和 [UNK] [CLS]", "a" * 120, "超长" * 40, "https://例子.中国/路径?查询=值",
]  # fmt: skip


def wordpiece_tokenizer(directory: Path, notes: list[str]) -> str:
    """``directory``'s ``vocab.txt`` and ``tokenizer_config.json`` as a ``tokenizer.json`` text."""
    path = directory / "vocab.txt"
    try:
        from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
        from tokenizers.models import WordPiece
    except ImportError:
        raise ConvertError(f"{path}: making a tokenizer.json from a WordPiece vocabulary needs the tokenizers library: pip install 'uform[convert]'") from None
    vocab = _vocab(path)
    cfg = read_json(directory / "tokenizer_config.json") if (directory / "tokenizer_config.json").is_file() else {}
    where = str(directory / "tokenizer_config.json")
    tokens = {key: _token(cfg, key, where) for key in SPECIALS}
    for key, token in tokens.items():
        if token not in vocab:
            raise ConvertError(f"{path}: the {key} {token!r} is not in the vocabulary; a WordPiece vocabulary holds its special tokens")
    lower = _flag(cfg, "do_lower_case", where, True)
    chinese = _flag(cfg, "tokenize_chinese_chars", where, True)
    strip = cfg.get("strip_accents")
    if strip is not None and not isinstance(strip, bool):
        raise ConvertError(f"{where}: strip_accents {strip!r} is not true, false or null")
    if not _flag(cfg, "do_basic_tokenize", where, True):
        raise ConvertError(f"{where}: do_basic_tokenize false is not supported (uform's WordPiece tokenizer splits words as BertTokenizer's basic tokenization does)")
    if cfg.get("never_split"):
        raise ConvertError(f"{where}: never_split {cfg['never_split']!r} is not supported; supported: none")
    tok: Any = Tokenizer(WordPiece(vocab, unk_token=tokens["unk_token"], max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese, strip_accents=strip, lowercase=lower)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    cls, sep = tokens["cls_token"], tokens["sep_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1", special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])]
    )
    tok.add_special_tokens([tokens[key] for key in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")])
    _check(directory, tok, path)
    notes.append(f"tokenizer.json made from vocab.txt ({len(vocab)} tokens, lower case {lower}, accents stripped {strip if strip is not None else lower}), equal to BertTokenizer on {len(CHECK_TEXTS)} texts")
    return str(tok.to_str())


def _vocab(path: Path) -> dict[str, int]:
    """``vocab.txt``: a token a line, its id the line's number (as transformers' ``load_vocab``: a
    token given twice takes the later line's id)."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConvertError(f"{path}: cannot be read ({exc})") from None
    if lines and lines[-1] == "":
        lines.pop()
    vocab = {line.rstrip("\n"): i for i, line in enumerate(lines)}
    if not vocab:
        raise ConvertError(f"{path}: the vocabulary is empty")
    return vocab


def _token(cfg: dict[str, Any], key: str, where: str) -> str:
    value = cfg.get(key, DEFAULTS[key])
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise ConvertError(f"{where}: {key} {value!r} is not a token")
    return value


def _flag(cfg: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise ConvertError(f"{where}: {key} {value!r} is not true or false")
    return value


def _check(directory: Path, tok: Any, path: Path) -> None:
    """Refuse the tokenizer where its ids differ from transformers' Python ``BertTokenizerLegacy``'s."""
    slow_class: Any = None
    for module, name in (("transformers.models.bert.tokenization_bert_legacy", "BertTokenizerLegacy"), ("transformers.models.bert.tokenization_bert", "BertTokenizer")):
        try:  # transformers 5's Python tokenizer, else transformers 4's BertTokenizer (the Python one there)
            slow_class = getattr(importlib.import_module(module), name)
            break
        except (ImportError, AttributeError):
            continue
    if slow_class is None:
        raise ConvertError(f"{path}: checking the tokenizer made from vocab.txt needs transformers at convert time (pip install transformers)")
    try:
        slow = slow_class.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001 - the library's errors vary
        raise ConvertError(f"{path}: transformers' BertTokenizer cannot read it ({type(exc).__name__}: {exc})") from None
    for text in CHECK_TEXTS:
        want = slow(text)["input_ids"]
        got = tok.encode(text).ids
        if want != got:
            raise ConvertError(f"{path}: the tokenizer.json made from it gives other ids than BertTokenizer for {text!r} ({got} against {want}); add a tokenizer.json to the source")
