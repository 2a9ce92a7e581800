"""Output files written whole or not at all; the one place uform writes what a user keeps.

The rule (docs/cli.md, "Files uform writes"): every output is written under a temporary name in
its own folder (``.NAME.XXXXXXXX.partial``), flushed, fsynced and checked to hold every byte
written, and only then renamed over the old file. The temporary's name says who writes it (its
machine, process id and that process's start time: :func:`writer`), so that a later write into
the same folder removes the temporaries a killed writer left (:func:`sweep`), never one whose
writer may still run. A *set* of files (an encode output, an export)
is written the same way, all of it first; only when every member is written are they renamed
into place one after another, the member that names the others (the manifest) last, so that a
reader who checks the members against the manifest never takes a mixed set for a whole one. A
failure of any write (a size limit, a full disk, a read-only file) leaves every old file as it
was, removes the temporary ones and folders made for the set, and raises :class:`OutputError`
naming the file. A file is never written through: a symbolic link is followed to the file it
names, and what is not a regular file (a device, a FIFO, a folder) is refused.

This module is the only one that renames files into place or syncs them to disk (``os.replace``,
``os.rename``, ``os.fsync``: tests/test_architecture.py holds every other module to it). A writer
that keeps its own files open and grows them in place (the index's row files) syncs them with
:func:`sync`; a file written under a name of its own (an SQLite database) is put in place with
:func:`move`; what a killed writer left beside a target is found by :func:`leftovers`.

How a temporary's name says its writer, the sweep of a killed writer's, what a killed writer
left beside a target and a process's own scratch folder are :mod:`uform.core.leftovers`
(``PARTIAL``, ``NAME_MAX``, ``writer``, ``sweep``, ``target``, ``leftovers`` and ``own_folder``
are importable from here too); :class:`OutputError` is :mod:`uform.core.errors`' (and here too).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from .errors import OutputError, reason_of
from .leftovers import NAME_MAX, PARTIAL, leftovers, own_folder, stem, sweep, target, token, writer

__all__ = [
    "NAME_MAX", "PARTIAL", "OutputError", "Outputs", "check_replaceable", "leftovers", "move", "own_folder",
    "refuse_foreign", "sweep", "sync", "target", "write_bytes", "write_with", "writer",
]  # fmt: skip


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`OutputError` unless ``path`` can be written: its folder exists, and what is
    there is nothing or a regular file that is not read-only (no write permission bit, or no
    access to write it: a file marked read-only is left alone even by root)."""
    shown, real = Path(path), target(path)
    if not real.parent.is_dir():
        raise OutputError(f"{shown}: no such folder {real.parent}")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"{shown}: cannot be replaced ({reason_of(exc)})") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{shown}: not a regular file ({real}); not replaced")
    if not st.st_mode & 0o222 or not os.access(real, os.W_OK):
        raise OutputError(f"{shown}: read-only; left as it was (make it writable, or write elsewhere)")


def refuse_foreign(path: str | os.PathLike[str], ours: Callable[[Path], bool], force: bool, what: str) -> None:
    """Raise :class:`OutputError` when ``path`` exists, ``ours(path)`` says uform did not write it
    (``what`` says what it would have been) and ``force`` is not given."""
    p = Path(path)
    if force or not (p.exists() or p.is_symlink()) or ours(p):
        return
    raise OutputError(f"{p}: exists and is not {what}; not replaced (--force replaces it)")


