"""Read items on their way into the index, a chunk at a time: each routed by its content hash
(the same content as its row, a move, a copy, or new content to encode), what is new encoded
(an item the model refuses, or of a modality it has no tower for, becomes a failure), and the
chunk committed through :meth:`Store.commit`; what one update did, counted (:class:`UpdateReport`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..core.errors import CancelledError
from ..core.progress import cancels
from ..core.scalars import store as cast
from ..core.types import Scalar
from ..inputs import Failure, Item, encode, pass_over_unserved, unserved_reason
from .identity import MODALITIES
from .records import Chunk, Failed, Insert, Known, Move
from .store import Store

if TYPE_CHECKING:
    from ..inputs import Bar
    from ..model import Model

__all__ = ["Intake", "New", "Pending", "UpdateReport", "store_rows"]


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
class New:
    """An item on its way in: its vector encoded from ``payload``, or copied from the row ``copy_of``."""

    insert: Insert
    payload: str | bytes | None = None
    copy_of: int | None = None
    like: str | None = None  # an earlier item of its chunk with the same content: its vector, once encoded


@dataclass
class Pending:
    """A chunk on its way in: new items, paths that take a stored row, failures to record."""

    new: list[New] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    failures: list[Failed] = field(default_factory=list)
    contents: dict[bytes, str] = field(default_factory=dict)  # the new content of this chunk: its first path, by hash


class Intake:
    """The chunks of one update against a writer's :class:`Store`; ``model()`` loads the model
    when needed. update.Updater finds the items and sets ``missing`` (content of paths gone, by
    hash) and ``walked`` (files found in folders) before the first chunk."""

    missing: dict[bytes, str]
    walked: set[str]

    def __init__(self, store: Store, model: Callable[[], Model], progress: Callable[[int, int], object] | None,
                 report: Callable[[Failure], None] | None, bar: Bar) -> None:  # fmt: skip
        self.store, self._model, self._progress, self._report, self._bar = store, model, progress, report, bar
        self.result = UpdateReport()
        self.rows: dict[str, Known] = {}  # the items under the sources (Updater.run reads them)
        self.seen: set[str] = set()
        self.done = self.total = 0

    def fail(self, f: Failure, *, record: tuple[str, int, int] | None = None, pending: Pending | None = None) -> None:
        self.result.failed.append(f)
        if record is not None and pending is not None:
            pending.failures.append(Failed(*record, f.reason))
        if self._report is not None:
            self._report(f)

    def _place(self, pending: Pending, path: str, size: int | None, mtime: int | None, h: bytes, text: str | None,
               kind: int, payload: str | bytes) -> None:  # fmt: skip
        """Route one read item: the same content as its row, a move, a copy, or new content to encode."""
        self.seen.add(path)
        row = self.rows.get(path)
        if row is not None and row.hash == h:
            if (row.size, row.mtime) != (size, mtime):  # the same stamp (a text's none) is not written again
                pending.moves.append(Move(path, size, mtime, row.slot))
            self.result.touched += 1
        elif h in self.missing:
            old = self.missing.pop(h)
            slot = self.rows.pop(old).slot
            self.rows[path] = Known(slot, size, mtime, h, text is not None)
            pending.moves.append(Move(path, size, mtime, slot))
            self.result.moved += 1
        elif (found := self.store.slot_of(h)) is not None:  # a row of this content anywhere in the index: the hash index's lookup
            pending.new.append(New(Insert(path, size, mtime, h, text, kind), copy_of=found))
            self.result.copied += 1
        elif h in pending.contents:  # new content met twice in one chunk: encoded once, copied (its payload kept, in case it is refused there)
            pending.new.append(New(Insert(path, size, mtime, h, text, kind), payload=payload, like=pending.contents[h]))
            self.result.copied += 1
        else:
            pending.contents[h] = path
            pending.new.append(New(Insert(path, size, mtime, h, text, kind), payload=payload))

    def _commit(self, pending: Pending, count: int) -> None:
        """Encode what is new (an item the model refuses becomes a failure), then commit the chunk (Store.commit)."""
        store = self.store
        alike = [n for n in pending.new if n.like is not None]
        vectors = self._encode([n for n in pending.new if n.payload is not None and n.like is None], pending)
        for n in alike:
            if n.like in vectors:
                n.payload = None  # a copy of its chunk's first path of the same content
            else:  # that path was refused or passed over: this one is tried as its own
                n.like = None
                self.result.copied -= 1
        vectors.update(self._encode([n for n in alike if n.like is None], pending))
        keep = [n for n in pending.new if n.payload is None or n.insert.path in vectors]
        rows = np.zeros(len(keep), store.dtype)
        if any(n.copy_of is not None for n in keep):
            old, _ = store.vectors(*store.state())
        for i, n in enumerate(keep):
            rows[i] = old[n.copy_of] if n.copy_of is not None else vectors[n.like or n.insert.path]
        at = store.commit(Chunk(rows, [n.insert for n in keep], pending.moves, pending.failures))
        for slot, n in enumerate(keep, at):
            ins = n.insert
            self.rows[ins.path] = Known(slot, ins.size, ins.mtime, ins.hash, ins.text is not None)
        for f in pending.failures:
            self.rows.pop(f.path, None)
        self.result.added += sum(1 for n in keep if n.copy_of is None and n.like is None)
        self.done += count
        if self._progress is not None and cancels(self._progress(self.done, self.total)):
            raise CancelledError("the update was cancelled by its progress handler; what was committed stays")

    def _encode(self, to_encode: list[New], pending: Pending) -> dict[str, np.ndarray]:
        """The stored rows of ``to_encode``'s items by path; an item the model refuses, or has no
        tower for, is recorded in ``pending``'s failures and absent."""
        store = self.store
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
            return vectors
        return {}

    def _pass_over_unserved(self, to_encode: list[New], pending: Pending) -> list[New]:
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
