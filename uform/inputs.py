"""What ``uform encode``, ``uform search`` and ``uform.index`` read: texts, media files by extension, folders walked
recursively; and how they go through the Model's verbs, a batch call per modality, with
a bad item reported and left out instead of ending the run."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

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

Modality = Literal["text", "image", "video", "audio"]

EXTENSIONS: dict[Modality, tuple[str, ...]] = {
    "image": (".jpg", ".jpeg", ".png", ".webp"),
    "video": (".mp4", ".m4v", ".mov", ".webm", ".mkv"),
    "audio": (".wav", ".flac", ".mp3", ".opus", ".ogg", ".oga"),
}
MODALITY_OF: dict[str, Modality] = {ext: m for m, exts in EXTENSIONS.items() for ext in exts}
PLURAL: dict[Modality, str] = {"text": "texts", "image": "images", "video": "videos", "audio": "recordings"}


def counted(n: int, modality: Modality) -> str:
    """``"1 image"``, ``"3 recordings"``."""
    return f"{n} {PLURAL[modality] if n != 1 else PLURAL[modality][:-1]}"


CHUNK = 256  # items per verb call: bounds the memory of one call and the work a retry repeats
RETRIES = 3  # bad items dropped from a chunk by re-calling it whole; past this, the rest go one by one


def modality_of(path: str) -> Modality | None:
    return MODALITY_OF.get(os.path.splitext(path)[1].lower())


def known_extensions() -> str:
    return "; ".join(f"{m}s {' '.join(exts)}" for m, exts in EXTENSIONS.items())


@dataclass(frozen=True)
class Item:
    """One input: a text, or a file of one modality."""

    modality: Modality
    value: str  # the text, or the path as given or as found under a folder
    walked: bool = field(default=False, compare=False)  # found inside a folder, not named by the caller

    @property
    def kind(self) -> Literal["text", "file"]:
        return "text" if self.modality == "text" else "file"

    def record(self) -> dict[str, str]:
        """What the index says of the item (without its row)."""
        return {"kind": self.kind, "modality": self.modality, ("text" if self.kind == "text" else "path"): self.value}


@dataclass(frozen=True)
class Failure:
    """An input that was not encoded: a file, a folder or a text, and why."""

    kind: Literal["text", "file", "folder"]
    value: str
    reason: str

    def line(self) -> str:
        what = repr(self.value) if self.kind == "text" else self.value
        return f"uform: failed: {self.kind} {what}: {self.reason}"

    def record(self) -> dict[str, str]:
        return {"kind": self.kind, ("text" if self.kind == "text" else "path"): self.value, "reason": self.reason}


@dataclass
class Gathered:
    """The inputs found, those that failed before encoding, and the entries of folders passed over."""

    items: list[Item] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why): unknown extensions, links to folders


def gather(arguments: Iterable[str], *, texts: bool, report: Callable[[Failure], None]) -> Gathered:
    """Items of the command line, in order.

    An argument naming an existing path (a dangling symbolic link included) is a file or a
    folder; otherwise, when ``texts`` is true, it is a text — unless it ends with a media
    extension and holds no space, which is reported as a missing file (pass such a text with
    ``--text``). A file given by name must have a known extension; inside folders, files of
    other extensions and symbolic links to folders are passed over (``skipped``).
    """
    out = Gathered()

    def fail(f: Failure) -> None:
        out.failures.append(f)
        report(f)

    for arg in arguments:
        if os.path.lexists(arg):
            if os.path.isdir(arg):
                _walk(arg, out, fail)
                continue
            modality = modality_of(arg)
            if modality is None:
                fail(Failure("file", arg, f"unknown file type {os.path.splitext(arg)[1] or '(no extension)'!r}: known are {known_extensions()}"))
            else:
                out.items.append(Item(modality, arg))
        elif not texts:
            fail(Failure("file", arg, "no such file or folder"))
        elif modality_of(arg) is not None and not any(c.isspace() for c in arg):
            fail(Failure("file", arg, "no such file (to encode it as a text, pass it with --text)"))
        else:
            out.items.append(Item("text", arg))
    return out


def _walk(folder: str, out: Gathered, fail: Callable[[Failure], None]) -> None:
    """``folder``'s files, recursively, in the order of their paths; with a stack of its own, not
    ``os.walk``'s recursion, so a folder any number of levels deep is walked (os.walk raised
    RecursionError past about 1,000)."""
    found: list[str] = []
    pending = [folder]
    while pending:
        root = pending.pop()
        try:
            with os.scandir(root) as listing:
                entries = list(listing)
        except OSError as exc:
            fail(Failure("folder", exc.filename or root, f"cannot list the folder ({exc.strerror or exc})"))
            continue
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows a link, as os.walk does
            except OSError:
                is_dir = False
            if not is_dir:
                found.append(entry.path)
            elif entry.is_symlink():
                out.skipped.append((entry.path, "a symbolic link to a folder (not followed)"))
            else:
                pending.append(entry.path)
    for path in sorted(found):  # in the order of their paths
        modality = modality_of(path)
        if modality is None:
            out.skipped.append((path, "unknown extension"))
        else:
            out.items.append(Item(modality, path, walked=True))


def unserved_reason(modality: str) -> str:
    """Why a file found inside a folder was passed over (an index records it so, as it records a
    failure, and does not read the file again while it is unchanged)."""
    return f"the model has no {modality} tower"


def is_unserved(reason: str) -> bool:
    """Whether ``reason`` is :func:`unserved_reason`'s."""
    return any(reason == unserved_reason(m) for m in PLURAL)


def pass_over_unserved(items: Sequence[Item], model: Model) -> tuple[list[Item], list[Item]]:
    """The items ``model`` can encode, and those passed over: files found inside folders whose
    modality the model has no tower for (a folder of photos and music searched with a converted
    CLIP: the music is not the search's, and no failure). A file named by the caller is kept,
    and fails with the verb's reason."""
    served = model.served.modalities
    return [i for i in items if i.modality in served or not i.walked], [i for i in items if i.modality not in served and i.walked]


def unserved(passed: Sequence[Item]) -> tuple[list[tuple[str, str]], str]:
    """The ``skipped`` entries of the items :func:`pass_over_unserved` passed over, and one line
    saying so (``passed over 8 recordings in the folders: the model has no audio tower``)."""
    counts = Counter(i.modality for i in passed)
    line = f"passed over {', '.join(counted(n, m) for m, n in counts.items())} in the folders: {unserved_reason(' or '.join(counts))}"
    return [(i.value, unserved_reason(i.modality)) for i in passed], line


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
