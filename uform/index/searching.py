"""What an open index answers: its items (counted, listed, exported) and the nearest of them to a
query (a text, a media file or an embedding: exact, or through the IVF lists of a clustered
index), each from one snapshot of the store; and the model that encodes a query, loaded on first
use. :class:`index.Index` opens the index, and updates it."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..core.types import Scalar
from . import ivf, scoring
from .identity import MODALITIES, Entry, Identity, kind_of
from .scoring import Hit
from .store import Store

if TYPE_CHECKING:
    from ..core.executor import Executor
    from ..model import Model

_PathLike = str | os.PathLike[str]


class Searching:
    """The reads and searches of :class:`index.Index`, which sets these attributes."""

    path: Path
    checkpoint: Path
    quantization: str
    identity: Identity
    _store: Store
    _model: Model | None
    _owns_model: bool
    _executor: Executor | None
    _cache: tuple[int, int, np.ndarray, np.ndarray] | None
    _ivf: tuple[str, ivf.Lists] | None

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
        from ..core.errors import InputError
        from ..inputs import modality_of
        from ..verbs import ITEM_VERBS
        from ..core.arena import Arena

        p = os.fspath(path)
        modality = modality_of(p)
        if modality is None:
            raise InputError(0, "not a file of a known media type (image, video or audio by its extension)", p)
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
