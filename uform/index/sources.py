"""What an update is given, and how each is read: files (one read through one descriptor, its
bytes hashed), text files (a line an item), :class:`Text` items; which names an index can store
(UTF-8) and how one that cannot is named; which stored items a PATH covers; and the index's own
folder, which is never among them."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from typing import BinaryIO, NamedTuple

from ..core import jsontext
from ..inputs import Failure

TEXT_FILES = (".txt", ".jsonl")


class Text(NamedTuple):
    """A text to index under a key of the caller's (``Index.update([Text("id-1", "a red circle")])``)."""

    key: str
    text: str


def cannot_read(exc: OSError) -> str:
    """Why a file could not be read, in ``encode``'s words: the system's reason."""
    return f"cannot read the file ({exc.strerror})"


def unreadable(exc: OSError) -> str:
    """Why a file could not be opened or looked at: gone, or the system's reason."""
    return "no such file" if isinstance(exc, FileNotFoundError) else cannot_read(exc)


def read(path: str) -> tuple[bytes, int, int] | str:
    """The file's bytes with the size and time seen before reading (time -1 when they changed
    while it was read), or the reason it cannot be read, in ``encode``'s words."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return unreadable(exc)
    try:
        before = os.fstat(fd)
        if stat.S_ISDIR(before.st_mode):
            return "is a directory, not a file"
        if not stat.S_ISREG(before.st_mode):
            return "is not a regular file"
        if before.st_size == 0:
            return "the file is empty"
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
        after = os.fstat(fd)
    except OSError as exc:
        return cannot_read(exc)
    finally:
        os.close(fd)
    if not data:
        return "the file is empty"
    same = (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns) == (len(data), before.st_mtime_ns)
    return data, len(data), before.st_mtime_ns if same else -1


def digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def open_text(path: str) -> BinaryIO | str:
    """A text file open for reading, or the reason it cannot be read, in ``encode``'s words."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO put in its place does not block
    except OSError as exc:
        return unreadable(exc)
    f = os.fdopen(fd, "rb")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            f.close()
            return "is not a regular file"
    except OSError as exc:
        f.close()
        return cannot_read(exc)
    return f


def line_keys(path: str) -> list[str] | str:
    """The keys of a text file's lines that are not blank (``FILE:LINE``), read without keeping
    the lines; or the reason it cannot be read."""
    f = open_text(path)
    if isinstance(f, str):
        return f
    try:
        with f:
            return [f"{path}:{number}" for number, raw in enumerate(f, 1) if raw.decode("utf-8", "replace").strip()]
    except OSError as exc:
        return cannot_read(exc)


def text_lines(path: str) -> Iterator[tuple[str, str] | Failure] | str:
    """``(key, text)`` of a text file, a line an item (``FILE:LINE``, lines ended by ``\\n``), as
    they are read (a file of gigabytes is never held whole): a ``.txt`` line as it is, a
    ``.jsonl`` line a JSON string or an object's ``"text"`` (or ``"caption"``); blank lines
    skipped; a line that is not UTF-8 (or, in a ``.jsonl``, not one of those) a :class:`Failure`
    of its own, and a read that fails midway the file's. Or the reason the file cannot be read,
    in ``encode``'s words."""
    f = open_text(path)
    return f if isinstance(f, str) else _lines(f, path)


def _lines(f: BinaryIO, path: str) -> Iterator[tuple[str, str] | Failure]:
    jsonl = path.lower().endswith(".jsonl")
    with f:
        number = 0
        while True:
            try:
                raw = f.readline()
            except OSError as exc:
                yield Failure("file", path, cannot_read(exc))
                return
            if not raw:
                return
            number += 1
            key = f"{path}:{number}"
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                yield Failure("text", key, f"not UTF-8 (byte 0x{raw[exc.start]:02x}, byte {exc.start + 1} of the line)")
                continue
            if not line.strip():
                continue
            if jsonl:
                try:
                    value = jsontext.loads(line)
                except jsontext.NotJSON as exc:
                    yield Failure("text", key, f"not a JSON line ({exc})")
                    continue
                text = value if isinstance(value, str) else value.get("text", value.get("caption")) if isinstance(value, dict) else None
                if not isinstance(text, str):
                    yield Failure("text", key, 'expected a JSON string, or an object with a "text" (or "caption") string')
                    continue
                line = text
            yield key, line


NOT_UTF8 = "its name is not valid UTF-8, and an index stores names as UTF-8: rename it to index it"


def storable(text: str) -> bool:
    """Whether a name (or a text) is valid UTF-8 (a name Python decoded with escapes is not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escape(name: str) -> str:
    """A name as printable, storable text: its bytes that are not UTF-8 as ``\\xNN``."""
    try:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that no file name decodes to (a caller's text)
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def in_scope(path: str, roots: list[str], *, text: bool = False) -> bool:
    """Whether an item is under one of the paths given: a file at or under it; a line of a text
    file (``FILE:LINE``) only when that text file itself was given."""
    if text:
        return any(path.startswith(r + ":") for r in roots)
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def refuse_inside(index: str | os.PathLike[str], sources: Iterable[str | os.PathLike[str] | Text]) -> None:
    """Refuse to index the index's own folder, or a path inside it: the index owns that folder."""
    folder = os.path.realpath(index)
    for s in sources:
        if isinstance(s, Text):
            continue
        path = os.path.realpath(os.fspath(s))
        if path == folder or path.startswith(folder + os.sep):
            raise ValueError(f"{os.fspath(s)}: is the index {os.fspath(index)}{' itself' if path == folder else ' or inside it'}; "
                             "an index is kept in a folder of its own, apart from what it indexes: give another --into")  # fmt: skip
