"""What ``uform encode``, ``uform search`` and ``uform.index`` read, and how it goes through the
Model's verbs: a batch call per modality, with a bad item reported and left out instead of
ending the run. The items themselves (texts, media files by extension, folders walked, failures,
what is passed over) are ``uform.items``; their names are re-exported here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .items import EXTENSIONS as EXTENSIONS
from .items import MODALITY_OF as MODALITY_OF
from .items import PLURAL as PLURAL
from .items import Failure as Failure
from .items import Gathered as Gathered
from .items import Item as Item
from .items import Modality as Modality
from .items import counted as counted
from .items import gather as gather
from .items import is_unserved as is_unserved
from .items import known_extensions as known_extensions
from .items import modality_of as modality_of
from .items import pass_over_unserved as pass_over_unserved
from .items import unserved as unserved
from .items import unserved_reason as unserved_reason
from .verbs import ITEM_VERBS

if TYPE_CHECKING:
    from uform import Model, Scalar


class Bar(Protocol):
    """What the walks report progress to (the command's tqdm bar, uform.cli.common.Bar)."""

    def describe(self, what: str) -> None: ...

    def to(self, done: int) -> None: ...

    def handler(self, offset: int = 0) -> Callable[[int, int], bool | None]: ...


class Silent:
    """A Bar that shows nothing (the Python API's walks: uform.index)."""

    def describe(self, what: str) -> None:
        pass

    def to(self, done: int) -> None:
        pass

    def handler(self, offset: int = 0) -> Callable[[int, int], bool | None]:
        return lambda done, total: None


CHUNK = 256  # items per verb call: bounds the memory of one call and the work a retry repeats
RETRIES = 3  # bad items dropped from a chunk by re-calling it whole; past this, the rest go one by one


@dataclass
class Encoding:
    """The rows of the items that encoded, in the order of ``items``."""

    items: list[Item]
    embeddings: np.ndarray  # [rows, dimensions] (B1: packed bits), a copy owned by the caller
    scales: np.ndarray | None  # I8 row scales
    failures: list[Failure]


def encode(
    model: Model,
    items: Sequence[Item],
    *,
    scalar: Scalar,
    dimensions: int | None,
    bar: Bar,
    report: Callable[[Failure], None],
    payloads: Sequence[str | bytes] | None = None,
) -> Encoding:
    """Each item's embedding through the Model's verbs: one call per modality (per ``CHUNK``
    items), the verbs' own batching inside it.

    A verb refuses a whole call for one bad item (``InputError`` naming its index and reason,
    nothing written): the item is reported and the call is made again without it; after
    ``RETRIES`` such refusals in one chunk, its remaining items are encoded one at a time. A
    modality the checkpoint has no tower for fails each of its items with the verb's reason.

    With ``dimensions`` below the model's, rows are computed in F32, cut to their first
    ``dimensions`` values, made unit again (Matryoshka) and stored in ``scalar``.
    ``payloads`` (one per item) go to the verbs in place of the items' values: the bytes of
    files already read (``uform index`` encodes exactly the bytes it hashed).
    """
    from uform import Arena, Scalar, UnsupportedError
    from uform.core import scalars

    full = model.describe().dimensions
    cut = dimensions is not None and dimensions < full
    asked = Scalar.F32 if cut else scalar
    arena = Arena()
    by_modality: dict[Modality, list[int]] = {}
    for i, item in enumerate(items):
        by_modality.setdefault(item.modality, []).append(i)

    kept: list[np.ndarray] = []  # item indices, per block
    blocks: list[np.ndarray] = []
    block_scales: list[np.ndarray] = []
    failures: list[Failure] = []
    done = 0

    def failed(index: int, reason: str) -> None:
        item = items[index]
        f = Failure(item.kind, item.value, reason)
        failures.append(f)
        report(f)

    values: Sequence[str | bytes] = [item.value for item in items]
    for modality, indices in by_modality.items():
        verb = getattr(model, ITEM_VERBS[modality])
        bar.describe(PLURAL[modality])
        for start in range(0, len(indices), CHUNK):
            chunk = indices[start : start + CHUNK]
            try:
                for ok, rows, row_scales in _encode_chunk(verb, [(payloads or values)[i] for i in chunk], arena, asked, bar, done, failed, chunk):
                    kept.append(np.asarray([chunk[k] for k in ok], np.int64))
                    blocks.append(rows)
                    if row_scales is not None:
                        block_scales.append(row_scales)
            except UnsupportedError as exc:
                for i in chunk:
                    failed(i, str(exc))
            done += len(chunk)
            bar.to(done)

    order = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    rank = np.argsort(order, kind="stable")
    if blocks:
        embeddings = np.concatenate(blocks)[rank]
        scales = np.concatenate(block_scales)[rank] if block_scales else None
    else:
        shape, dtype, has_scales = scalars.layout(asked, 0, full)
        embeddings, scales = np.zeros(shape, dtype), (np.zeros(0, np.float32) if has_scales else None)
    if cut:
        assert dimensions is not None
        prefix = embeddings[:, :dimensions]
        prefix = prefix / np.maximum(np.linalg.norm(prefix, axis=1, keepdims=True), np.float32(1e-12))
        shape, dtype, has_scales = scalars.layout(scalar, len(prefix), dimensions)
        embeddings = np.empty(shape, dtype)
        scales = np.empty(len(prefix), np.float32) if has_scales else None
        scalars.store(prefix.astype(np.float32), scalar, embeddings, scales)
    return Encoding([items[i] for i in order[rank]], embeddings, scales, failures)


_Block = tuple[list[int], np.ndarray, "np.ndarray | None"]


def _encode_chunk(
    verb: Callable[..., object],
    values: list[str | bytes],
    arena: object,
    scalar: Scalar,
    bar: Bar,
    offset: int,
    failed: Callable[[int, str], None],
    chunk: list[int],
) -> list[_Block]:
    """Blocks of (positions in ``values`` that encoded, their rows, their scales)."""
    from uform import Encoded, InputError

    def call(positions: list[int], progress_offset: int) -> _Block:
        encoded = verb([values[k] for k in positions], arena, outputs_scalar=scalar, progress=bar.handler(progress_offset))
        assert isinstance(encoded, Encoded)
        scales = None if encoded.embedding_scales is None else np.array(encoded.embedding_scales)
        return positions, np.array(encoded.embeddings), scales

    pending = list(range(len(values)))
    for _ in range(RETRIES):
        try:
            return [call(pending, offset)] if pending else []
        except InputError as exc:
            position = pending.pop(exc.index)
            failed(chunk[position], exc.reason)
    blocks = []
    for k in pending:  # past RETRIES bad items: the rest one at a time
        try:
            blocks.append(call([k], offset + k))
        except InputError as exc:
            failed(chunk[k], exc.reason)
    return blocks
