"""Labelled examples for calibrating ``text_choose``: read from JSON lines (docs/choose.md),
each refused by its line and the reason; and examples given in Python checked the same way."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO, TypeGuard

from ..core import jsontext
from ..core.errors import InputError
from ..verbs import utf8_of

__all__ = ["MAX_GROUPS", "Example", "check", "is_integer", "read_examples"]

MAX_GROUPS = 4096  # question groups a calibration fits: each is a temperature in the checkpoint's header


def is_integer(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int and not a bool (JSON's true is not a group, a count or an index)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Example:
    """One labelled question: ``answer`` is the index of the right choice in ``choices``."""

    text: str | bytes
    choices: str | bytes
    answer: int
    group: int = 0



def read_examples(path: str | os.PathLike[str]) -> list[Example]:
    """Examples from JSON lines ``{"text", "choices", "answer", "group"?}``; errors name the line.

    ``answer`` is the right choice itself (a one-character string found in ``choices``) or
    its index; ``group`` defaults to 0. Blank lines are skipped.
    """
    out = []
    with _open_examples(path) as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{number}: not UTF-8 (byte 0x{raw[exc.start]:02x}, byte {exc.start + 1} of the line)") from None
            if line.strip():
                out.append(_example(line, f"{path}:{number}"))
    if not out:
        raise ValueError(f"{path}: no examples")
    return out


def _open_examples(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` open for reading when it is a regular file; ValueError naming it otherwise. Opened
    without blocking and checked by its descriptor: a FIFO waited forever for a writer, and a
    device (``/dev/zero``) was read as one endless line until memory ran out."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the examples file ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise ValueError(f"{path}: is {kind}, not a file of examples; give a JSON lines file")
    return os.fdopen(fd, "rb")


def _example(line: str, where: str) -> Example:
    try:
        raw = jsontext.loads(line)
    except jsontext.NotJSON as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object with text, choices and answer")
    text, choices, answer, group = raw.get("text"), raw.get("choices"), raw.get("answer"), raw.get("group", 0)
    if not isinstance(text, str):
        raise ValueError(f"{where}: text must be a string, got {text!r}")
    try:
        utf8_of(0, text)
    except InputError as exc:  # a lone surrogate; the text plugin's wording, named by the line
        raise ValueError(f"{where}: {exc.reason}") from None
    if not isinstance(choices, str) or not choices:
        raise ValueError(f"{where}: choices must be a non-empty string of single-byte choices, got {choices!r}")
    wide = next((c for c in choices if ord(c) > 0x7F), None)
    if wide is not None:
        raise ValueError(f"{where}: choice {wide!r} is not a single byte: choices must be ASCII characters")
    twice = next((c for k, c in enumerate(choices) if c in choices[:k]), None)
    if twice is not None:
        raise ValueError(f"{where}: choice {twice!r} appears twice in {choices!r}")
    if isinstance(answer, str) and len(answer) == 1 and answer in choices:
        index = choices.index(answer)
    elif is_integer(answer) and 0 <= answer < len(choices):
        index = answer
    else:
        raise ValueError(f"{where}: answer {answer!r} is not one of the choices {choices!r} (or its index)")
    return Example(text, choices, index, _group(group, where))


def _group(group: object, where: str) -> int:
    """``group`` when it is an integer from 0 to ``MAX_GROUPS - 1``; ValueError naming ``where``."""
    if not is_integer(group) or not 0 <= group < MAX_GROUPS:
        raise ValueError(f"{where}: group must be an integer from 0 to {MAX_GROUPS - 1} (uform.calibrate.MAX_GROUPS), got {group!r}")
    return group


def check(examples: Sequence[Example]) -> None:
    """ValueError naming the first example whose answer is not an index of its choices or
    whose group is out of range (``read_examples`` checks these; ``Example`` itself does not)."""
    for i, e in enumerate(examples):
        size = len(e.choices) if isinstance(e.choices, (str, bytes)) else None
        if size is not None and (not is_integer(e.answer) or not 0 <= e.answer < size):
            raise ValueError(f"example {i}: answer {e.answer!r} is not the index of one of its {size} choices {e.choices!r}")
        _group(e.group, f"example {i}")

