"""A text tower's tokenizer held in the checkpoint (version 2's ``tokenizer: "tokenizer.json"``).

The checkpoint's ``__metadata__["tokenizer"]`` holds a Hugging Face ``tokenizer.json`` as its
JSON text; the ``tokenizers`` library (Rust) runs it, imported only when such a file loads.
Any truncation or padding settings inside the file are ignored: texts are encoded with their
special tokens, truncated to the tower's ``context`` tokens by the library (specials kept, as
``truncation=True, max_length=context`` does in transformers), and padded by the text plugin.
A long text is read only as far as its kept tokens need (:meth:`HeldTokenizer.encode`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from uform.core.errors import CheckpointError, InputError, UnsupportedError, check_not_released
from uform.core.pipeline import check_batch

METADATA_KEY = "tokenizer"
EXTRA = "models"  # the extra that installs the tokenizers library (and ftfy)


READ = 16  # a long text's first read, in characters per token of the context
GROWTH = 4  # each further read is this many times longer


@dataclass(frozen=True)
class Tokens:
    """Texts as token ids: each row truncated to ``context``, every row's length before (over
    the part of the text read), and whether the text was read whole."""

    ids: list[np.ndarray]
    kept: np.ndarray
    full: np.ndarray
    whole: np.ndarray  # bool: the text was read to its end, so ``full`` is its whole length


class HeldTokenizer:
    """The tokenizer of a checkpoint, truncating at ``context``."""

    def __init__(self, text: str, context: int, vocab_size: int, where: str, clean: str = "none") -> None:
        self._clean = cleaner(clean, where)
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UnsupportedError(
                f"config field {where}: a checkpoint with its own tokenizer needs the tokenizers library: pip install 'uform[{EXTRA}]'"
            ) from None
        try:
            self._cut = Tokenizer.from_str(text)
        except Exception as exc:  # noqa: BLE001 - whatever the library says, the file is at fault
            raise CheckpointError(f'__metadata__["{METADATA_KEY}"] is not a tokenizer.json the tokenizers library reads ({exc})') from None
        size = self._cut.get_vocab_size(with_added_tokens=True)
        if size > vocab_size:
            raise CheckpointError(f"config field {where}.vocab_size: {vocab_size}, but the tokenizer has {size} tokens")
        token, top = max(self._cut.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1], default=("", -1))
        if top >= vocab_size:  # ids need not be 0..N-1: one past the rows would fail in the graph's gather at the first text holding it
            raise CheckpointError(f"config field {where}.vocab_size: {vocab_size}, but the tokenizer's token {token!r} has id {top}")
        self._cut.no_padding()
        self._cut.enable_truncation(max_length=context)
        self._specials = self._cut.num_special_tokens_to_add(False)  # a piece's special tokens
        self.context = context

    def encode(self, texts: Sequence[str], count: bool = True) -> Tokens:
        """Every text's ids (int64, specials included, at most ``context``), its length before
        the cut, and whether it was read whole.

        With ``count``, every text is read whole, so ``full`` is each text's whole length. Without
        it, a text longer than ``READ`` characters a context token is read in prefixes, each
        ``GROWTH`` times the last, until two in a row give the same kept ids and the first of
        them already had tokens past the context (so the cut at its end changed none that are
        kept), or a prefix is the whole text: a 1 MB text costs a few kilobytes' reading, and
        ``full`` counts its tokens in the last prefix read (``whole`` False). What truncation cut
        is counted, in the model's tokens, from the pieces it cut (each carries the
        post-processor's special tokens again)."""
        if count:
            return self._tokens(self._batch(list(texts)), [True] * len(texts))
        first = READ * self.context
        reads = [min(len(t), first) for t in texts]
        cut = self._batch([t[:n] for t, n in zip(texts, reads)])
        last = list(cut)  # the longest prefix read of each text
        pending = [i for i, t in enumerate(texts) if reads[i] < len(t)]
        while pending:
            again = self._batch([texts[i][: reads[i] * GROWTH] for i in pending])
            still = []
            for i, e in zip(pending, again):
                settled = bool(cut[i].overflowing) and e.ids == cut[i].ids
                reads[i] *= GROWTH
                last[i] = e
                if not settled:
                    cut[i] = e
                    if reads[i] < len(texts[i]):
                        still.append(i)
            pending = still
        return self._tokens(last, [n >= len(t) for t, n in zip(texts, reads)])

    def _batch(self, texts: list[str]) -> Any:
        return self._cut.encode_batch(texts if self._clean is None else [self._clean(t) for t in texts])

    def _tokens(self, cut: Sequence[Any], whole: Sequence[bool]) -> Tokens:
        ids = [np.asarray(e.ids, np.int64) for e in cut]
        kept = np.fromiter((len(i) for i in ids), np.int64, len(ids))
        full = kept.copy()
        truncated = [i for i, e in enumerate(cut) if e.overflowing]
        if truncated:
            full[truncated] += [sum(len(piece.ids) - self._specials for piece in cut[i].overflowing) for i in truncated]
        return Tokens(ids, kept, full, np.asarray(whole, bool))


