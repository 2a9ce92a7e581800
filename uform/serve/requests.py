"""Request bodies to items: every field checked, every error a 400 naming the item and reason.

An embeddings item is ``(kind, payload, cost)``: a text as UTF-8 bytes (``input`` strings
and token-id arrays, ids 0-255 being bytes), or an image, video or recording as file bytes
from a content part (``media``). Cost is what the batch budgets count: text bytes, image
pixels (read from the header), video and audio bytes.
"""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import orjson
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uform import InputError
from uform.verbs import text_of, utf8_of

from .errors import ApiError, bad_item, shown
from .parts import part_bytes

ENCODINGS = ("float", "base64")
MAX_DEPTH = 1024  # orjson's limit on nested arrays and objects
# commas a body may hold outside its strings: each separates one more JSON value (an array, an
# object, a string, a number), which takes 8-100 bytes parsed: 10 M empty arrays (30 MB) took
# +900 MB and 11.5 s. 2,048 token-id arrays of 128 ids hold 262,144.
MAX_COMMAS = 1 << 19
SLICE = 1 << 22  # bytes of a body read at a time to count its commas outside strings


@dataclass(slots=True)
class Item:
    kind: str  # text, image, video, audio
    payload: bytes
    cost: int


@dataclass(slots=True)
class EmbeddingsRequest:
    items: list[Item]
    encoding_format: str
    dimensions: int | None
    model: str | None


@dataclass(frozen=True)
class ChooseRequest:
    texts: list[bytes]
    choices: list[bytes]
    groups: list[int]
    model: str | None


def loads(body: bytes) -> dict[str, Any]:
    """The body's JSON object: orjson, or, for what orjson refuses (lone surrogate escapes, NaN,
    UTF-16), the standard library's reading, so that such items are named as before."""
    if commas(body) > MAX_COMMAS:
        raise ApiError(400, f"the body holds over {MAX_COMMAS} JSON values (arrays, objects, strings, numbers: commas outside its "
                            "strings), the limit of uform.serve.requests.MAX_COMMAS: read, they would take far more memory than "
                            "its bytes", code="too_many_values")  # fmt: skip
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as first:
        if "recursion" in str(first).lower():  # nested deeper than orjson's 1024 levels: nothing to read
            raise ApiError(400, f"the body is not valid JSON: nested deeper than {MAX_DEPTH} levels", code="invalid_json") from None
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError(400, f"the body is not valid JSON ({exc})", code="invalid_json") from None
        except RecursionError:
            raise ApiError(400, "the body is not valid JSON: nested too deep to read", code="invalid_json") from None
        except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
            raise ApiError(400, f"the body holds an integer of more than {sys.get_int_max_str_digits()} digits, longer than this server reads",
                           code="invalid_json") from None  # fmt: skip
    if not isinstance(doc, dict):
        raise ApiError(400, f"the body must be a JSON object, not {type(doc).__name__}", code="invalid_json")
    return doc


def commas(body: bytes) -> int:
    """The commas in ``body``, or, where they are over ``MAX_COMMAS``, those outside its strings
    alone (a text holding commas adds none), counted without parsing it: escaped backslashes and
    quotes dropped, a comma is outside where the quotes before it are even, read a slice at a
    time (about 5 bytes held a byte of the slice)."""
    rough = body.count(b",")
    if rough <= MAX_COMMAS:
        return rough
    bare = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside, odd = 0, 0
    for at in range(0, len(bare), SLICE):
        part = np.frombuffer(bare, np.uint8, min(SLICE, len(bare) - at), at)
        quotes = np.cumsum(part == 34, dtype=np.uint8)  # mod 256: its lowest bit is the parity
        quotes += odd
        outside += int(np.count_nonzero((part == 44) & ((quotes & 1) == 0)))
        odd = int(quotes[-1]) & 1
    return outside


