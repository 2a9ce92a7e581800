"""What an index's database holds: its tables, indexes and trigger, the names they make, and the
conditions that select the items at or under a path.

``index.sqlite`` holds ``meta`` (the model's identity, ``format``, ``generation``, ``slots``,
``next`` while a compaction runs, ``ivf``), ``items`` (a slot each: path, stamp, content hash, a
text item's text), ``removed`` (the slots items left since the last compaction, listed by a
trigger), ``failed`` and ``texts``. Each statement that makes one of them is written here once:
a new database, an earlier uform's upgraded, and a compaction's rewritten ``items`` make the same.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from . import files
from .sources import storable

ITEMS = "(slot INTEGER PRIMARY KEY, path TEXT NOT NULL, size INTEGER, mtime INTEGER, hash BLOB NOT NULL, text TEXT)"
# items are found by path and by hash in O(log n): each insert, move and removal looks its path up, new content its hash
INDEXES = ("items_path ON items(path)", "items_hash ON items(hash)")  # each made by "CREATE INDEX " + it
REMOVED = "removed(slot INTEGER PRIMARY KEY)"
SCHEMA = f"""
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE items{ITEMS};
CREATE INDEX {INDEXES[0]};
CREATE INDEX {INDEXES[1]};
CREATE TABLE {REMOVED};
CREATE TABLE failed(path TEXT PRIMARY KEY, size INTEGER, mtime INTEGER, reason TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE texts(path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime INTEGER NOT NULL) WITHOUT ROWID;
"""
# every slot an item leaves goes into ``removed`` (until the compaction that drops its row), so
# counts and ``len`` read the removed slots, not every item; a trigger, so that no DELETE can miss it
REMOVED_TRIGGER = "CREATE TRIGGER items_removed AFTER DELETE ON items BEGIN INSERT OR IGNORE INTO removed VALUES (old.slot); END"
UPGRADED = ("items_path", "items_hash", "removed", "items_removed")  # what an earlier uform's index lacks, added by its first write
OWN_NAMES = {"meta", "items", "items_path", "items_hash", "removed", "items_removed", "failed", "texts"}  # sqlite_master's names of an index


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


def under(root: str) -> tuple[str, str]:
    """The range of paths below the folder ``root``: a prefix ``P`` is ``[P, P with its last
    character one higher)``, as SQLite compares text by its UTF-8 bytes, in code point order."""
    return root + os.sep, root + chr(ord(os.sep) + 1)


def scopes(roots: list[str], keys: list[str], *, texts_only: bool) -> list[tuple[str, tuple[str, ...]]]:
    """SQL conditions on ``items.path``, each a lookup or a range of the path index, for the items
    at or under each of ``roots`` (absolute paths; a text file's lines ``FILE:LINE`` too) and of
    each of ``keys`` (``texts_only``: a text item's)."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for r in filter(storable, roots):  # a name that is not UTF-8 names no stored item
        out += [("path = ?", (r,)), ("path >= ? AND path < ?", under(r)),
                ("path >= ? AND path < ? AND text IS NOT NULL", (r + ":", r + ";"))]  # fmt: skip
    out += [("path = ?" + (" AND text IS NOT NULL" if texts_only else ""), (k,)) for k in filter(storable, keys)]
    return out
