"""The index's crash-safety rule, and every write of its database: opening (made, upgraded,
recovered), the commit, removals and compaction. What the database holds is schema.py, the
connection in the index's terms database.py, its reads reading.py.

``INDEX/`` holds ``index.sqlite`` (WAL; schema.py's tables), the row files of files.py
(``vectors-G.bin``, ``kinds-G.bin``), ``ivf-G.npz`` for a clustered index, and ``lock``. ``G`` is
the generation that a compaction advances.

Crash safety rests on one rule, kept by :meth:`Store.commit` (the one way rows go in): the bytes
of a slot below ``meta.slots`` never change within a generation. A writer appends rows past the
committed slots, ``fdatasync``s them, then commits the items that point at them together with
the new ``slots`` in one SQLite transaction; a writer killed before the commit leaves bytes past
``slots`` that the next writer cuts off. A reader takes an SQLite read transaction (a snapshot),
reads ``slots`` and the generation, and maps that many rows: whatever a writer does meanwhile,
it sees one committed state. One writer at a time holds ``lock`` (``flock``, released by the
kernel when a writer dies).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np

from ..core.files import move
from ..core.types import Scalar
from . import files, ivf
from .database import guarded
from .files import CREATION, DATABASE, NEW_DATABASE, Rows
from .identity import FORMAT, MODALITIES, Identity, IndexBusyError, IndexFormatError, IndexModelError, row_dtype
from .reading import Reader
from .records import Chunk, Failed, Insert, Known, Move
from .schema import INDEXES, ITEMS, REMOVED, REMOVED_TRIGGER, SCHEMA, UPGRADED, refuse_foreign, scopes, under
from .sources import storable

__all__ = ["FORMAT", "MODALITIES", "Chunk", "Failed", "Identity", "IndexBusyError", "IndexFormatError", "IndexModelError", "Insert",
           "Known", "Move", "Store", "refuse_foreign"]  # fmt: skip


class Store(Reader):
    """The open database and row files of one index; ``write=True`` takes the writer's lock."""

    def __init__(self, folder: str | os.PathLike[str], *, write: bool, identity: Identity | None = None) -> None:
        super().__init__(folder, write=write)
        self._lock_fd = -1
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

    @guarded
    def _has_meta(self) -> bool:
        return bool(self._db.execute("SELECT count(*) FROM sqlite_master WHERE name='meta'").fetchone()[0] == 1)

    @guarded
    def _check(self) -> None:
        """A writer's look at every page before it writes any (``PRAGMA quick_check``)."""
        found = [r[0] for r in self._db.execute("PRAGMA quick_check(3)").fetchall()]
        if found != ["ok"]:
            raise self.damaged(f"{DATABASE} fails SQLite's check ({'; '.join(map(str, found))})")

    def _first_in_transaction(self, conn: sqlite3.Connection) -> None:
        """What an index made by an earlier uform lacks, added in the transaction of its first real
        write (a writer killed in it, or a disk full, leaves the index as it was; a run with nothing
        to change, and a reader, never write it): items are found by path and by hash in O(log n)
        (each insert, move and removal looks its path up, and new content its hash: without them a
        scan of the table, a run quadratic, or every item's hash read), and the slots removed since
        the last compaction are listed (``removed``, filled by a trigger), so counting the items
        reads the removed slots alone."""
        if conn.execute(f"SELECT count(*) FROM sqlite_master WHERE name IN ({', '.join('?' * len(UPGRADED))})", UPGRADED).fetchone()[0] == len(UPGRADED):
            return
        for index in INDEXES:
            conn.execute(f"CREATE INDEX IF NOT EXISTS {index}")
        if self._tracks_removed():
            return
        _, slots = self.state()  # listed once, from every item: a slot below meta.slots no item holds
        live = np.zeros(slots, bool)
        live[self.live()] = True
        conn.execute(f"CREATE TABLE IF NOT EXISTS {REMOVED}")
        conn.execute("DELETE FROM removed")  # an earlier uform's compaction dropped the trigger: what it listed is stale
        conn.executemany("INSERT INTO removed VALUES (?)", ((int(s),) for s in np.flatnonzero(~live)))
        conn.execute(REMOVED_TRIGGER)

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
        if not (chunk.inserts or chunk.moves or chunk.failures):  # read again, each the same: nothing written
            return at
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
        with their stamps, and ``failures`` (a text file's lines, names not UTF-8) with theirs; none
        of them: nothing written."""
        if not (gone or failed or stale or stamps or failures):
            return
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
        roots = [r for r in roots if storable(r)]  # a name that is not UTF-8 names no stored item
        wheres = [(f"items WHERE {where}", args) for where, args in scopes(roots, keys, texts_only=True)]
        wheres += [(f"{table} WHERE path = ? OR (path >= ? AND path < ?)", (r, *under(r))) for table in ("texts", "failed") for r in roots]
        db = self._db  # looked at first (this writer holds the lock: nothing changes between): removing nothing writes nothing
        if not any(db.execute(f"SELECT 1 FROM {where} LIMIT 1", args).fetchone() for where, args in wheres):
            return 0
        removed = 0
        with self.transaction() as c:  # a DELETE a range, the trigger listing each slot: 100,000 items 1.1 CPU s, one by one 1.3-1.6
            for where, args in wheres:
                gone = c.execute(f"DELETE FROM {where}", args).rowcount  # a scope's items another took first are not counted again
                removed += gone if where.startswith("items ") else 0
        return removed

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
            for index in INDEXES:  # the old table's indexes and trigger went with it
                c.execute(f"CREATE INDEX {index}")
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
        super().close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