def embeddings(body: bytes, *, max_items: int, media_root: Path | None, limit: int, utf8: bool = False) -> EmbeddingsRequest:
    """``utf8``: the model tokenizes texts (a converted CLIP or SigLIP), so a token-id array
    must be UTF-8 text (its tokenizer reads text), refused here rather than by the verb."""
    doc = loads(body)
    raw = doc.get("input")
    if raw is None:
        raise ApiError(400, "'input' is required: a string, an array of strings, token-id arrays or content parts", param="input", code="missing_input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int) and not isinstance(raw[0], bool)):
        raw = [raw]  # one text, or one token-id array
    if not isinstance(raw, list):
        raise ApiError(400, f"'input' must be a string or an array, not {type(raw).__name__}", param="input", code="invalid_type")
    if not raw:
        raise ApiError(400, "'input' is empty", param="input", code="empty_input")
    if len(raw) > max_items:
        raise ApiError(400, f"'input' holds {len(raw)} items, over the limit of {max_items} a request", param="input", code="too_many_items")
    items = [_item(i, x, media_root, limit, utf8) for i, x in enumerate(raw)]
    fmt = doc.get("encoding_format", "float")
    if fmt is None:
        fmt = "float"
    if fmt not in ENCODINGS:
        raise ApiError(400, f"'encoding_format' must be 'float' or 'base64', not {shown(fmt)}", param="encoding_format", code="invalid_value")
    dims = doc.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise ApiError(400, f"'dimensions' must be a positive integer, not {shown(dims)}", param="dimensions", code="invalid_value")
    return EmbeddingsRequest(items, fmt, dims, _model(doc))


def _item(index: int, x: Any, media_root: Path | None, limit: int, utf8: bool) -> Item:
    if isinstance(x, str):
        return _text(index, x)
    if isinstance(x, list):
        try:
            if any(v is True or v is False for v in x):  # bytes() reads them as 1 and 0
                raise TypeError
            data = bytes(x)
        except (TypeError, ValueError):
            raise bad_item(index, "a token-id array must hold integers 0-255 (tokens are UTF-8 bytes), not booleans or other values") from None
        if not data:
            raise bad_item(index, "the token-id array is empty")
        if utf8:
            try:
                text_of(index, data)
            except InputError as exc:  # the verb's own words
                raise bad_item(index, exc.reason) from None
        return Item("text", data, len(data))
    if isinstance(x, dict):
        if x.get("type") == "text":
            text = x.get("text")
            if not isinstance(text, str):
                raise bad_item(index, "a text part needs 'text', a string")
            return _text(index, text)
        try:
            kind, data = part_bytes(x, media_root, limit)
        except ValueError as exc:
            raise bad_item(index, str(exc)) from None
        return Item(kind, data, _pixels(data) if kind == "image" else len(data))
    raise bad_item(index, f"an item must be a string, a token-id array or a content part object, not {type(x).__name__}", code="invalid_type")


def _text(index: int, text: str) -> Item:
    if not text:
        raise bad_item(index, "the text is empty")
    try:
        data = utf8_of(index, text)
    except InputError as exc:  # the verb's own words
        raise bad_item(index, exc.reason) from None
    return Item("text", data, len(data))


def _pixels(data: bytes) -> int:
    """The image's pixels from its header alone; the file's bytes when it has no readable header
    (the verb then names what is wrong)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            return int(width * height)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return len(data)


def choose(body: bytes, *, max_items: int, groups: int | None = None) -> ChooseRequest:
    """``groups``: the model's temperature groups, when known; a group outside ``0 … groups − 1`` is refused."""
    doc = loads(body)
    raw = doc.get("input")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) for t in raw):
        raise ApiError(400, "'input' must be a string or a non-empty array of strings", param="input", code="invalid_type")
    if len(raw) > max_items:
        raise ApiError(400, f"'input' holds {len(raw)} texts, over the limit of {max_items} a request", param="input", code="too_many_items")
    texts = [_text(i, t).payload if t else b"" for i, t in enumerate(raw)]
    choices = _choices(doc.get("choices"), len(raw))
    given = doc.get("temperature_groups")
    if given is None:
        given = [0] * len(raw)
    elif not isinstance(given, list) or len(given) != len(raw) or not all(isinstance(g, int) and not isinstance(g, bool) for g in given):
        raise ApiError(400, f"'temperature_groups' must be an array of {len(raw)} integers, one a text", param="temperature_groups", code="invalid_value")
    for i, g in enumerate(given):
        if g < 0 or (groups is not None and g >= groups):
            span = f": this model has {groups} group(s), 0 … {groups - 1}" if groups is not None else ""
            raise bad_item(i, f"temperature group {g} is out of range{span}", param="temperature_groups", code="invalid_value")
    return ChooseRequest(texts, choices, given, _model(doc))


def _choices(raw: Any, count: int) -> list[bytes]:
    if isinstance(raw, str):
        raw = [raw] * count
    if not isinstance(raw, list) or len(raw) != count or not all(isinstance(c, str) for c in raw):
        raise ApiError(400, f"'choices' must be a string shared by every text or an array of {count} strings, one a text",
                       param="choices", code="invalid_value")  # fmt: skip
    out: list[bytes] = []
    for i, c in enumerate(raw):
        if not c or not c.isascii() or len(set(c)) != len(c):
            raise bad_item(i, f"choices {c!r} must be a non-empty ASCII string without repeats (each character is one choice)", param="choices")
        out.append(c.encode())
    return out


def _model(doc: dict[str, Any]) -> str | None:
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model", code="invalid_type")
    return model


def kinds(items: Sequence[Item]) -> set[str]:
    return {item.kind for item in items}
