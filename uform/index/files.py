"""The row files of an index: ``vectors-G.bin`` (one fixed-size row per slot, in the index's
scalar) and ``kinds-G.bin`` (a modality byte per slot) of generation ``G``, and the folder's
other own names. The database (store.py) says how many rows are committed; this module only
reads, appends, cuts and rewrites the files, and names what is wrong with them.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..core import files
from .identity import MODALITIES, IndexBusyError, IndexFormatError

DATABASE = "index.sqlite"
NEW_DATABASE = DATABASE + ".new"  # a database being created, renamed to DATABASE once whole
CREATION = ("lock", NEW_DATABASE, *(NEW_DATABASE + s for s in ("-journal", "-wal", "-shm")))  # a creation's files
BLOCK = 1 << 16


def cannot_write(folder: Path, why: object) -> OSError:
    """A write of the index refused by the system (a full disk, a file size limit, permissions)."""
    return OSError(f"{folder}: cannot write the index ({why}); what was committed stays")


def generation_files(generation: int) -> tuple[str, ...]:
    """The files of one generation: its rows, its kind bytes, its IVF lists (and the name an
    earlier uform wrote them under first; now core.files' temporary, found by ``files.leftovers``)."""
    return (f"vectors-{generation}.bin", f"kinds-{generation}.bin", f"ivf-{generation}.npz", f"ivf-{generation}.tmp")


def refuse_foreign(folder: Path, leftover: Callable[[Path], bool]) -> None:
    """An index is made in a new or empty folder: refuse one that holds anything but ``lock`` and
    what a creation cut short left (``leftover(index.sqlite.new)`` proves the database its own)."""
    try:
        own = CREATION if leftover(folder / NEW_DATABASE) else CREATION[:1]
        found = sorted(p.name for p in folder.iterdir() if p.name not in own)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise IndexFormatError(f"{folder}: is a file, not an index folder; give a new or empty folder to --into") from None
    if found:
        shown = ", ".join(repr(n) for n in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise IndexFormatError(f"{folder}: not a uform index, and not empty (it holds {shown}): an index is made in a new or "
                               "empty folder, which it owns; give another folder to --into")  # fmt: skip


def take_lock(folder: Path) -> int:
    """The writer's lock: ``flock`` on ``lock`` (released by the kernel when a writer dies); answers its descriptor."""
    try:
        fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        error = OSError(f"{folder}: cannot write the index ({exc.strerror}); it is left as it was")
        error.errno = exc.errno
        raise error from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise IndexBusyError(f"{folder}: another writer (a `uform index` run or an Index) is updating this index; "
                             "wait for it to finish and run again") from None  # fmt: skip
    return fd


def write_all(f: Any, data: bytes) -> None:
    """Write ``data`` whole through the unbuffered file ``f`` (a write may take part of it). Row
    files are unbuffered: a write the system refuses leaves no buffer that their close would
    try again, and raise from, in place of the first error."""
    view = memoryview(data)
    while view:
        view = view[f.write(view) :]


class Rows:
    """The row files of one folder; ``damaged(why)`` makes the error a damaged index raises."""

    def __init__(self, folder: Path, dtype: np.dtype[Any], damaged: Callable[[str], IndexFormatError]) -> None:
        self.folder, self.dtype, self.damaged = folder, dtype, damaged
        self._files: dict[str, Any] = {}  # the writer's open files of the current generation

    def path(self, name: str, generation: int) -> Path:
        return self.folder / f"{name}-{generation}.bin"

    def _widths(self) -> tuple[tuple[str, np.dtype[Any]], ...]:
        return (("vectors", self.dtype), ("kinds", np.dtype(np.uint8)))

    def open_for_writing(self, generation: int, slots: int) -> None:
        """A writer's start: refuse a file missing or short; then cut what a killed writer appended
        past ``slots`` (never a committed row). A missing file of an index with no rows is made."""
        found = {}
        for name, dtype in self._widths():
            path = self.path(name, generation)
            if not path.exists():
                if slots:
                    raise self.damaged(f"{path.name} is missing; the database says it holds {slots} rows")
                continue
            size = path.stat().st_size
            if size < slots * dtype.itemsize:
                raise self.damaged(f"{path.name} holds {size // dtype.itemsize} rows, the database says {slots}")
            found[name] = path
        if slots:
            self.check_kinds(np.memmap(found["kinds"], np.uint8, "r", shape=(slots,)), generation)
        for name, dtype in self._widths():
            f = open(found[name] if name in found else self.path(name, generation), "r+b" if name in found else "w+b", buffering=0)
            f.truncate(slots * dtype.itemsize)
            self._files[name] = f

    def check_kinds(self, kinds: np.ndarray, generation: int) -> None:
        bad = np.flatnonzero(kinds >= len(MODALITIES))
        if len(bad):
            raise self.damaged(f"{self.path('kinds', generation).name} holds {int(kinds[bad[0]])} at slot {int(bad[0])}, "
                               f"which is no modality (0-{len(MODALITIES) - 1})")  # fmt: skip

    def map(self, generation: int, slots: int, current: Callable[[], int | None]) -> tuple[np.ndarray, np.ndarray]:
        """The first ``slots`` rows and kind bytes of ``generation``, mapped read-only.
        ``FileNotFoundError`` when ``current()`` says a compaction replaced the generation
        meanwhile; :class:`IndexFormatError` for a file missing, short, or a kind byte that is none."""
        if slots == 0:
            return np.zeros(0, self.dtype), np.zeros(0, np.uint8)
        mapped = []
        for name, dtype in self._widths():
            path = self.path(name, generation)
            try:
                size = path.stat().st_size
                if size < slots * dtype.itemsize:
                    raise self.damaged(f"{path.name} holds {size // dtype.itemsize} rows, the database says {slots}")
                mapped.append(np.memmap(path, dtype, "r", shape=(slots,)))
            except FileNotFoundError:
                if current() == generation:
                    raise self.damaged(f"{path.name} is missing; the database says it holds {slots} rows") from None
                raise  # a compaction replaced the generation: the caller takes a new snapshot
        rows, kinds = mapped
        self.check_kinds(kinds, generation)
        return rows, kinds

    def append(self, rows: np.ndarray, kinds: np.ndarray, at: int) -> None:
        """Write rows and their kind bytes at slot ``at`` (past the committed slots), durably."""
        for (name, dtype), data in zip(self._widths(), (rows, kinds.astype(np.uint8)), strict=True):
            f = self._files[name]
            try:
                f.seek(at * dtype.itemsize)
                write_all(f, np.ascontiguousarray(data).tobytes())
                files.sync(f, data_only=True)
            except OSError as exc:  # what it wrote lies past the committed slots: the next writer cuts it off
                raise cannot_write(self.folder, f"{os.path.basename(f.name)}: {exc.strerror or exc}") from None

    def write_generation(self, generation: int, rows: np.ndarray, kinds: np.ndarray, order: np.ndarray) -> dict[str, Any]:
        """The rows of ``order`` written, durably, as generation ``generation``; answers the open files."""
        written = {}
        for name, data in (("vectors", rows), ("kinds", kinds)):
            path = self.path(name, generation)
            try:
                f = open(path, "w+b", buffering=0)
                written[name] = f
                for start in range(0, len(order), BLOCK):
                    write_all(f, np.ascontiguousarray(data[order[start : start + BLOCK]]).tobytes())
                files.sync(f)
            except OSError as exc:  # meta.next names the generation: the next writer deletes its files
                for opened in written.values():
                    opened.close()
                raise cannot_write(self.folder, f"{path.name}: {exc.strerror or exc}") from None
        return written

    def switch(self, opened: dict[str, Any], old: int) -> None:
        """After the commit of a new generation: its files are the writer's; ``old``'s are deleted."""
        for name, f in opened.items():
            self._files[name].close()
            self._files[name] = f
        self.delete_generation(old)

    def delete_generation(self, generation: int) -> None:
        for name in generation_files(generation):
            (self.folder / name).unlink(missing_ok=True)
        for left in files.leftovers(self.folder / f"ivf-{generation}.npz"):  # its lists' temporary, left by a kill
            left.unlink(missing_ok=True)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
