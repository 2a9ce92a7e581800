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

import numpy as np


MAX_RUNS = 1 << 17  # runs of non-ASCII bytes up to which :func:`narrow` escapes them


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
    hook = _unique if unique_keys else None
    if isinstance(text, bytes) and not text.isascii():
        try:
            return json.loads(narrow(text), object_pairs_hook=hook)
        except NotJSON:
            raise
        except (ValueError, RecursionError):
            pass  # the reason, in the source's own columns, from the plain reading below
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text, object_pairs_hook=hook)
    except NotJSON:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise NotJSON(reason(exc)) from None
    except ValueError:  # int()'s limit on digits (sys.get_int_max_str_digits), the one ValueError left
        raise NotJSON(f"an integer of more than {sys.get_int_max_str_digits()} digits") from None


def narrow(data: bytes) -> str:
    """UTF-8 ``data`` as text of one byte a character where that is the smaller: Python holds a
    string at the width of its widest character, so one emoji made a 100 MiB header's text 400 MiB
    beside the values parsed from it (945 MB of RSS against 345 for ASCII). Each run of non-ASCII
    bytes is then written as JSON's ``\\uXXXX`` escapes (what ``json.dumps`` writes, and uform's
    writers), which parse to the same values: only a string holding such characters is wide. Where
    the escapes would cost more than the wide text (dense non-Latin text), or the runs number
    :data:`MAX_RUNS` or more, the plain decoding.
    ``UnicodeDecodeError`` for bytes that are not UTF-8."""
    bytes_ = np.frombuffer(data, np.uint8)
    leads = int(np.count_nonzero(bytes_ >= 0xC0))  # characters beyond ASCII, each 6 bytes escaped (12 beyond U+FFFF)
    top = int(bytes_.max())
    width = 4 if top >= 0xF0 else 2 if top >= 0xC4 else 1  # Python's width for the whole text (U+0100 and on: 2)
    chars = len(data) - int(np.count_nonzero((bytes_ & 0xC0) == 0x80))
    if width == 1 or len(data) + 11 * leads >= chars * width:
        return data.decode("utf-8")
    wide = np.flatnonzero(bytes_ >= 0x80)  # runs of them hold whole UTF-8 sequences, or are not UTF-8
    breaks = np.flatnonzero(np.diff(wide) != 1) + 1
    if len(breaks) >= MAX_RUNS:  # the escaping's Python steps cost 2-3 us a run: 0.3 s at the limit
        return data.decode("utf-8")
    starts, ends = wide[np.r_[0, breaks]].tolist(), (wide[np.r_[breaks - 1, len(wide) - 1]] + 1).tolist()
    view, bounds = memoryview(data), [0, *(x for pair in zip(starts, ends) for x in pair), len(data)]
    runs = b" ".join(data[start:end] for start, end in zip(starts, ends)).decode("utf-8")  # ASCII spaces: no run holds one
    escaped = json.dumps(runs)[1:-1].encode("ascii").split(b" ")  # views below: the ASCII between runs is copied once, by the join
    parts = [piece for i in range(len(escaped)) for piece in (view[bounds[2 * i] : bounds[2 * i + 1]], escaped[i])]
    parts.append(view[bounds[-2] :])
    return b"".join(parts).decode("ascii")


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
