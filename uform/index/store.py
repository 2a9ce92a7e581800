"""The index's files: an SQLite database (WAL) of what was embedded, and the vectors beside it.

``INDEX/`` holds ``index.sqlite`` (tables ``meta``, ``items``, ``failed``, ``texts``),
``vectors-G.bin`` (one fixed-size row per slot, in the index's scalar) and ``kinds-G.bin``
(a modality byte per slot), ``G`` the generation that compaction advances, and ``lock``.

Crash safety rests on one rule: the bytes of a slot below ``meta.slots`` never change within a
generation. A writer appends rows past the committed slots, ``fdatasync``s them, then commits
the rows that point at them together with the new ``slots`` in one SQLite transaction; a
writer killed before the commit leaves bytes past ``slots`` that the next writer cuts off. A
reader takes an SQLite read transaction (a snapshot), reads ``slots`` and the generation, and
maps that many rows: whatever a writer does meanwhile, it sees one committed state. One writer
at a time holds ``lock`` (``flock``, released by the kernel when a writer dies).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..core.errors import UformError
from ..core.types import Scalar
from . import ivf

FORMAT = "uform-index/1"
DATABASE = "index.sqlite"
MODALITIES = ("text", "image", "video", "audio")  # a slot's kind byte is the position here
SCALARS = (Scalar.F32, Scalar.F16, Scalar.BF16, Scalar.I8, Scalar.B1)

ITEMS = "(slot INTEGER PRIMARY KEY, path TEXT NOT NULL, size INTEGER, mtime INTEGER, hash BLOB NOT NULL, text TEXT)"
SCHEMA = f"""
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE items{ITEMS};
CREATE TABLE failed(path TEXT PRIMARY KEY, size INTEGER, mtime INTEGER, reason TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE texts(path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime INTEGER NOT NULL) WITHOUT ROWID;
"""


NEW_DATABASE = DATABASE + ".new"  # a database being created, renamed to DATABASE once whole
CREATION = ("lock", NEW_DATABASE, *(NEW_DATABASE + s for s in ("-journal", "-wal", "-shm")))  # a creation's files


def generation_files(generation: int) -> tuple[str, ...]:
    """The files of one generation: its rows, its kind bytes, its IVF lists (and their temporary)."""
    return (f"vectors-{generation}.bin", f"kinds-{generation}.bin", f"ivf-{generation}.npz", f"ivf-{generation}.tmp")


def refuse_foreign(folder: Path) -> None:
    """An index is made in a new or empty folder: refuse one that holds anything but a creation's own files."""
    try:
        found = sorted(p.name for p in folder.iterdir() if p.name not in CREATION)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise IndexFormatError(f"{folder}: is a file, not an index folder; give a new or empty folder to --into") from None
    if found:
        shown = ", ".join(repr(n) for n in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise IndexFormatError(f"{folder}: not a uform index, and not empty (it holds {shown}): an index is made in a new or "
                               "empty folder, which it owns; give another folder to --into")  # fmt: skip


class IndexFormatError(UformError, ValueError):
    """Not a uform index, an index of another format version, or a damaged one."""


class IndexModelError(UformError, ValueError):
    """The index was made by another model (checkpoint, quantization or scalar) than the one given."""


class IndexBusyError(UformError):
    """Another writer is updating the index."""


@dataclass(frozen=True)
class Identity:
    """What made an index's vectors: rows of two identities are never compared."""

    checkpoint_sha256: str
    checkpoint: str  # the checkpoint's path when the index was made, for messages
    quantization: str
    dimensions: int
    scalar: str

    def describe(self) -> str:
        dimensions = f"{self.dimensions} dimensions, " if self.dimensions else ""
        return f"{self.checkpoint} (sha256 {self.checkpoint_sha256[:12]}…, {self.quantization} weights, {dimensions}{self.scalar} vectors)"


def row_dtype(scalar: Scalar, dimensions: int) -> np.dtype[Any]:
    """One stored row: the vector in ``scalar`` (I8 with its float32 scale after it; B1 packed bits)."""
    if scalar is Scalar.F32:
        return np.dtype((np.float32, (dimensions,)))
    if scalar is Scalar.F16:
        return np.dtype((np.float16, (dimensions,)))
    if scalar is Scalar.BF16:
        return np.dtype((ml_dtypes.bfloat16, (dimensions,)))
    if scalar is Scalar.I8:
        return np.dtype([("q", np.int8, (dimensions,)), ("s", "<f4")])
    if scalar is Scalar.B1:
        return np.dtype((np.uint8, ((dimensions + 7) // 8,)))
    raise ValueError(f"an index stores F32, F16, BF16, I8 or B1 vectors; got {scalar.name}")


class Store:
    """The open files of one index; ``write=True`` takes the writer's lock."""

    def __init__(self, folder: str | os.PathLike[str], *, write: bool, identity: Identity | None = None) -> None:
        self.folder = Path(folder)
        self.write = write
        self._lock_fd = -1
        self._files: dict[str, Any] = {}
        db = self.folder / DATABASE
        if write:
            fresh = not db.exists()
            if fresh and identity is None:
                raise FileNotFoundError(f"{self.folder}: no such index")
            if fresh:
                refuse_foreign(self.folder)
            else:
                self._refuse_empty(db)
            self.folder.mkdir(parents=True, exist_ok=True)
            self._take_lock()
            if fresh:
                assert identity is not None
                self._create(db, identity)
            self.conn = self._connect(db, write=True)
            if not self._has_meta():
                self.close()
                raise self._damaged(f"{DATABASE} holds no meta table")
        else:
            if not db.is_file():
                what = "is not a uform index (no index.sqlite in it)" if self.folder.is_dir() else "no such index"
                raise FileNotFoundError(f"{self.folder}: {what}")
            self._refuse_empty(db)
            self.conn = self._connect(db, write=False)
        self.meta = self._read_meta()
        self.identity = Identity(self.meta["checkpoint_sha256"], self.meta["checkpoint"], self.meta["quantization"],
                                 int(self.meta["dimensions"]), self.meta["scalar"])  # fmt: skip
        self.scalar = Scalar(self.identity.scalar)
        self.dtype = row_dtype(self.scalar, self.identity.dimensions)
        if write:
            self._recover()

    # -- opening ---------------------------------------------------------------------------

    def _refuse_empty(self, db: Path) -> None:
        """An emptied database is damage (SQLite would take it for a new one, and write it)."""
        if db.is_file() and db.stat().st_size == 0:
            raise self._damaged(f"{DATABASE} is empty")

    def _take_lock(self) -> None:
        try:
            fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OSError(exc.errno, f"{self.folder}: cannot write the index ({exc.strerror}); it is left as it was") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise IndexBusyError(f"{self.folder}: another writer (a `uform index` run or an Index) is updating this index; "
                                 "wait for it to finish and run again") from None  # fmt: skip
        self._lock_fd = fd

    def _connect(self, db: Path, *, write: bool) -> sqlite3.Connection:
        try:
            if write:
                conn = sqlite3.connect(db, timeout=30, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes effect on a new database only: pages a compaction frees go back
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            else:
                conn = self._reader(db)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as exc:  # a file it may not open or write, a disk that is full
            raise OSError(f"{self.folder}: cannot open the index{' for writing' if write else ''} ({exc}); it is left as it was") from None
        except sqlite3.DatabaseError as exc:
            raise self._damaged(f"{DATABASE} cannot be read ({exc})") from None

    @staticmethod
    def _reader(db: Path) -> sqlite3.Connection:
        """A read-only connection; in a folder it may not write (WAL needs its -shm file), the
        database as it is on disk (``immutable``)."""
        uri = f"file:{db}?mode=ro"
        if not os.access(db.parent, os.W_OK) and not (db.parent / (db.name + "-shm")).exists():
            uri += "&immutable=1"
        return sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None, check_same_thread=False)

    def _has_meta(self) -> bool:
        return bool(self.conn.execute("SELECT count(*) FROM sqlite_master WHERE name='meta'").fetchone()[0] == 1)

    def _create(self, db: Path, identity: Identity) -> None:
        """Make the database under a name of its own (``index.sqlite.new``), whole, then rename it:
        an ``index.sqlite`` without its tables is always damage, never a creation cut short."""
        from .. import __version__

        row_dtype(Scalar(identity.scalar), identity.dimensions)  # refuses a scalar the index does not store
        meta = {"format": FORMAT, "uform": __version__, "generation": "0", "slots": "0", **{k: str(v) for k, v in vars(identity).items()}}
        new = db.with_name(NEW_DATABASE)
        for name in CREATION[1:]:  # a creation killed before its rename (refuse_foreign let no other file be here)
            (self.folder / name).unlink(missing_ok=True)
        conn = self._connect(new, write=True)
        try:
            conn.execute("BEGIN IMMEDIATE")
            for statement in SCHEMA.strip().split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
            conn.execute("COMMIT")
        finally:
            conn.close()  # checkpoints the WAL into the file and removes it
        os.replace(new, db)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _damaged(self, why: str) -> IndexFormatError:
        return IndexFormatError(f"{self.folder}: the index is damaged: {why}; move it away and run `uform index ... --into {self.folder}` "
                                "to build it again")  # fmt: skip

    def _read_meta(self) -> dict[str, str]:
        try:
            meta = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise self._damaged(f"{DATABASE}'s tables cannot be read ({exc})") from None
        if meta.get("format") != FORMAT:
            raise IndexFormatError(f"{self.folder}: an index of format {meta.get('format')!r}, which this uform does not read "
                                   f"(it reads {FORMAT!r}); build it again with `uform index ... --into NEW`")  # fmt: skip
        missing = {"checkpoint_sha256", "checkpoint", "quantization", "dimensions", "scalar", "generation", "slots"} - set(meta)
        if missing:
            raise self._damaged(f"{DATABASE}'s meta table lacks {', '.join(sorted(missing))}")
        return meta

    def _path(self, name: str, generation: int) -> Path:
        return self.folder / f"{name}-{generation}.bin"

    def _recover(self) -> None:
        """A writer's start: refuse damage; cut what a killed writer appended past the committed
        slots; and delete the files of the generation a compaction recorded in ``meta.next``
        before writing them (a compaction killed before its commit), or of the one before it (one
        killed after). No other file in the folder is ever deleted."""
        generation, slots = self.state()
        files = {}
        for name, width in (("vectors", self.dtype.itemsize), ("kinds", 1)):
            path = self._path(name, generation)
            if not path.exists():
                if slots:
                    raise self._damaged(f"{path.name} is missing; the database says it holds {slots} rows")
                files[name] = open(path, "w+b")  # an index with no rows yet: nothing lost
                continue
            size = path.stat().st_size
            if size < slots * width:
                raise self._damaged(f"{path.name} holds {size // width} rows, the database says {slots}")
            files[name] = path
        for name, width in (("vectors", self.dtype.itemsize), ("kinds", 1)):
            f = files[name] if not isinstance(files[name], Path) else open(files[name], "r+b")
            f.truncate(slots * width)
            self._files[name] = f
        recorded = self.meta.get("next")
        if recorded is not None and recorded.isdigit():
            other = int(recorded) - 1 if int(recorded) == generation else int(recorded)
            if other != generation:
                for name in generation_files(other):
                    (self.folder / name).unlink(missing_ok=True)

    def check_slots(self, slots: int) -> None:
        """Refuse a database whose items point past the committed slots (``meta.slots`` lowered)."""
        top = self.conn.execute("SELECT max(slot), min(slot) FROM items").fetchone()
        if top[0] is not None and (top[0] >= slots or top[1] < 0):
            raise self._damaged(f"{DATABASE}'s items use slot {top[0] if top[0] >= slots else top[1]}, outside the {slots} rows meta.slots says")

    # -- state ------------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``), committed at the end, rolled back on error."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query inside sees one committed state."""
        own = not self.conn.in_transaction
        if own:
            self.conn.execute("BEGIN")
        try:
            yield self.conn
        finally:
            if own:
                self.conn.execute("COMMIT")

    def state(self) -> tuple[int, int]:
        """(generation, committed slots), as the current transaction sees them."""
        rows = dict(self.conn.execute("SELECT key, value FROM meta WHERE key IN ('generation', 'slots')").fetchall())
        try:
            generation, slots = int(rows["generation"]), int(rows["slots"])
        except (KeyError, ValueError, TypeError):
            raise self._damaged(f"{DATABASE}'s meta.generation and meta.slots are not counts ({rows})") from None
        if generation < 0 or slots < 0:
            raise self._damaged(f"{DATABASE}'s meta.generation and meta.slots are not counts ({rows})")
        self.check_slots(slots)
        return generation, slots

    def vectors(self, generation: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``slots`` rows and kind bytes of ``generation``, mapped read-only (never
        copied); what a snapshot that read (generation, slots) may use. ``FileNotFoundError``
        when a compaction replaced the generation meanwhile (take a new snapshot);
        :class:`IndexFormatError` for a file missing, short, or holding a kind byte that is none."""
        if slots == 0:
            return np.zeros(0, self.dtype), np.zeros(0, np.uint8)
        mapped = []
        for name, dtype, width in (("vectors", self.dtype, self.dtype.itemsize), ("kinds", np.dtype(np.uint8), 1)):
            path = self._path(name, generation)
            try:
                size = path.stat().st_size
                if size < slots * width:
                    raise self._damaged(f"{path.name} holds {size // width} rows, the database says {slots}")
                mapped.append(np.memmap(path, dtype, "r", shape=(slots,)))
            except FileNotFoundError:
                if self._current_generation() == generation:
                    raise self._damaged(f"{path.name} is missing; the database says it holds {slots} rows") from None
                raise  # a compaction replaced the generation: the caller takes a new snapshot
        rows, kinds = mapped
        bad = np.flatnonzero(kinds >= len(MODALITIES))
        if len(bad):
            raise self._damaged(f"{self._path('kinds', generation).name} holds {int(kinds[bad[0]])} at slot {int(bad[0])}, "
                                f"which is no modality (0-{len(MODALITIES) - 1})")  # fmt: skip
        return rows, kinds

    def _current_generation(self) -> int | None:
        """The generation committed now, seen outside this connection's snapshot (None: unreadable)."""
        try:
            conn = self._reader(self.folder / DATABASE)
            try:
                row = conn.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
            finally:
                conn.close()
            return int(row[0]) if row else None
        except (sqlite3.Error, ValueError):
            return None

    # -- writing (the writer only) --------------------------------------------------------------

    def append(self, rows: np.ndarray, kinds: np.ndarray, at: int) -> None:
        """Write rows (of ``self.dtype``) and their kind bytes at slot ``at`` (past the committed
        slots), and make them durable; the caller then commits the items that point at them."""
        for name, data, width in (("vectors", rows, self.dtype.itemsize), ("kinds", kinds.astype(np.uint8), 1)):
            f = self._files[name]
            f.seek(at * width)
            f.write(np.ascontiguousarray(data).tobytes())
            f.flush()
            os.fdatasync(f.fileno())

    def compact(self, order: np.ndarray | None = None, lists: ivf.Lists | None = None) -> int:
        """Rewrite the live rows into the next generation, in slot order or in ``order`` (a
        permutation of the live slots; ``lists`` then names its IVF lists, saved and committed
        with it); answer the rows of removed items dropped. Readers holding the old generation
        keep reading it; new snapshots see the new one, whole."""
        generation, slots = self.state()
        live = np.array([s for (s,) in self.conn.execute("SELECT slot FROM items ORDER BY slot")], np.int64)
        if order is None and len(live) == slots:
            return 0
        order = live if order is None else order
        rows, kinds = self.vectors(generation, slots)
        new = generation + 1
        with self.transaction() as c:  # recorded before they are written: only files the index names are ever deleted
            c.execute("INSERT OR REPLACE INTO meta VALUES ('next', ?)", (str(new),))
        files = {}
        for name, data in (("vectors", rows), ("kinds", kinds)):
            f = open(self._path(name, new), "w+b")
            for start in range(0, len(order), 1 << 16):
                f.write(np.ascontiguousarray(data[order[start : start + (1 << 16)]]).tobytes())
            f.flush()
            os.fsync(f.fileno())
            files[name] = f
        if lists is not None:
            ivf.save(lists, self.folder / f"ivf-{new}.npz")
        with self.transaction() as c:
            c.execute("CREATE TEMP TABLE IF NOT EXISTS remap(old INTEGER PRIMARY KEY, new INTEGER NOT NULL)")
            c.execute("DELETE FROM remap")
            c.executemany("INSERT INTO remap VALUES (?, ?)", ((int(s), i) for i, s in enumerate(order)))
            c.execute(f"CREATE TABLE items_new{ITEMS}")
            c.execute("INSERT INTO items_new SELECT remap.new, path, size, mtime, hash, text FROM items JOIN remap ON items.slot = remap.old")
            c.execute("DROP TABLE items")
            c.execute("ALTER TABLE items_new RENAME TO items")
            c.executemany("UPDATE meta SET value = ? WHERE key = ?", ((str(new), "generation"), (str(len(live)), "slots")))
            c.execute("DELETE FROM meta WHERE key = 'ivf'")  # lists name one generation's order
            if lists is not None:
                c.execute("INSERT INTO meta VALUES ('ivf', ?)", (f"ivf-{new}.npz",))
        for name, f in files.items():
            self._files[name].close()
            self._files[name] = f
            self._path(name, generation).unlink(missing_ok=True)
        (self.folder / f"ivf-{generation}.npz").unlink(missing_ok=True)
        self.conn.executescript("PRAGMA incremental_vacuum;")  # stepped to its end (execute() gives back one page)
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # a compaction's transaction is as large as the table
        return slots - len(live)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        self.conn.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
