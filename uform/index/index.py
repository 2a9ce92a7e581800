"""``Index``: open or create an index, update it, search it, read it, remove from it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..core.scalars import coerce
from ..core.types import Scalar
from . import ivf
from .identity import Identity, IndexModelError, checkpoint_digest
from .searching import Searching
from .sources import Text, escape, refuse_inside
from .store import Store, refuse_foreign
from .update import UpdateReport, Updater

if TYPE_CHECKING:
    from ..inputs import Failure
    from ..core.executor import Executor
    from ..model import Model

_PathLike = str | os.PathLike[str]


class Index(Searching):
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
