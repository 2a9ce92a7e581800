"""Input items of the file verbs (images, video, audio): paths, bytes or binary file objects.

:func:`sources` checks every item before anything is decoded, so a missing file, a
directory, a FIFO (which would block a reader forever) or an empty item fails the call
up front, naming its index and path. A file object listed more than once in one call is
read once, there, and each of its items decodes those bytes, so two worker threads never
read one file object at once. A file object may answer a read with fewer bytes than asked
(a raw stream may): uform reads on until it has them or the file ends.
"""

from __future__ import annotations

import dataclasses
import io
import os
import stat
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from uform.core.errors import InputError, check_not_released
from uform.core.pipeline import check_batch

# a recording or clip that ends more than this short of what its container declares is truncated
TRUNCATION_SLACK_SECONDS, TRUNCATION_SLACK_SHARE = 0.25, 0.05


# FFmpeg met the end of the file while it opened it: cut in its headers, or in the first packets its probe reads
CUT_WHILE_OPENED = "is truncated: it ends before FFmpeg has opened it (inside its headers or the first packets its probe reads)"


def falls_short(ended: float, declared: float) -> bool:
    """Whether media that ends at ``ended`` seconds is cut short of the ``declared`` length."""
    return ended + max(TRUNCATION_SLACK_SECONDS, TRUNCATION_SLACK_SHARE * declared) < declared


@dataclass(frozen=True)
class Source:
    """One input item: a file path, or bytes, or a readable binary file object."""

    index: int
    path: str | None  # what errors name: the path, or a file object's ``name``
    data: bytes | None = None
    stream: BinaryIO | None = None

    def fail(self, reason: str) -> InputError:
        return InputError(self.index, reason, self.path)

    def open(self) -> BinaryIO:
        """A seekable binary stream over the item (a path is opened, a one-way stream read whole)."""
        if self.data is not None:
            return io.BytesIO(self.data)
        if self.stream is None:
            assert self.path is not None
            return open(self.path, "rb")
        if not self._seekable():
            return io.BytesIO(self.read_all())
        self.stream.seek(0)
        return cast(BinaryIO, FullReads(self.stream))  # read, seek and tell: all a decoder asks of it

    def read_all(self) -> bytes:
        """The file object's bytes (from its start when it seeks); InputError if reading fails."""
        assert self.stream is not None
        try:
            if self._seekable():
                self.stream.seek(0)
            data = self.stream.read()
        except Exception as exc:  # noqa: BLE001 - whatever the caller's object raises, it is this item's fault
            raise self.fail(f"cannot read the file object ({type(exc).__name__}: {exc})") from None
        if not isinstance(data, (bytes, bytearray)):
            raise self.fail(f"the file object gave {type(data).__name__}, not bytes; open it with 'rb'")
        return bytes(data)

    def target(self) -> str | BinaryIO:
        """What a streaming reader (PyAV) takes: the path, or a stream read from its start."""
        if self.stream is not None:
            if self._seekable():
                self.stream.seek(0)
            return self.stream
        return self.path if self.data is None and self.path is not None else self.open()

    def head(self, size: int = 4096) -> bytes:
        """The item's first bytes (a file object that seeks is put back where it stood); empty
        for one that cannot seek, whose first bytes :class:`HeadKept` keeps as it is read."""
        if self.data is not None:
            return self.data[:size]
        if self.stream is None and self.path is not None:
            with open(self.path, "rb") as f:
                return f.read(size)
        if self._seekable():
            assert self.stream is not None
            at = self.stream.tell()
            self.stream.seek(0)
            head = FullReads(self.stream).read(size)
            self.stream.seek(at)
            return head
        return b""

    def _seekable(self) -> bool:
        try:
            return bool(self.stream is not None and self.stream.seekable())
        except Exception:  # noqa: BLE001 - a broken file object is just not seekable
            return False


class FullReads(io.RawIOBase):
    """A seekable file object read whole-heartedly: ``read(n)`` gives ``n`` bytes unless the
    file ends first, however few each read of the object underneath answers (decoders take a
    short read for the end of the file). Closing it leaves the caller's object open."""

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self.inner = inner

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.inner.read()
        parts, left = [], size
        while left > 0:
            part = self.inner.read(left)
            if not part:
                break
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)


class HeadKept:
    """A file object that cannot seek, read through for a streaming reader (PyAV), keeping its
    first ``size`` bytes in ``head`` (a WAV header's sizes, judged once the reader is done)."""

    def __init__(self, inner: BinaryIO, size: int = 4096) -> None:
        self.inner, self.size, self.head = inner, size, b""

    def read(self, n: int = -1) -> bytes:
        data = self.inner.read(n)
        if len(self.head) < self.size and data:
            self.head += bytes(data[: self.size - len(self.head)])
        return data


def sources(files: Iterable[Any], what: str) -> list[Source]:
    """Each item as a :class:`Source`; paths are checked here, before anything is decoded."""
    if isinstance(files, (str, bytes, bytearray, memoryview, os.PathLike)) or hasattr(files, "read"):
        raise TypeError(f"files must be a sequence of {what}, got a single {type(files).__name__}; wrap it in a list")
    check_batch(files, "files")
    return _read_repeated([_source(i, item) for i, item in enumerate(files)])


def _read_repeated(items: list[Source]) -> list[Source]:
    """Items sharing one file object get its bytes, read once (from its start when it seeks)."""
    counts = Counter(id(s.stream) for s in items if s.stream is not None)
    read: dict[int, bytes] = {}
    out = []
    for s in items:
        if s.stream is not None and counts[id(s.stream)] > 1:
            key = id(s.stream)
            if key not in read:
                read[key] = s.read_all()
            if not read[key]:
                raise s.fail("the file object is empty")
            s = dataclasses.replace(s, data=read[key], stream=None)
        out.append(s)
    return out


def _source(i: int, item: Any) -> Source:
    if isinstance(item, (str, os.PathLike)):
        path = os.fspath(item)
        if not isinstance(path, str):
            raise InputError(i, "a path must be str, not bytes", repr(path))
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise InputError(i, "no such file", path) from None
        except OSError as exc:
            raise InputError(i, f"cannot read the file ({exc.strerror})", path) from None
        if stat.S_ISDIR(st.st_mode):
            raise InputError(i, "is a directory, not a file", path)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(i, "is not a regular file", path)
        if st.st_size == 0:
            raise InputError(i, "the file is empty", path)
        return Source(i, path)
    if isinstance(item, (bytes, bytearray, memoryview)):
        check_not_released(i, item)
        data = bytes(item)
        if not data:
            raise InputError(i, "the bytes are empty")
        return Source(i, None, data=data)
    if hasattr(item, "read"):
        name = getattr(item, "name", None)
        name = name if isinstance(name, str) else None
        if isinstance(item, io.TextIOBase):
            raise InputError(i, "the file object is in text mode; open it with 'rb'", name)
        if getattr(item, "closed", False) is True:
            raise InputError(i, "the file object is closed", name)
        return Source(i, name, stream=item)
    raise InputError(i, f"expected a path, bytes or a binary file object, got {type(item).__name__}")
