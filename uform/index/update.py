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
from typing import TYPE_CHECKING

from ..inputs import CHUNK, Failure, Item, gather, is_unserved, modality_of
from .identity import MODALITIES
from .intake import Intake, Pending, UpdateReport, store_rows
from .records import Failed
from .sources import NOT_UTF8, TEXT_FILES, Text, digest, escape, in_scope, line_keys, read, storable, text_lines, unreadable
from .store import Store

if TYPE_CHECKING:
    from ..inputs import Bar
    from ..model import Model

__all__ = ["CHUNK", "UpdateReport", "Updater", "digest", "read", "store_rows"]  # read, digest: tests and benchmarks watch what a run opens


class Updater(Intake):
    """Runs one update against a writer's :class:`Store`: finds what is new, changed or gone
    under the sources, and reads it a chunk at a time (``CHUNK``) into :class:`Intake`."""

    def __init__(self, store: Store, model: Callable[[], Model], progress: Callable[[int, int], object] | None,
                 report: Callable[[Failure], None] | None, bar: Bar) -> None:  # fmt: skip
        super().__init__(store, model, progress, report, bar)
        with store.snapshot():
            self.failed_before = store.failed()
            self.text_files = store.text_files()
        self.text_stamps: list[tuple[str, int, int]] = []  # text files read in full: recorded at the end
        self.late: list[Failed] = []  # failures recorded at the end: lines of text files, names that are not UTF-8
        self.text_lines = 0  # lines of the text files to read, not blank

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
            self.fail(Failure("file", path, unreadable(exc)))
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

    def _chunk_files(self, items: list[Item]) -> None:
        pending = Pending()
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
        pending = Pending()
        for key, text in texts:
            self._place(pending, key, None, None, digest(text.encode("utf-8", "surrogatepass")), text, 0, text)
        self._commit(pending, len(texts))

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

