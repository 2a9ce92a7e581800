"""``Index``: open or create an index, update it, search it, read it, remove from it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..core.scalars import coerce
from ..core.types import Scalar
from . import ivf, scoring
from .scoring import Hit
from .identity import MODALITIES, Entry, Identity, IndexModelError, checkpoint_digest, kind_of
from .store import Store, refuse_foreign
from .sources import Text, escape, refuse_inside
from .update import UpdateReport, Updater

if TYPE_CHECKING:
    from ..inputs import Failure
    from ..core.executor import Executor
    from ..model import Model

_PathLike = str | os.PathLike[str]


class Index:
    """An incremental, crash-safe index of embeddings made by one model (docs/index.md).

    ``Index(path)`` opens the index folder ``path``, creating it when missing (unless
    ``read_only``). The model is ``checkpoint`` (default: the shipped model) loaded at
    ``quantization`` when something must be encoded, or ``model`` when given (then name its
    file in ``checkpoint``: the file's SHA-256 is the identity an index keeps). An index made
    by another checkpoint, quantization or ``outputs_scalar`` raises :class:`IndexModelError`.
    """

    def __init__(
        self,
        path: _PathLike,
        *,
        checkpoint: _PathLike | None = None,
        model: Model | None = None,
        quantization: Scalar | str | None = None,
        outputs_scalar: Scalar | str | None = None,
        read_only: bool = False,
        executor: Executor | None = None,
    ) -> None:
        from ..model import default_checkpoint

        if model is not None and checkpoint is None:
            raise ValueError("Index(model=...) needs checkpoint=, the file the model was loaded from: its SHA-256 is the index's model identity")
        if not os.fspath(path):
            raise ValueError("the index path is empty; name the index folder")
        self.path = Path(path)
        self.checkpoint = Path(checkpoint) if checkpoint is not None else default_checkpoint()
        self._model, self._owns_model, self._executor = model, False, executor
        given_q = coerce(quantization, "quantization").value if quantization is not None else None
        asked_q = given_q or (model.describe().quantization.value if model is not None else Scalar.BF16.value)
        asked_s = coerce(outputs_scalar).value if outputs_scalar is not None else None
        self.quantization = asked_q
        sha = checkpoint_digest(self.checkpoint)
        exists = (self.path / "index.sqlite").exists()
        identity = None
        if not exists and not read_only:
            refuse_foreign(self.path)  # before a model is loaded for it
            dims = self._load().describe().dimensions
            identity = Identity(sha, escape(os.path.abspath(self.checkpoint)), asked_q, dims, asked_s or Scalar.F32.value)
        try:
            self._store = Store(self.path, write=not read_only, identity=identity)
        except BaseException:
            self._release_model()  # a model loaded to learn the dimensions of an index not made
            raise
        mine = self._store.identity
        if given_q is None and model is None:  # no quantization asked: the index's own
            asked_q = self.quantization = mine.quantization
        theirs = Identity(sha, escape(os.path.abspath(self.checkpoint)), asked_q, 0, asked_s or mine.scalar)
        if (mine.checkpoint_sha256, mine.quantization, mine.scalar) != (theirs.checkpoint_sha256, theirs.quantization, theirs.scalar):
            self._store.close()
            raise IndexModelError(
                f"{self.path} was made by {mine.describe()}; this is {theirs.describe()}: its vectors cannot be mixed or compared. "
                f"pass that model (on the command line: --model {mine.checkpoint} --quantization {mine.quantization}"
                f"{f' --outputs-scalar {mine.scalar}, or no --outputs-scalar' if mine.scalar != theirs.scalar else ''}), or index into another folder"
            )  # fmt: skip
        self.identity = mine
        self._cache: tuple[int, int, np.ndarray, np.ndarray] | None = None
        self._ivf: tuple[str, ivf.Lists] | None = None

    # -- the model ---------------------------------------------------------------------------

    def _load(self) -> Model:
        if self._model is None:
            from ..model import Model

            self._model = Model.load_ram(self.checkpoint, quantization=Scalar(self.quantization), executor=self._executor)
            self._owns_model = True
        return self._model

    def _release_model(self) -> None:
        if self._owns_model and self._model is not None:
            self._model.close()
            self._model = None

    @property
    def model(self) -> Model:
        """The model (loaded on first use)."""
        return self._load()

    # -- updating ----------------------------------------------------------------------------

    def update(
        self,
        sources: Iterable[_PathLike | Text],
        *,
        progress: Callable[[int, int], bool | None] | None = None,
        report: Callable[[Failure], None] | None = None,
        compact: bool = True,
    ) -> UpdateReport:
        """Bring the index up to date with ``sources``: files, folders (walked as ``uform encode``
        walks them), ``.txt``/``.jsonl`` files (a text a line) and :class:`Text` items. Only new
        or changed content is encoded; rows of files gone from under the paths given leave.
        ``progress(done, total)`` after each committed chunk (``False`` cancels: committed
        chunks stay); ``report(failure)`` as each item fails."""
        from ..inputs import Silent

        store = self._writer()
        sources = list(sources)
        refuse_inside(self.path, sources)
        result = Updater(store, self._load, progress, report, Silent()).run(sources)
        if compact and not self.build_ivf():
            self.compact(only_if_worth=True)
        return result

    def remove(self, paths: Iterable[_PathLike]) -> int:
        """Remove the items of ``paths`` (a folder: every item under it; a text file: its lines; a
        :class:`Text`'s key as it was given); answer how many."""
        named = [os.fspath(p) for p in paths]
        if "" in named:
            raise ValueError("a path to remove is empty; it names no item (pass '.' to remove every item under the current folder)")
        store = self._writer()
        roots = [os.path.abspath(p) for p in named]
        return store.remove(roots, named)  # a Text's key is not a path: also as it was given

    def compact(self, *, only_if_worth: bool = False) -> int:
        """Rewrite the vectors without the rows of removed items; answer the rows dropped.
        ``only_if_worth``: only when they are over a quarter of the rows."""
        store = self._writer()
        with store.snapshot():
            live = store.count()
            _, slots = store.state()
        if only_if_worth and (slots - live) * 4 <= slots:
            return 0
        return store.compact()

    def _writer(self) -> Store:
        if not self._store.write:
            raise PermissionError(f"{self.path}: this Index was opened read_only")
        return self._store

    # -- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._store.snapshot():
            return self._store.count()

    def counts(self) -> dict[str, int]:
        """Items per modality (``text``, ``image``, ``video``, ``audio``), from one snapshot."""
        with self._store.snapshot():
            _, slots, _, kinds = self._rows()
            removed = self._store.removed()  # the slots removed since the last compaction: not every item
            if removed is None:  # an earlier uform's index, opened to read: its live slots
                live = None if self._store.count() == slots else self._store.live()
                removed = np.zeros(0, np.int64) if live is None else np.setdiff1d(np.arange(slots), live)
        found = np.bincount(kinds, minlength=len(MODALITIES)) - np.bincount(kinds[removed], minlength=len(MODALITIES))
        return {m: int(found[i]) for i, m in enumerate(MODALITIES)}

    def _rows(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        generation, slots = self._store.state()
        if self._cache is None or self._cache[:2] != (generation, slots):
            self._cache = (generation, slots, *self._store.vectors(generation, slots))
        return self._cache

    def search(self, query: str, k: int = 10, *, modalities: Sequence[str] | None = None, exact: bool = False) -> list[Hit]:
        """The ``k`` items nearest to the text ``query`` (0: all), best first."""
        from ..core.arena import Arena

        embedding = np.array(self._load().text_encode([query], Arena()).embeddings[0])
        return self.search_embedding(embedding, k, modalities=modalities, exact=exact)

    def search_file(self, path: _PathLike, k: int = 10, *, modalities: Sequence[str] | None = None, exact: bool = False) -> list[Hit]:
        """The ``k`` items nearest to a media file (near-duplicates, "more like this"), itself included when indexed."""
        from ..inputs import modality_of
        from ..verbs import ITEM_VERBS
        from ..core.arena import Arena

        p = os.fspath(path)
        modality = modality_of(p)
        if modality is None:
            raise ValueError(f"{p}: not a file of a known media type (image, video or audio by its extension)")
        embedding = np.array(getattr(self._load(), ITEM_VERBS[modality])([p], Arena()).embeddings[0])
        return self.search_embedding(embedding, k, modalities=modalities, exact=exact)

    def search_embedding(self, embedding: np.ndarray, k: int = 10, *, modalities: Sequence[str] | None = None,
                         exact: bool = False, nprobe: int | None = None) -> list[Hit]:  # fmt: skip
        """The ``k`` items nearest to a float32 embedding of the model (0: all), best first. Exact
        below ``ivf.MIN_ROWS`` rows or with ``exact``; else the ``nprobe`` nearest lists of the
        index's IVF (default ``ivf.default_nprobe``) and every row added since it was built."""
        if k < 0:
            raise ValueError(f"k must be 0 (all) or more; got {k}")
        wanted = None if modalities is None else [kind_of(m) for m in modalities]
        scalar = Scalar(self.identity.scalar)
        q = scoring.prepare(embedding, scalar, self.identity.dimensions)
        unit = scoring.prepare(embedding, Scalar.F32, self.identity.dimensions)
        for _ in range(3):  # a compaction between the snapshot and the mapping: take a new snapshot
            try:
                with self._store.snapshot():
                    lists = None if exact or k == 0 else self._lists()
                    blocks = None
                    if lists is not None:
                        _, slots = self._store.state()
                        blocks = [*lists.probe(unit, nprobe or ivf.default_nprobe(len(lists.centroids))), (lists.covered, slots)]
                    return self._search(q, k, wanted, blocks)
            except FileNotFoundError:
                self._cache, self._ivf = None, None
        raise RuntimeError(f"{self.path}: the index kept changing generation under the search")

    def _lists(self) -> ivf.Lists | None:
        name = self._store.ivf_name()
        if name is None:
            return None
        if self._ivf is None or self._ivf[0] != name:
            self._ivf = (name, ivf.load(self.path / name))
        return self._ivf[1]

    def _search(self, q: np.ndarray, k: int, wanted: list[int] | None, blocks: list[tuple[int, int]] | None) -> list[Hit]:
        generation, _, rows, kinds = self._rows()
        try:
            return scoring.search(self._store.resolve, rows, kinds, Scalar(self.identity.scalar), self.identity.dimensions, q, k, wanted, blocks)
        except scoring.DamagedRow as exc:
            raise self._store.damaged(f"vectors-{generation}.bin: {exc}") from None

    def build_ivf(self, *, force: bool = False) -> bool:
        """Cluster a large index (from ``ivf.MIN_ROWS`` live rows; ``force``: whatever its size) for
        approximate search: k-means, then the vectors rewritten grouped by list (docs/index.md).
        Done by :meth:`update` itself when the rows added since the last clustering pass
        ``ivf.REBUILD`` of it; answers whether it clustered."""
        store = self._writer()
        with store.snapshot():
            generation, slots = store.state()
            current = self._lists()
            count = store.count()  # every live slot is read only when it clusters (an update asks each run)
            if Scalar(self.identity.scalar) is Scalar.B1 or not count or (count < ivf.MIN_ROWS and not force):
                return False
            if current is not None and not force and (slots - current.covered) <= ivf.REBUILD * current.covered and (slots - count) * 4 <= slots:
                return False
            live = store.live()
        rows, _ = store.vectors(generation, slots)
        order, lists = ivf.layout(*ivf.cluster(rows, live, Scalar(self.identity.scalar)), live)
        store.compact(order, lists)
        self._cache = self._ivf = None
        return True

    def entries(self) -> Iterator[Entry]:
        """Every item, in slot order, from one snapshot."""
        scalar = Scalar(self.identity.scalar)
        with self._store.snapshot():
            generation, _, rows, kinds = self._rows()
            for slot, path, size, mtime, h, text in self._store.items():
                row = rows[slot]
                if scalar is not Scalar.B1:
                    wide = row["q"].astype(np.float32) * row["s"] if scalar is Scalar.I8 else np.asarray(row, np.float32)
                    norm = float(np.sqrt(np.dot(wide, wide)))
                    if not abs(norm - 1) <= scoring.LIMITS[scalar] - 1:
                        raise self._store.damaged(f"vectors-{generation}.bin: the row of slot {slot} ({path}) is not a unit vector (norm {norm})")
                scaled = scalar is Scalar.I8
                yield Entry(path, MODALITIES[kinds[slot]], h.hex(), size, mtime, text, np.array(row["q"] if scaled else row),
                            float(row["s"]) if scaled else None)  # fmt: skip

    __iter__ = entries

    def failures(self) -> list[tuple[str, str]]:
        """(path, reason) of the items that failed and have not changed since."""
        with self._store.snapshot():
            return [(f.path, f.reason) for f in self._store.failed().values()]

    def export_parquet(self, path: _PathLike) -> int:
        """Write every item to a Parquet file (needs pyarrow); answer the rows written. Schema: docs/index.md."""
        from .parquet import write_index

        return write_index(self.entries(), self.identity, path)

    def import_parquet(self, path: _PathLike) -> int:
        """Add the rows of a Parquet file, or a folder of them, in the schema :meth:`export_parquet`
        and ``uform.ray.index_rows`` write, made by this index's model; answer the rows added.
        A path already holding the same hash is left as it is. Imported files carry no size and
        time: the next :meth:`update` over them reads and hashes each once, and embeds none
        whose hash matches."""
        from .importing import import_rows

        added = import_rows(self._writer(), path)
        if not self.build_ivf():
            self.compact(only_if_worth=True)
        return added

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the files (a writer's lock goes with them) and a model the index loaded."""
        self._cache = None
        self._store.close()
        self._release_model()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Index({str(self.path)!r}, {self.identity.describe()})"

