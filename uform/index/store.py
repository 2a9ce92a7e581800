"""The index's database, and the one rule that makes it crash-safe; every SQL statement of the index.

``INDEX/`` holds ``index.sqlite`` (WAL; tables ``meta``, ``items``, ``failed``, ``texts``), the
row files of files.py (``vectors-G.bin``, ``kinds-G.bin``), ``ivf-G.npz`` for a clustered index,
and ``lock``. ``G`` is the generation that a compaction advances.

Crash safety rests on one rule, kept by :meth:`Store.commit` (the one way rows go in): the bytes
of a slot below ``meta.slots`` never change within a generation. A writer appends rows past the
committed slots, ``fdatasync``s them, then commits the items that point at them together with
the new ``slots`` in one SQLite transaction; a writer killed before the commit leaves bytes past
``slots`` that the next writer cuts off. A reader takes an SQLite read transaction (a snapshot),
reads ``slots`` and the generation, and maps that many rows: whatever a writer does meanwhile,
it sees one committed state. One writer at a time holds ``lock`` (``flock``, released by the
kernel when a writer dies). An SQLite error that means damage becomes :class:`IndexFormatError`
naming the file; one of the disk or the permissions an ``OSError``.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import quote
from typing import ParamSpec, TypeVar

import numpy as np

from ..core.files import move
from ..core.types import Scalar
from . import ivf
from . import files
from .files import CREATION, DATABASE, NEW_DATABASE, Rows
from .identity import FORMAT, MODALITIES, Identity, IndexBusyError, IndexFormatError, IndexModelError, row_dtype
from .records import Chunk, Failed, Insert, Known, Move, Stored
from .sources import storable

__all__ = ["FORMAT", "MODALITIES", "Chunk", "Failed", "Identity", "IndexBusyError", "IndexFormatError", "IndexModelError", "Insert",
           "Known", "Move", "Store", "refuse_foreign"]  # fmt: skip

ITEMS = "(slot INTEGER PRIMARY KEY, path TEXT NOT NULL, size INTEGER, mtime INTEGER, hash BLOB NOT NULL, text TEXT)"
SCHEMA = f"""
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE items{ITEMS};
CREATE INDEX items_path ON items(path);
CREATE INDEX items_hash ON items(hash);
CREATE TABLE removed(slot INTEGER PRIMARY KEY);
CREATE TABLE failed(path TEXT PRIMARY KEY, size INTEGER, mtime INTEGER, reason TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE texts(path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime INTEGER NOT NULL) WITHOUT ROWID;
"""
# every slot an item leaves goes into ``removed`` (until the compaction that drops its row), so
# counts and ``len`` read the removed slots, not every item; a trigger, so that no DELETE can miss it
REMOVED_TRIGGER = "CREATE TRIGGER items_removed AFTER DELETE ON items BEGIN INSERT OR IGNORE INTO removed VALUES (old.slot); END"
OWN_NAMES = {"meta", "items", "items_path", "items_hash", "removed", "items_removed", "failed", "texts"}  # sqlite_master's names of an index
DAMAGE = ("no such table", "no such column", "could not decode", "malformed", "not a database")  # OperationalErrors that are damage


def refuse_foreign(folder: Path) -> None:
    """Refuse to make an index in a folder that holds other files (files.refuse_foreign)."""
    files.refuse_foreign(folder, creation_leftover)


def creation_leftover(new: Path) -> bool:
    """Whether ``index.sqlite.new`` is what a creation killed before its rename left: empty, or a
    database of no table but the index's own (read as it is on disk, written to by nothing)."""
    try:
        if new.is_file() and new.stat().st_size == 0:
            return True
        conn = sqlite3.connect(f"file:{quote(os.fsencode(new))}?mode=ro&immutable=1", uri=True)
        try:
            names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
        finally:
            conn.close()
    except (OSError, sqlite3.Error):
        return False
    return names <= OWN_NAMES


def scopes(roots: list[str], keys: list[str], *, texts_only: bool) -> list[tuple[str, tuple[str, ...]]]:
    """SQL conditions on ``items.path``, each a lookup or a range of the path index, for the items
    at or under each of ``roots`` (absolute paths; a text file's lines ``FILE:LINE`` too) and of
    each of ``keys`` (``texts_only``: a text item's). A prefix ``P`` is the range ``[P, P with its
    last character one higher)``: SQLite compares text by its UTF-8 bytes, in code point order."""
    after = chr(ord(os.sep) + 1)
    out: list[tuple[str, tuple[str, ...]]] = []
    for r in filter(storable, roots):  # a name that is not UTF-8 names no stored item
        out += [("path = ?", (r,)), ("path >= ? AND path < ?", (r + os.sep, r + after)),
                ("path >= ? AND path < ? AND text IS NOT NULL", (r + ":", r + ";"))]  # fmt: skip
    out += [("path = ?" + (" AND text IS NOT NULL" if texts_only else ""), (k,)) for k in filter(storable, keys)]
    return out


P = ParamSpec("P")
R = TypeVar("R")


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """SQLite's errors in the store's terms: damage as IndexFormatError, the disk's as OSError."""

    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except sqlite3.Error as exc:
            store = args[0]
            assert isinstance(store, Store)
            raise store.translate(exc) from None

    return run


class Store:
    """The open database and row files of one index; ``write=True`` takes the writer's lock."""

    def __init__(self, folder: str | os.PathLike[str], *, write: bool, identity: Identity | None = None) -> None:
        self.folder = Path(folder)
        self.write = write
        self._lock_fd = -1
        self.conn: sqlite3.Connection | None = None
        db = self.folder / DATABASE
        try:
            if write:
                fresh = not db.exists()
                if fresh and identity is None:
                    raise FileNotFoundError(f"{self.folder}: no such index")
                if fresh:
                    refuse_foreign(self.folder)
                else:
                    self._refuse_empty(db)
                self.folder.mkdir(parents=True, exist_ok=True)
                self._lock_fd = files.take_lock(self.folder)
                if fresh and db.exists():  # another writer made it between the look and the lock: opened, never made again over it
                    fresh = False
                    self._refuse_empty(db)
                if fresh:
                    assert identity is not None
                    self._create(db, identity)
                self.conn = self._connect(db, write=True)
                if not self._has_meta():
                    raise self.damaged(f"{DATABASE} holds no meta table")
                self._check()
                self._upgrade()
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
            self.rows = Rows(self.folder, self.dtype, self.damaged)
            if write:
                self._recover()
        except BaseException:
            self.close()
            raise

    # -- opening ---------------------------------------------------------------------------

    def damaged(self, why: str) -> IndexFormatError:
        return IndexFormatError(f"{self.folder}: the index is damaged: {why}; move it away and run `uform index ... --into {self.folder}` "
                                "to build it again")  # fmt: skip

    def translate(self, exc: sqlite3.Error) -> Exception:
        if isinstance(exc, sqlite3.OperationalError) and not any(d in str(exc).lower() for d in DAMAGE):
            return OSError(f"{self.folder}: cannot {'write' if self.write else 'read'} the index ({exc}); what was committed stays")
        return self.damaged(f"{DATABASE} cannot be read ({exc})")

    def _refuse_empty(self, db: Path) -> None:
        """An emptied database is damage (SQLite would take it for a new one, and write it)."""
        if db.is_file() and db.stat().st_size == 0:
            raise self.damaged(f"{DATABASE} is empty")

    def _connect(self, db: Path, *, write: bool) -> sqlite3.Connection:
        try:
            if write:
                conn = sqlite3.connect(db, timeout=30, isolation_level=None, check_same_thread=False)
                if db.name == NEW_DATABASE:  # a new database: pages a compaction frees go back (setting it again writes the file)
                    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            else:
                conn = self._reader(db)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as exc:  # a file it may not open or write, a disk that is full
            if any(d in str(exc).lower() for d in DAMAGE):
                raise self.damaged(f"{DATABASE} cannot be read ({exc})") from None
            raise OSError(f"{self.folder}: cannot open the index{' for writing' if write else ''} ({exc}); it is left as it was") from None
        except sqlite3.DatabaseError as exc:
            raise self.damaged(f"{DATABASE} cannot be read ({exc})") from None

    @staticmethod
    def _reader(db: Path) -> sqlite3.Connection:
        """A read-only connection; in a folder it may not write (WAL needs its -shm file), the
        database as it is on disk (``immutable``)."""
        uri = f"file:{quote(os.fsencode(db))}?mode=ro"  # a name with ?, #, % or bytes that are not UTF-8 read as itself
        if not os.access(db.parent, os.W_OK) and not (db.parent / (db.name + "-shm")).exists():
            uri += "&immutable=1"
        return sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None, check_same_thread=False)

    @guarded
    def _has_meta(self) -> bool:
        return bool(self._db.execute("SELECT count(*) FROM sqlite_master WHERE name='meta'").fetchone()[0] == 1)

    @guarded
    def _check(self) -> None:
        """A writer's look at every page before it writes any (``PRAGMA quick_check``)."""
        found = [r[0] for r in self._db.execute("PRAGMA quick_check(3)").fetchall()]
        if found != ["ok"]:
            raise self.damaged(f"{DATABASE} fails SQLite's check ({'; '.join(map(str, found))})")

    @guarded
    def _upgrade(self) -> None:
        """What an index made by an earlier uform lacks, added by its next writer, each step one
        transaction (a writer killed in one leaves the index as it was, and the next adds it):
        items are found by path and by hash in O(log n) (each insert, move and removal looks its
        path up, and new content its hash: without them a scan of the table, a run quadratic, or
        every item's hash read), and the slots removed since the last compaction are listed
        (``removed``, filled by a trigger), so counting the items reads the removed slots alone."""
        self._db.execute("CREATE INDEX IF NOT EXISTS items_path ON items(path)")
        self._db.execute("CREATE INDEX IF NOT EXISTS items_hash ON items(hash)")
        if self._tracks_removed():
            return
        with self.transaction() as c:  # listed once, from every item: a slot below meta.slots no item holds
            _, slots = self.state()
            live = np.zeros(slots, bool)
            live[self.live()] = True
            c.execute("CREATE TABLE IF NOT EXISTS removed(slot INTEGER PRIMARY KEY)")
            c.execute("DELETE FROM removed")  # an earlier uform's compaction dropped the trigger: what it listed is stale
            c.executemany("INSERT INTO removed VALUES (?)", ((int(s),) for s in np.flatnonzero(~live)))
            c.execute(REMOVED_TRIGGER)

    def _tracks_removed(self) -> bool:
        """Whether ``removed`` lists the removed slots (an index made or upgraded by this uform)."""
        return bool(self._db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name = 'items_removed'").fetchone()[0])

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
            conn.execute(REMOVED_TRIGGER)
            conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
            conn.execute("COMMIT")
        finally:
            conn.close()  # checkpoints the WAL into the file and removes it
        move(new, db)  # core.files: synced, renamed, the folder synced

    @guarded
    def _read_meta(self) -> dict[str, str]:
        meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("format") != FORMAT:
            raise IndexFormatError(f"{self.folder}: an index of format {meta.get('format')!r}, which this uform does not read "
                                   f"(it reads {FORMAT!r}); build it again with `uform index ... --into NEW`")  # fmt: skip
        missing = {"checkpoint_sha256", "checkpoint", "quantization", "dimensions", "scalar", "generation", "slots"} - set(meta)
        if missing:
            raise self.damaged(f"{DATABASE}'s meta table lacks {', '.join(sorted(missing))}")
        if not meta["dimensions"].isdigit() or meta["scalar"] not in {s.value for s in Scalar}:
            raise self.damaged(f"{DATABASE}'s meta table says {meta['dimensions']!r} dimensions of {meta['scalar']!r}")
        return meta

    def _recover(self) -> None:
        """A writer's start: refuse damage; cut what a killed writer appended past the committed
        slots; and delete the files of the generation a compaction recorded in ``meta.next``
        before writing them (a compaction killed before its commit), or of the one before it (one
        killed after). No other file in the folder is ever deleted."""
        generation, slots = self.state()
        self.rows.open_for_writing(generation, slots)
        recorded = self.meta.get("next")
        if recorded is not None and recorded.isdigit():
            other = int(recorded) - 1 if int(recorded) == generation else int(recorded)
            if other != generation:
                self.rows.delete_generation(other)

    @property
    def _db(self) -> sqlite3.Connection:
        assert self.conn is not None
        return self.conn

    # -- reading ----------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``), committed at the end, rolled back on error."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            with suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """A read transaction: every read of the store inside sees one committed state."""
        own = not self._db.in_transaction
        if own:
            try:
                self._db.execute("BEGIN")
            except sqlite3.Error as exc:
                raise self.translate(exc) from None
        try:
            yield
        except BaseException:
            if own and self._db.in_transaction:
                with suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise
        if own:
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self.translate(exc) from None

    @guarded
    def state(self) -> tuple[int, int]:
        """(generation, committed slots), as the current transaction sees them; refuses a
        database whose items point outside the committed slots. ``slot`` is the table's rowid,
        so its least and greatest are each one descent of the table's B-tree, O(log n): checked
        on every call (one ``SELECT max(slot), min(slot)`` is not optimised, and read every item)."""
        rows = dict(self._db.execute("SELECT key, value FROM meta WHERE key IN ('generation', 'slots')").fetchall())
        try:
            generation, slots = int(rows["generation"]), int(rows["slots"])
        except (KeyError, ValueError, TypeError):
            raise self.damaged(f"{DATABASE}'s meta.generation and meta.slots are not counts ({rows})") from None
        if generation < 0 or slots < 0:
            raise self.damaged(f"{DATABASE}'s meta says generation {generation} and {slots} slots")
        high, low = self._db.execute("SELECT (SELECT max(slot) FROM items), (SELECT min(slot) FROM items)").fetchone()
        if high is not None and (high >= slots or low < 0):
            raise self.damaged(f"{DATABASE}'s items use slots {low}-{high}, outside the {slots} rows meta.slots says")
        return generation, slots

    def vectors(self, generation: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``slots`` rows and kind bytes of ``generation``, mapped read-only (never
        copied); what a snapshot that read (generation, slots) may use (files.Rows.map)."""
        return self.rows.map(generation, slots, self._current_generation)

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

    @guarded
    def count(self) -> int:
        """The items: the committed slots less the removed ones (O(removed)); an index made by an
        earlier uform and not yet written by this one counts every item."""
        if self._tracks_removed():
            return self.state()[1] - int(self._db.execute("SELECT count(*) FROM removed").fetchone()[0])
        return int(self._db.execute("SELECT count(*) FROM items").fetchone()[0])

    @guarded
    def removed(self) -> np.ndarray | None:
        """The slots below ``meta.slots`` no item holds (removed since the last compaction),
        ascending; None where they are not listed (an earlier uform's index, opened to read)."""
        if not self._tracks_removed():
            return None
        return np.array([s for (s,) in self._db.execute("SELECT slot FROM removed ORDER BY slot")], np.int64)

    @guarded
    def live(self) -> np.ndarray:
        """The slots items point at, ascending."""
        return np.array([s for (s,) in self._db.execute("SELECT slot FROM items ORDER BY slot")], np.int64)

    @guarded
    def ivf_name(self) -> str | None:
        """The IVF lists' file of the current generation (None: not clustered)."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'ivf'").fetchone()
        return row[0] if row is not None and row[0] else None

    @guarded
    def resolve(self, slots: list[int]) -> dict[int, tuple[str, str | None]]:
        """(path, text) of the items at ``slots``; slots of removed items are absent."""
        found: dict[int, tuple[str, str | None]] = {}
        for start in range(0, len(slots), 900):  # SQLite's bound on host parameters
            part = slots[start : start + 900]
            marks = ",".join("?" * len(part))
            found.update((s, (p, t)) for s, p, t in self._db.execute(f"SELECT slot, path, text FROM items WHERE slot IN ({marks})", part))
        return found

    def items(self) -> Iterator[Stored]:
        """Every item, in slot order (inside a snapshot: of one state)."""
        cursor = self._guarded_call(lambda: self._db.execute("SELECT slot, path, size, mtime, hash, text FROM items ORDER BY slot"))
        while rows := self._guarded_call(lambda: cursor.fetchmany(1024)):
            yield from (Stored(*r) for r in rows)

    def _guarded_call(self, call: Callable[[], R]) -> R:
        try:
            return call()
        except sqlite3.Error as exc:
            raise self.translate(exc) from None

    @guarded
    def known(self, roots: list[str], keys: list[str]) -> dict[str, Known]:
        """The items at or under the absolute paths ``roots`` (a text file's lines with it) and
        those of paths ``keys``, by path: what an update of those may touch, read through the
        path index (:func:`scopes`), not every item."""
        found: dict[str, Known] = {}
        for where, args in scopes(roots, keys, texts_only=False):
            query = f"SELECT slot, path, size, mtime, hash, text IS NOT NULL FROM items WHERE {where}"
            found.update((p, Known(s, z, m, h, bool(t))) for s, p, z, m, h, t in self._db.execute(query, args))
        return found

    @guarded
    def slot_of(self, digest: bytes) -> int | None:
        """The least slot holding the hash ``digest`` (where a copy's vector is found): one
        descent of the hash index, not every item's hash."""
        found = self._db.execute("SELECT min(slot) FROM items WHERE hash = ?", (digest,)).fetchone()[0]
        return None if found is None else int(found)

    @guarded
    def hashes(self) -> dict[str, bytes]:
        return dict(self._db.execute("SELECT path, hash FROM items"))

    @guarded
    def failed(self) -> dict[str, Failed]:
        """Items that failed, by path, with the stamp they failed at."""
        return {p: Failed(p, z, m, r) for p, z, m, r in self._db.execute("SELECT path, size, mtime, reason FROM failed ORDER BY path")}

    @guarded
    def text_files(self) -> dict[str, tuple[int, int]]:
        """Text files read in full, with the (size, mtime) they had."""
        return {p: (z, m) for p, z, m in self._db.execute("SELECT path, size, mtime FROM texts")}

    # -- writing (the writer only) ----------------------------------------------------------

    def append(self, rows: np.ndarray, kinds: np.ndarray, at: int) -> None:
        """Write rows (of ``self.dtype``) and their kind bytes at slot ``at`` (past the committed
        slots), and make them durable; :meth:`commit`'s first step."""
        self.rows.append(rows, kinds, at)

    @guarded
    def commit(self, chunk: Chunk) -> int:
        """The crash-safety rule: append ``chunk.rows`` past the committed slots, durably, then in
        one transaction point its inserts at them (a path's former row left), move and failures
        recorded, and the new ``meta.slots``. Answers the first slot of the rows appended."""
        _, at = self.state()
        if chunk.inserts:
            self.append(chunk.rows, np.array([i.kind for i in chunk.inserts], np.uint8), at)
        with self.transaction() as c:
            for slot, item in enumerate(chunk.inserts, at):
                if not chunk.new_paths:
                    c.execute("DELETE FROM items WHERE path = ?", (item.path,))
                c.execute("INSERT INTO items VALUES (?, ?, ?, ?, ?, ?)", (slot, item.path, item.size, item.mtime, item.hash, item.text))
            for move in chunk.moves:  # a path whose content moved in drops its old row
                c.execute("DELETE FROM items WHERE path = ? AND slot <> ?", (move.path, move.slot))
                c.execute("UPDATE items SET path = ?, size = ?, mtime = ? WHERE slot = ?", (move.path, move.size, move.mtime, move.slot))
            c.executemany("DELETE FROM failed WHERE path = ?", [(i.path,) for i in chunk.inserts] + [(m.path,) for m in chunk.moves])
            c.executemany("INSERT OR REPLACE INTO failed VALUES (?, ?, ?, ?)", chunk.failures)
            c.executemany("DELETE FROM items WHERE path = ?", ((f.path,) for f in chunk.failures))  # its old content is not its content now
            if chunk.inserts:
                c.execute("UPDATE meta SET value = ? WHERE key = 'slots'", (str(at + len(chunk.inserts)),))
        return at

    @guarded
    def prune(self, gone: list[str], failed: list[str], stale: set[str], stamps: list[tuple[str, int, int]], failures: list[Failed]) -> None:
        """The end of an update: items of paths ``gone`` and the failures ``failed`` leave, text
        files ``stale`` are to be read in full next time, text files read in full are recorded
        with their stamps, and ``failures`` (a text file's lines, names not UTF-8) with theirs."""
        with self.transaction() as c:
            c.executemany("DELETE FROM items WHERE path = ?", ((p,) for p in gone))
            c.executemany("DELETE FROM failed WHERE path = ?", ((p,) for p in failed))
            c.executemany("DELETE FROM texts WHERE path = ?", ((p,) for p in stale))
            c.executemany("INSERT OR REPLACE INTO texts VALUES (?, ?, ?)", stamps)
            c.executemany("INSERT OR REPLACE INTO failed VALUES (?, ?, ?, ?)", failures)

    @guarded
    def remove(self, roots: list[str], keys: list[str]) -> int:
        """Remove the items at or under the absolute paths ``roots`` (a text file's lines,
        ``FILE:LINE``, with it) and the text items keyed ``keys``, and the text files and failures
        at or under ``roots``; answer the items removed. Each is a range of a path index (a
        prefix ``P`` is the range ``[P, P with its last character one higher)``), so a removal
        reads what it removes, not every item."""
        after = chr(ord(os.sep) + 1)
        roots = [r for r in roots if storable(r)]  # a name that is not UTF-8 names no stored item
        with self.transaction() as c:
            slots = {s for where, args in scopes(roots, keys, texts_only=True) for (s,) in c.execute(f"SELECT slot FROM items WHERE {where}", args)}
            c.executemany("DELETE FROM items WHERE slot = ?", ((s,) for s in slots))
            for table in ("texts", "failed"):
                for r in roots:
                    c.execute(f"DELETE FROM {table} WHERE path = ? OR (path >= ? AND path < ?)", (r, r + os.sep, r + after))
        return len(slots)

    @guarded
    def compact(self, order: np.ndarray | None = None, lists: ivf.Lists | None = None) -> int:
        """Rewrite the live rows into the next generation, in slot order or in ``order`` (a
        permutation of the live slots; ``lists`` then names its IVF lists, saved and committed
        with it); answer the rows of removed items dropped. Readers holding the old generation
        keep reading it; new snapshots see the new one, whole."""
        generation, slots = self.state()
        live = self.live()
        if order is None and len(live) == slots:
            return 0
        order = live if order is None else order
        rows, kinds = self.vectors(generation, slots)
        new = generation + 1
        with self.transaction() as c:  # recorded before they are written: only files the index names are ever deleted
            c.execute("INSERT OR REPLACE INTO meta VALUES ('next', ?)", (str(new),))
        files = self.rows.write_generation(new, rows, kinds, order)
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
            c.execute("CREATE INDEX items_path ON items(path)")  # the old table's indexes and trigger went with it
            c.execute("CREATE INDEX items_hash ON items(hash)")
            c.execute("DELETE FROM removed")  # their rows are gone: no slot below the new slots is removed
            c.execute(REMOVED_TRIGGER)
            c.executemany("UPDATE meta SET value = ? WHERE key = ?", ((str(new), "generation"), (str(len(live)), "slots")))
            c.execute("DELETE FROM meta WHERE key = 'ivf'")  # lists name one generation's order
            if lists is not None:
                c.execute("INSERT INTO meta VALUES ('ivf', ?)", (f"ivf-{new}.npz",))
        self.rows.switch(files, generation)
        self._db.executescript("PRAGMA incremental_vacuum;")  # stepped to its end (execute() gives back one page)
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # a compaction's transaction is as large as the table
        return slots - len(live)

    def close(self) -> None:
        if hasattr(self, "rows"):
            self.rows.close()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
