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

NO_SHM = {sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY}  # the -shm file not made: not damage, no lock
DAMAGE = ("no such table", "no such column", "could not decode", "malformed", "not a database")  # OperationalErrors that are damage

P = ParamSpec("P")
R = TypeVar("R")


def is_damage(exc: sqlite3.Error) -> bool:
    """Whether SQLite's error means a damaged database (not a disk, a lock or a permission)."""
    return not isinstance(exc, sqlite3.OperationalError) or any(d in str(exc).lower() for d in DAMAGE)


def reader(db: Path) -> sqlite3.Connection:
    """A connection to the database ``db`` that reads, and writes nothing, read once (``sqlite3.Error``
    where it cannot be). A WAL database's reader shares SQLite's ``-shm`` file (made by the first
    connection, with ``-wal``), so:

    - where this process may write the folder and the database: read-write with ``query_only``, so
      that the last connection to close removes the ``-shm`` and ``-wal`` files as a writer's does
      (a read-only one cannot: it left them, and in a database of mode 444 left them of mode 444,
      which every later writer failed on, ``attempt to write a readonly database``);
    - where it may not, and another left a ``-shm``: read-only, through it;
    - where it may not, and there is none: ``immutable``, which makes no file; and so where the
      ``-shm`` cannot be made (a full disk) while the ``-wal`` holds nothing (no connection is
      open, the database file holds every commit): a writer needs that ``-shm`` too."""
    wal, shm = (db.with_name(db.name + suffix) for suffix in ("-wal", "-shm"))
    writable = os.access(db.parent, os.W_OK) and os.access(db, os.W_OK)
    mode = "rw" if writable else "ro" if shm.exists() else "ro&immutable=1"
    try:
        return _read_once(db, mode)
    except sqlite3.OperationalError as exc:
        if mode.endswith("immutable=1") or exc.sqlite_errorcode & 0xFF not in NO_SHM or (wal.exists() and wal.stat().st_size):
            raise
    return _read_once(db, "ro&immutable=1")


def _read_once(db: Path, mode: str) -> sqlite3.Connection:
    uri = f"file:{quote(os.fsencode(db))}?mode={mode}"  # a name with ?, #, % or bytes that are not UTF-8 read as itself
    conn = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None, check_same_thread=False)
    try:
        if mode == "rw":
            conn.execute("PRAGMA query_only = ON")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


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
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return conn
            return reader(db)
        except sqlite3.DatabaseError as exc:
            if is_damage(exc):
                raise self.unreadable(exc) from None
            # a file it may not open or write, a disk that is full
            raise OSError(f"{self.folder}: cannot open the index{' for writing' if write else ''} ({exc}); it is left as it was") from None

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
