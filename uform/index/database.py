"""The connection to an index's database, in the index's terms: SQLite's errors that mean damage
become :class:`IndexFormatError` naming the file and what to do, those of the disk or the
permissions an ``OSError``; write transactions and read snapshots (one committed state each)."""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import ParamSpec, TypeVar
from urllib.parse import quote

from .files import DATABASE, NEW_DATABASE, cannot_write
from .identity import IndexFormatError

DAMAGE = ("no such table", "no such column", "could not decode", "malformed", "not a database")  # OperationalErrors that are damage

P = ParamSpec("P")
R = TypeVar("R")


def is_damage(exc: sqlite3.Error) -> bool:
    """Whether SQLite's error means a damaged database (not a disk, a lock or a permission)."""
    return not isinstance(exc, sqlite3.OperationalError) or any(d in str(exc).lower() for d in DAMAGE)


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """SQLite's errors in the store's terms: damage as IndexFormatError, the disk's as OSError."""

    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except sqlite3.Error as exc:
            database = args[0]
            assert isinstance(database, Database)
            raise database.translate(exc) from None

    return run


class Database:
    """``index.sqlite`` of the index in ``folder``, once :meth:`_connect` opened it."""

    def __init__(self, folder: str | os.PathLike[str], *, write: bool) -> None:
        self.folder = Path(folder)
        self.write = write
        self.conn: sqlite3.Connection | None = None

    def damaged(self, why: str) -> IndexFormatError:
        return IndexFormatError(f"{self.folder}: the index is damaged: {why}; move it away and run `uform index ... --into {self.folder}` "
                                "to build it again")  # fmt: skip

    def unreadable(self, exc: sqlite3.Error) -> IndexFormatError:
        return self.damaged(f"{DATABASE} cannot be read ({exc})")

    def translate(self, exc: sqlite3.Error) -> Exception:
        if not is_damage(exc):
            return cannot_write(self.folder, exc) if self.write else OSError(f"{self.folder}: cannot read the index ({exc})")
        return self.unreadable(exc)

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
        except sqlite3.DatabaseError as exc:
            if is_damage(exc):
                raise self.unreadable(exc) from None
            # a file it may not open or write, a disk that is full
            raise OSError(f"{self.folder}: cannot open the index{' for writing' if write else ''} ({exc}); it is left as it was") from None

    @staticmethod
    def _reader(db: Path) -> sqlite3.Connection:
        """A read-only connection; in a folder it may not write (WAL needs its -shm file), the
        database as it is on disk (``immutable``)."""
        uri = f"file:{quote(os.fsencode(db))}?mode=ro"  # a name with ?, #, % or bytes that are not UTF-8 read as itself
        if not os.access(db.parent, os.W_OK) and not (db.parent / (db.name + "-shm")).exists():
            uri += "&immutable=1"
        return sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None, check_same_thread=False)

    @property
    def _db(self) -> sqlite3.Connection:
        assert self.conn is not None
        return self.conn

    def _guarded_call(self, call: Callable[[], R]) -> R:
        try:
            return call()
        except sqlite3.Error as exc:
            raise self.translate(exc) from None

    def _first_in_transaction(self, conn: sqlite3.Connection) -> None:
        """What every write transaction does first, before its own statements (Store: an earlier
        uform's index upgraded, in the transaction of its first real write)."""

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``), committed at the end, rolled back on error.
        Opened only for something to write: a run with nothing to change writes nothing."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._first_in_transaction(self._db)
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
            self._guarded_call(lambda: self._db.execute("BEGIN"))
        try:
            yield
        except BaseException:
            if own and self._db.in_transaction:
                with suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise
        if own:
            self._guarded_call(lambda: self._db.execute("COMMIT"))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
