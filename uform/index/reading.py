"""What the index's database answers a reader: the committed state (generation and slots, the
rows of those slots mapped), and its items by slot, by path and by content hash. Every read
inside :meth:`Database.snapshot` sees one committed state (store.py's crash-safety rule)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import numpy as np

from .database import Database, guarded, reader
from .files import DATABASE, Rows
from .records import Failed, Known, Stored
from .schema import scopes
from .sources import storable


class Reader(Database):
    """The reads of an open index (:class:`store.Store` opens it and sets ``rows``)."""

    rows: Rows
    _slots_by_hash: tuple[int, dict[bytes, int]] | None = None  # an earlier uform's index, until its first write

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
            conn = reader(self.folder / DATABASE)
            try:
                row = conn.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
            finally:
                conn.close()
            return int(row[0]) if row else None
        except (sqlite3.Error, ValueError):
            return None

    def _tracks_removed(self) -> bool:
        """Whether ``removed`` lists the removed slots (an index made or upgraded by this uform)."""
        return bool(self._db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name = 'items_removed'").fetchone()[0])

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

    def _indexed(self, name: str) -> bool:
        """Whether the index (SQLite's) ``name`` is there: an earlier uform's lacks its own until its first write."""
        return bool(self._db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)).fetchone()[0])

    @guarded
    def known(self, roots: list[str], keys: list[str]) -> dict[str, Known]:
        """The items at or under the absolute paths ``roots`` (a text file's lines with it) and
        those of paths ``keys``, by path: what an update of those may touch, read through the
        path index (:func:`schema.scopes`), not every item. An earlier uform's index has none until
        its first write: there each condition was a scan of the table (a million items: 1.0 s a
        root, 2.0 s for 10 text keys, 74 s for 256), so all are asked in one scan, the keys as one
        ``IN`` list (as many as SQLite binds at once), not one scan each."""
        found: dict[str, Known] = {}
        columns = "SELECT slot, path, size, mtime, hash, text IS NOT NULL FROM items WHERE"
        if self._indexed("items_path"):
            asked = [(f"{columns} {where}", args) for where, args in scopes(roots, keys, texts_only=False)]
        else:
            ranges = scopes(roots, [], texts_only=False)
            named = [k for k in keys if storable(k)]
            step = max(1, self._db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - 3 * len(ranges))
            asked = []
            for start in range(0, max(len(named), 1), step):
                part = named[start : start + step]
                where = [f"({w})" for w, _ in ranges] + ([f"path IN ({','.join('?' * len(part))})"] if part else [])
                if where:
                    asked.append((f"{columns} {' OR '.join(where)}", tuple(a for _, args in ranges for a in args) + tuple(part)))
                ranges = []  # the roots' items: in the first scan
        for query, args in asked:
            found.update((p, Known(s, z, m, h, bool(t))) for s, p, z, m, h, t in self._db.execute(query, args))
        return found

    @guarded
    def slot_of(self, digest: bytes) -> int | None:
        """The least slot holding the hash ``digest`` (where a copy's vector is found): one
        descent of the hash index, not every item's hash. An earlier uform's index has none until
        its first write (store.Store._first_in_transaction): until then every item's hash is read
        once (3.3 s at a million items), not the table scanned for each (0.13 s a lookup)."""
        if self._indexed("items_hash"):
            found = self._db.execute("SELECT min(slot) FROM items WHERE hash = ?", (digest,)).fetchone()[0]
            return None if found is None else int(found)
        if self._slots_by_hash is None or self._slots_by_hash[0] != self._db.total_changes:  # read again after a write
            self._slots_by_hash = (self._db.total_changes, dict(self._db.execute("SELECT hash, min(slot) FROM items GROUP BY hash")))
        found = self._slots_by_hash[1].get(digest)
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