def ended(ids: Sequence[np.ndarray], end: int | str) -> tuple[list[np.ndarray], np.ndarray]:
    """Each row cut after its end token (``towers.text.end_token``) and its length: ``max``, the
    first of the row's largest id (CLIP's ``argmax`` pooling: open_clip's, and transformers'
    where ``eos_token_id`` is 2), or the first ``end`` id (transformers' ``eos_token_id``); a row
    without it is kept whole. With a causal mask the tokens after it change no state before
    it, so pooling the last token fed is pooling at the end token, as those models do."""
    out = []
    for row in ids:
        hits = np.flatnonzero(row == (row.max(initial=0) if end == "max" else end))
        out.append(row[: hits[0] + 1] if len(hits) else row)
    return out, np.fromiter((len(row) for row in out), np.int64, len(out))


def read(metadata: Mapping[str, str], context: int, vocab_size: int, where: str, clean: str = "none") -> HeldTokenizer:
    """The checkpoint's tokenizer; CheckpointError when it is missing or does not parse."""
    text = metadata.get(METADATA_KEY)
    if text is None:
        raise CheckpointError(f'config field {where}.tokenizer: "tokenizer.json", but __metadata__["{METADATA_KEY}"] is missing')
    return HeldTokenizer(text, context, vocab_size, where, clean)


def cleaner(clean: str, where: str) -> Callable[[str], str] | None:
    """open_clip's text cleaning (``towers.text.clean``), run on a text before its tokenizer:
    ``whitespace`` is ftfy's ``fix_text``, HTML entities unescaped twice, whitespace runs (Python's
    ``str.split``) folded to one space and the ends stripped; ``lower`` also lower-cases (open_clip's
    SimpleTokenizer, ``whitespace`` its HFTokenizer); ``none`` (None) leaves the text as it is."""
    if clean == "none":
        return None
    try:
        import ftfy
    except ImportError:
        raise UnsupportedError(f"config field {where}.clean: {clean!r} (open_clip's text cleaning) needs the ftfy library: pip install 'uform[{EXTRA}]'") from None
    import html

    def whitespace(text: str) -> str:
        return " ".join(html.unescape(html.unescape(ftfy.fix_text(text))).split())

    return whitespace if clean == "whitespace" else lambda text: whitespace(text).lower()


def as_bytes(texts: Any) -> list[bytes]:
    """Each text as bytes (``str`` as UTF-8); InputError names the first bad item."""
    if isinstance(texts, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"texts must be a sequence of str or bytes, got a single {type(texts).__name__}; wrap it in a list")
    check_batch(texts, "texts")
    out = []
    for i, text in enumerate(texts):
        if isinstance(text, str):
            out.append(utf8_of(i, text))
        elif isinstance(text, (bytes, bytearray, memoryview)):
            check_not_released(i, text)
            out.append(bytes(text))
        else:
            raise InputError(i, f"expected str or bytes, got {type(text).__name__}")
    return out


def as_texts(texts: Any) -> list[str]:
    """Each text as ``str`` (bytes decoded as UTF-8), for a tokenizer that reads text;
    InputError names the first bad item."""
    return [text_of(i, text) for i, text in enumerate(as_bytes(texts))]


def utf8_of(index: int, text: str) -> bytes:
    """``text`` as UTF-8; InputError naming item ``index`` when it cannot be (a lone surrogate).
    The one wording of this refusal: the verbs' and the server's (through ``uform.verbs``)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(index, f"text is not encodable as UTF-8 ({exc.reason} at {exc.start})") from None


def text_of(index: int, data: bytes) -> str:
    """``data`` decoded as UTF-8, the text a tokenizer reads; InputError naming item ``index``
    when it is not UTF-8. The one wording of this refusal: the verbs' and the server's."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(index, f"bytes are not UTF-8 ({exc.reason} at byte {exc.start}); this model's tokenizer reads text") from None