class Outputs:
    """A set of output files, written whole or not at all (the module's rule).

    ``with Outputs() as out:`` then ``with out.open(path) as f:`` (or ``out.path(path)`` for a
    library that writes by name, or ``out.adopt(written, path)`` for a file written elsewhere in
    the same file system); the files are renamed into place, in the order they were named, when
    the ``with`` ends without an error, and removed when it ends with one. ``out.folder(path)``
    makes a folder the set needs; a folder it made is removed again when the set is discarded.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path, Path]] = []  # (temporary, target, as named)
        self._made: list[Path] = []
        self._remove: list[Path] = []
        self._scratch: list[Path] = []
        self._swept: set[Path] = set()  # folders whose killed writers' temporaries were removed

    def folder(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        missing = [q for q in (p, *p.parents) if not q.exists()]
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{p}: the folder cannot be made ({reason_of(exc)})") from None
        if not p.is_dir():
            raise OutputError(f"{p}: not a folder")
        self._made.extend(missing)  # deepest first: removed in this order
        return p

    def path(self, path: str | os.PathLike[str]) -> Path:
        """A temporary name beside ``path`` for a writer that takes a name; renamed at the end."""
        check_replaceable(path)
        real = target(path)
        self._sweep(real.parent)
        temporary = real.parent / f".{stem(real.name)}.{token()}{PARTIAL}"
        self._pending.append((temporary, real, Path(path)))
        return temporary

    def _sweep(self, folder: Path) -> None:
        if folder not in self._swept:
            self._swept.add(folder)
            sweep(folder)

    @contextmanager
    def open(self, path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
        """The temporary file of ``path``, open for writing; checked whole when the block ends."""
        temporary = self.path(path)
        try:
            f = open(temporary, "xb")
        except OSError as exc:
            raise OutputError(f"{path}: cannot be written ({reason_of(exc)})") from None
        with f:
            try:
                yield f
                f.flush()
                _whole(f.fileno(), f.tell(), Path(path))
            except OSError as exc:
                raise self._failed(Path(path), exc) from None

    def scratch(self, folder: str | os.PathLike[str]) -> Path:
        """A hidden empty folder inside ``folder`` for a writer that makes several files by name
        (their ``adopt``-ed names inside it are renamed out); removed when the set ends."""
        self._sweep(target(folder))
        try:
            made = Path(folder) / f".{token()}{PARTIAL}"
            made.mkdir()
        except OSError as exc:
            raise OutputError(f"{folder}: cannot be written ({reason_of(exc)})") from None
        self._scratch.append(made)
        return made

    def adopt(self, written: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
        """``written`` (in the same file system) becomes ``path`` at the end."""
        check_replaceable(path)
        self._pending.append((Path(written), target(path), Path(path)))

    def remove(self, path: str | os.PathLike[str]) -> None:
        """An old file that leaves when the set is in place (a member the new set lacks)."""
        self._remove.append(Path(path))

    def _failed(self, shown: Path, exc: BaseException) -> OutputError:
        if isinstance(exc, OutputError):
            return exc
        old = "the old file is as it was" if target(shown).exists() else "nothing was left"
        return OutputError(f"{shown}: not written ({reason_of(exc)}); {old}")

    def commit(self) -> None:
        try:
            self._commit()
        except BaseException:  # a Ctrl-C too: what is not in place yet goes
            self.discard()
            raise

    def _commit(self) -> None:
        for temporary, real, shown in self._pending:
            try:
                fd = os.open(temporary, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if real.exists():  # the old file's permissions carry over
                    os.chmod(temporary, stat.S_IMODE(os.stat(real).st_mode))
            except OSError as exc:
                raise self._failed(shown, exc) from None
        folders: set[Path] = set()
        while self._pending:
            temporary, real, _ = self._pending[0]
            os.replace(temporary, real)
            folders.add(real.parent)
            self._pending.pop(0)
        for old in self._remove:
            old.unlink(missing_ok=True)
        for folder in folders:
            _sync_folder(folder)
        self._made = []
        self._drop_scratch()

    def _drop_scratch(self) -> None:
        for made in self._scratch:
            shutil.rmtree(made, ignore_errors=True)
        self._scratch = []

    def discard(self) -> None:
        for temporary, _, _ in self._pending:
            try:
                if temporary.is_dir():
                    continue
                temporary.unlink(missing_ok=True)
            except OSError:
                pass
        self._pending = []
        self._drop_scratch()
        for made in self._made:
            try:
                made.rmdir()
            except OSError:  # not empty (something else was put there), or gone
                pass
        self._made = []

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            self.commit()
        else:
            self.discard()


def _whole(fd: int, written: int, shown: Path) -> None:
    """fsync ``fd`` and check that the file holds the ``written`` bytes (a size limit can cut a
    write short without an error reaching the writer)."""
    os.fsync(fd)
    size = os.fstat(fd).st_size
    if size != written:
        raise OutputError(f"{shown}: not written (the file holds {size} of its {written} bytes: a file size limit?); "
                          f"{'the old file is as it was' if target(shown).exists() else 'nothing was left'}")  # fmt: skip


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a folder
        pass
    finally:
        os.close(fd)


def sync(f: BinaryIO | int, *, data_only: bool = False) -> None:
    """Flush ``f`` (a file object or a descriptor) to the disk: its data and size, and with
    ``data_only`` False its other metadata too (``fdatasync`` against ``fsync``)."""
    if not isinstance(f, int):
        f.flush()
        f = f.fileno()
    (os.fdatasync if data_only else os.fsync)(f)


def move(written: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """``written`` (a whole file, in ``path``'s file system) synced and renamed to ``path``;
    on a failure it is removed and :class:`OutputError` names ``path``."""
    try:
        with Outputs() as out:
            out.adopt(written, path)
    except BaseException:
        Path(written).unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all."""
    with Outputs() as out, out.open(path) as f:
        f.write(data)


def write_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """``write(f)`` into ``path``'s temporary file; renamed over ``path`` once whole."""
    with Outputs() as out, out.open(path) as f:
        write(f)
