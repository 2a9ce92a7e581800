"""One update of an index: walk what was given, embed only what is new or changed.

A file whose size and modification time (nanoseconds) match its row is not opened. Any
other is read once, through one descriptor: its bytes are hashed (BLAKE2b-128) and those same
bytes are what the model encodes, so a row's hash and vector always describe the same content,
and the size and time recorded are those the descriptor saw before the read (a file that
changed while it was read is recorded with time -1, so the next run reads it again). Content
whose hash a row already holds is not encoded: a moved file keeps its slot, a copy copies
the row. Items are committed a chunk at a time (``inputs.CHUNK``), so a killed run loses at most
the chunk in flight; rows of files no longer found under the paths given leave the index at
the end. Walking, batching and failure reasons are ``uform encode``'s (``uform.inputs``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..inputs import CHUNK, Failure, Item, encode, gather, is_unserved, modality_of, pass_over_unserved, unserved_reason
from ..core.errors import CancelledError
from ..core.progress import cancels
from ..core.scalars import store as cast
from ..core.types import Scalar
from .identity import MODALITIES
from .records import Chunk, Failed, Insert, Known, Move
from .sources import NOT_UTF8, TEXT_FILES, Text, digest, escape, in_scope, line_keys, read, storable, text_lines
from .store import Store

if TYPE_CHECKING:
    from ..inputs import Bar
    from ..model import Model

__all__ = ["CHUNK", "UpdateReport", "Updater", "digest", "read", "store_rows"]  # read, digest: tests and benchmarks watch what a run opens


@dataclass
class UpdateReport:
    """What one update did, in items."""

    added: int = 0  # embedded: new paths, or new content at a known path
    unchanged: int = 0  # size and time as recorded: not read
    touched: int = 0  # read again, same content: not embedded
    moved: int = 0  # a new path holding content of a path gone: the row moved, not embedded
    copied: int = 0  # a new path holding content another row holds: its vector copied
    removed: int = 0  # rows of files no longer found
    failed: list[Failure] = field(default_factory=list)  # failed in this run
    still_failed: list[Failure] = field(default_factory=list)  # failed before, unchanged since: not retried
    skipped: list[tuple[str, str]] = field(default_factory=list)  # folder entries passed over, as encode's
    unserved: list[Item] = field(default_factory=list)  # files in folders of a modality the model has no tower for (this run or before)

    @property
    def embedded(self) -> int:
        return self.added


@dataclass
class _New:
    """An item on its way in: its vector encoded from ``payload``, or copied from the row ``copy_of``."""

    insert: Insert
    payload: str | bytes | None = None
    copy_of: int | None = None


@dataclass
class _Pending:
    """A chunk on its way in: new items, paths that take a stored row, failures to record."""

    new: list[_New] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    failures: list[Failed] = field(default_factory=list)


class Updater:
    """Runs one update against a writer's :class:`Store`; ``model()`` loads the model when needed."""

    def __init__(self, store: Store, model: Callable[[], Model], progress: Callable[[int, int], object] | None,
                 report: Callable[[Failure], None] | None, bar: Bar) -> None:  # fmt: skip
        self.store, self._model, self._progress, self._report, self._bar = store, model, progress, report, bar
        self.result = UpdateReport()
        with store.snapshot():
            self.failed_before = store.failed()
            self.text_files = store.text_files()
        self.rows: dict[str, Known] = {}  # the items under the sources (run() reads them)
        self.seen: set[str] = set()
        self.text_stamps: list[tuple[str, int, int]] = []  # text files read in full: recorded at the end
        self.late: list[Failed] = []  # failures recorded at the end: lines of text files, names that are not UTF-8
        self.done = self.total = 0
        self.text_lines = 0  # lines of the text files to read, not blank

    def fail(self, f: Failure, *, record: tuple[str, int, int] | None = None, pending: _Pending | None = None) -> None:
        self.result.failed.append(f)
        if record is not None and pending is not None:
            pending.failures.append(Failed(*record, f.reason))
        if self._report is not None:
            self._report(f)

    def run(self, sources: Iterable[str | os.PathLike[str] | Text]) -> UpdateReport:
        sources = list(sources)
        named = [os.path.abspath(os.fspath(s)) for s in sources if not isinstance(s, Text) and os.fspath(s)]
        with self.store.snapshot():  # what this run may touch, found through the path index; not every item
            self.rows = self.store.known(named, [s.key for s in sources if isinstance(s, Text) and storable(s.key)])
        files, texts, roots = [], [], []
        text_files: list[tuple[str, tuple[int, int]]] = []  # read a chunk at a time, after the files
        for s in sources:
            if isinstance(s, Text):
                if storable(s.key) and storable(s.text):
                    texts.append((s.key, s.text))
                else:
                    self.fail(Failure("text", s.key, "not valid UTF-8 (a lone surrogate in its key or text)"))
                continue
            if not os.fspath(s):  # not the current folder (abspath's reading): an unset shell variable, say
                self.fail(Failure("file", "", "no such file or folder (the path is empty)"))
                continue
            path = os.path.abspath(os.fspath(s))
            roots.append(path)
            if path.lower().endswith(TEXT_FILES) and not os.path.isdir(path):  # a FIFO or a dangling link too: _text_file says why
                stamp = self._text_file(path)
                if stamp is not None:
                    text_files.append((path, stamp))
            else:
                files.append(path)
        found = gather(files, texts=False, report=lambda f: self.fail(f))
        self.unlisted = [escape(f.value) for f in found.failures if f.kind == "folder"]  # what is under them is not known gone
        self.result.skipped = found.skipped
        self.walked = {item.value for item in found.items if item.walked}
        todo: list[Item] = []
        for item in found.items:
            if not storable(item.value):
                self._not_utf8(item.value)
                continue
            self.seen.add(item.value)
            if not self._unchanged(item.value):
                todo.append(item)
        self.total = len(todo) + len(texts) + self.text_lines
        self.seen.update(key for key, _ in texts)  # a text's key is never both gone and given: its old row is replaced, not moved
        self.missing = {self.rows[p].hash: p for p in self._gone(roots)}
        for start in range(0, len(todo), CHUNK):
            self._chunk_files(todo[start : start + CHUNK])
        for start in range(0, len(texts), CHUNK):
            self._chunk_texts(texts[start : start + CHUNK])
        for path, stamp in text_files:
            self._stream_text_file(path, stamp)
        self._prune(roots)
        return self.result

    def _unchanged(self, path: str) -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False  # read() says why
        row = self.rows.get(path)
        if row is not None and (row.size, row.mtime) == (st.st_size, st.st_mtime_ns):
            self.result.unchanged += 1
            return True
        before = self.failed_before.get(path)
        if before is not None and (before.size, before.mtime) == (st.st_size, st.st_mtime_ns):
            if is_unserved(before.reason) and path in self.walked:
                self.result.unserved.append(Item(modality_of(path) or "text", path, walked=True))
            else:
                self.result.still_failed.append(Failure("file", path, before.reason))
            return True
        return False

    def _not_utf8(self, path: str) -> None:
        """A file whose name cannot be stored: recorded as failed under its escaped name (reported
        under its own, which the command prints escaped the same way); the rest goes on."""
        key = escape(path)
        self.seen.add(key)
        try:
            st = os.stat(path)
        except OSError:
            self.fail(Failure("file", path, NOT_UTF8))
            return
        before = self.failed_before.get(key)
        if before is not None and (before.size, before.mtime) == (st.st_size, st.st_mtime_ns):
            self.result.still_failed.append(Failure("file", path, before.reason))
            return
        self.fail(Failure("file", path, NOT_UTF8))
        self.late.append(Failed(key, st.st_size, st.st_mtime_ns, NOT_UTF8))

    def _text_file(self, path: str) -> tuple[int, int] | None:
        """The stamp of a text file to read, or None when it is as recorded (its failed lines
        reported again) or cannot be read (reported). Its lines' keys are seen now (a key given
        is never also gone: its old row is replaced, not moved), the lines read later, a chunk at
        a time (:meth:`_stream_text_file`)."""
        if not storable(path):
            self._not_utf8(path)
            return None
        try:
            st = os.stat(path)
        except OSError as exc:
            self.fail(Failure("file", path, "no such file" if isinstance(exc, FileNotFoundError) else f"cannot read the file ({exc.strerror})"))
            return None
        stamp = (st.st_size, st.st_mtime_ns)
        prefix = path + ":"
        if self.text_files.get(path) == stamp:
            self.seen.update(p for p in self.rows if p.startswith(prefix))
            self.result.unchanged += sum(1 for p in self.rows if p.startswith(prefix))
            for key, before in self.failed_before.items():
                if key.startswith(prefix) and (before.size, before.mtime) == stamp:
                    self.seen.add(key)
                    self.result.still_failed.append(Failure("text", key, before.reason))
            return None
        keys = line_keys(path)
        if isinstance(keys, str):
            self.fail(Failure("file", path, keys))
            return None
        self.seen.update(keys)
        self.text_lines += len(keys)
        return stamp

    def _stream_text_file(self, path: str, stamp: tuple[int, int]) -> None:
        """Index a text file's lines as they are read, a chunk at a time; each bad line a failure
        recorded with the file's stamp. The file is recorded read in full only when it was."""
        got = text_lines(path)
        if isinstance(got, str):
            self.fail(Failure("file", path, got))
            return
        good: list[tuple[str, str]] = []
        for line in got:
            if isinstance(line, Failure) and line.kind == "file":  # a read that failed midway: what was committed stays
                self.fail(line)
                return
            if not isinstance(line, Failure) and not storable(line[1]):
                line = Failure("text", line[0], "not valid UTF-8 (a lone surrogate in its text)")
            if isinstance(line, Failure):
                self.fail(line)
                self.seen.add(line.value)
                self.late.append(Failed(line.value, *stamp, line.reason))
                self.done += 1
                continue
            good.append(line)
            if len(good) == CHUNK:
                self._chunk_texts(good)
                good = []
        if good:
            self._chunk_texts(good)
        self.text_stamps.append((path, *stamp))

    def _place(self, pending: _Pending, path: str, size: int | None, mtime: int | None, h: bytes, text: str | None,
               kind: int, payload: str | bytes) -> None:  # fmt: skip
        """Route one read item: the same content as its row, a move, a copy, or new content to encode."""
        self.seen.add(path)
        row = self.rows.get(path)
        if row is not None and row.hash == h:
            pending.moves.append(Move(path, size, mtime, row.slot))
            self.result.touched += 1
        elif h in self.missing:
            old = self.missing.pop(h)
            slot = self.rows.pop(old).slot
            self.rows[path] = Known(slot, size, mtime, h, text is not None)
            pending.moves.append(Move(path, size, mtime, slot))
            self.result.moved += 1
        elif (found := self.store.slot_of(h)) is not None:  # a row of this content anywhere in the index: the hash index's lookup
            pending.new.append(_New(Insert(path, size, mtime, h, text, kind), copy_of=found))
            self.result.copied += 1
        else:
            pending.new.append(_New(Insert(path, size, mtime, h, text, kind), payload=payload))

    def _chunk_files(self, items: list[Item]) -> None:
        pending = _Pending()
        for item in items:
            got = read(item.value)
            if isinstance(got, str):
                try:
                    st = os.stat(item.value)
                    record = (item.value, st.st_size, st.st_mtime_ns)
                except OSError:
                    record = None
                self.fail(Failure("file", item.value, got), record=record, pending=pending)
                continue
            data, size, mtime = got
            self._place(pending, item.value, size, mtime, digest(data), None, MODALITIES.index(item.modality), data)
        self._commit(pending, len(items))

    def _chunk_texts(self, texts: list[tuple[str, str]]) -> None:
        pending = _Pending()
        for key, text in texts:
            self._place(pending, key, None, None, digest(text.encode("utf-8", "surrogatepass")), text, 0, text)
        self._commit(pending, len(texts))

    def _commit(self, pending: _Pending, count: int) -> None:
        """Encode what is new (an item the model refuses becomes a failure), then commit the chunk (Store.commit)."""
        store = self.store
        to_encode = [n for n in pending.new if n.payload is not None]
        if to_encode:
            to_encode = self._pass_over_unserved(to_encode, pending)
        if to_encode:
            items = [Item(MODALITIES[n.insert.kind], n.insert.path) for n in to_encode]  # type: ignore[arg-type]
            refused: dict[str, str] = {}
            encoded = encode(self._model(), items, scalar=Scalar.F32, dimensions=None, bar=self._bar,
                             report=lambda f: refused.__setitem__(f.value, f.reason), payloads=[n.payload for n in to_encode if n.payload is not None])  # fmt: skip
            vectors = dict(zip((i.value for i in encoded.items), store_rows(encoded.embeddings, store), strict=True))
            for n in to_encode:
                if n.insert.path not in vectors:
                    ins = n.insert
                    kind: Literal["text", "file"] = "text" if ins.text is not None else "file"
                    self.fail(Failure(kind, ins.path, refused.get(ins.path, "not encoded")),
                              record=None if ins.size is None else (ins.path, ins.size, ins.mtime or 0), pending=pending)  # fmt: skip
        else:
            vectors = {}
        keep = [n for n in pending.new if n.payload is None or n.insert.path in vectors]
        rows = np.zeros(len(keep), store.dtype)
        if any(n.copy_of is not None for n in keep):
            old, _ = store.vectors(*store.state())
        for i, n in enumerate(keep):
            rows[i] = old[n.copy_of] if n.copy_of is not None else vectors[n.insert.path]
        at = store.commit(Chunk(rows, [n.insert for n in keep], pending.moves, pending.failures))
        for slot, n in enumerate(keep, at):
            ins = n.insert
            self.rows[ins.path] = Known(slot, ins.size, ins.mtime, ins.hash, ins.text is not None)
        for f in pending.failures:
            self.rows.pop(f.path, None)
        self.result.added += sum(1 for n in keep if n.copy_of is None)
        self.done += count
        if self._progress is not None and cancels(self._progress(self.done, self.total)):
            raise CancelledError("the update was cancelled by its progress handler; what was committed stays")

    def _pass_over_unserved(self, to_encode: list[_New], pending: _Pending) -> list[_New]:
        """Files found in folders whose modality the model has no tower for are passed over, not
        failed: recorded as failures are (so they are not read again while unchanged), reported in
        ``unserved``. Files named by the caller stay, and fail with the verb's reason."""
        items = [Item(MODALITIES[n.insert.kind], n.insert.path, walked=n.insert.path in self.walked) for n in to_encode]  # type: ignore[arg-type]
        _, passed = pass_over_unserved(items, self._model())
        if not passed:
            return to_encode
        gone = {i.value for i in passed}
        for n, item in zip(to_encode, items):
            if item.value in gone:
                ins = n.insert
                pending.failures.append(Failed(ins.path, ins.size, ins.mtime or 0, unserved_reason(item.modality)))
                self.result.unserved.append(item)
        return [n for n in to_encode if n.insert.path not in gone]

    def _gone(self, roots: list[str]) -> list[str]:
        """Paths of rows under the roots that were not found; not those under a folder that could
        not be listed (a permission, a mount away): their files were not looked for."""
        return [p for p, r in self.rows.items() if p not in self.seen and in_scope(p, roots, text=r.text) and (r.text or not in_scope(p, self.unlisted))]

    def _prune(self, roots: list[str]) -> None:
        """Rows (and failures) of paths under the roots that were not found leave the index."""
        gone = self._gone(roots)
        named = [escape(r) for r in roots]  # failures are recorded under escaped names (a root's own may not be UTF-8)
        failed = [p for p in self.failed_before if p not in self.seen and not in_scope(p, self.unlisted)
                  and (in_scope(p, named) or in_scope(p, named, text=True))]  # fmt: skip
        stale = {p.rsplit(":", 1)[0] for p in gone if self.rows[p].text}  # a text file whose lines left is read in full next time
        self.store.prune(gone, failed, stale, self.text_stamps, self.late)
        self.result.removed = len(gone)


def store_rows(embeddings: np.ndarray, store: Store) -> np.ndarray:
    """float32 unit rows as the index's stored rows."""
    out = np.zeros(len(embeddings), store.dtype)
    if store.scalar is Scalar.I8:
        q = np.empty(embeddings.shape, np.int8)
        s = np.empty(len(embeddings), np.float32)
        cast(embeddings, Scalar.I8, q, s)
        out["q"], out["s"] = q, s
    else:
        target = np.empty((len(embeddings), *store.dtype.shape), store.dtype.base)
        cast(embeddings, store.scalar, target, None)
        out[...] = target
    return out
