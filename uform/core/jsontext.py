"""JSON from outside uform, read in one place.

A file, a line or a header someone else wrote can fail ``json.loads`` four ways: text that is
not JSON (``JSONDecodeError``), bytes that are not UTF-8 (``UnicodeDecodeError``), JSON
nested past Python's stack (``RecursionError``, which is no ``ValueError`` and escaped every
``except ValueError`` before it had a room), and an integer longer than Python converts
(a bare ``ValueError`` in Python's words). :func:`loads` turns all four into
:class:`NotJSON`, a ``ValueError`` whose text is the reason alone, for the caller to put in an
error of its own that names the item. Every module reads outside JSON through it
(tests/test_architecture.py holds them to it); uform's own metadata, which uform wrote a moment
before, and the server's orjson reading are the exceptions the test names.
"""

from __future__ import annotations

import json
import sys
from typing import Any


class NotJSON(ValueError):
    """What :func:`loads` raises; ``str()`` is the reason alone (``"Expecting value at column 1"``,
    ``"Expecting ',' delimiter at line 3 column 13"``, ``"nested too deeply"``, ``"an integer of
    more than 4300 digits"``)."""


def loads(text: str | bytes, *, unique_keys: bool = False) -> Any:
    """``json.loads(text)``, bytes read as UTF-8 alone (``json.loads`` would take UTF-16 and 32
    too, which no format uform reads allows); :class:`NotJSON` for text that is not JSON, bytes
    that are not UTF-8, JSON nested too deeply, or an integer longer than Python converts.
    ``unique_keys``: an object naming a key twice is :class:`NotJSON` too (Python keeps the
    last, other readers the first or neither: for a format that two programs must read alike)."""
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text, object_pairs_hook=_unique if unique_keys else None)
    except NotJSON:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise NotJSON(reason(exc)) from None
    except ValueError:  # int()'s limit on digits (sys.get_int_max_str_digits), the one ValueError left
        raise NotJSON(f"an integer of more than {sys.get_int_max_str_digits()} digits") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) < len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise NotJSON(f"the key {twice!r} appears twice in one object")
    return out


def reason(exc: json.JSONDecodeError | UnicodeDecodeError | RecursionError) -> str:
    """Why a reading of JSON failed, in :class:`NotJSON`'s words."""
    if isinstance(exc, json.JSONDecodeError):  # one line's place needs no line number
        return f"{exc.msg} at " + (f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno} column {exc.colno}")
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
    return "nested too deeply"
