"""The items ``uform encode``, ``uform search`` and ``uform.index`` read: texts, media files by
extension, folders walked recursively (``gather``); an item that failed and why (``Failure``);
files found in folders whose modality the model has no tower for, passed over. How items go
through the Model's verbs is ``uform.inputs``."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from uform import Model

Modality = Literal["text", "image", "video", "audio"]

EXTENSIONS: dict[Modality, tuple[str, ...]] = {
    "image": (".jpg", ".jpeg", ".png", ".webp"),
    "video": (".mp4", ".m4v", ".mov", ".webm", ".mkv"),
    "audio": (".wav", ".flac", ".mp3", ".opus", ".ogg", ".oga", ".m4a"),
}
MODALITY_OF: dict[str, Modality] = {ext: m for m, exts in EXTENSIONS.items() for ext in exts}
PLURAL: dict[Modality, str] = {"text": "texts", "image": "images", "video": "videos", "audio": "recordings"}


def counted(n: int, modality: Modality) -> str:
    """``"1 image"``, ``"3 recordings"``."""
    return f"{n} {PLURAL[modality] if n != 1 else PLURAL[modality][:-1]}"


def modality_of(path: str) -> Modality | None:
    return MODALITY_OF.get(os.path.splitext(path)[1].lower())


def known_extensions() -> str:
    return "; ".join(f"{m}s {' '.join(exts)}" for m, exts in EXTENSIONS.items())


def value_key(kind: object) -> Literal["text", "path"]:
    """The field of a record (the index's, an encode output's row, a failure) that holds what the
    item is: ``text`` for a text, ``path`` for anything else (a file, a folder)."""
    return "text" if kind == "text" else "path"


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
        return {"kind": self.kind, "modality": self.modality, value_key(self.kind): self.value}


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
        return {"kind": self.kind, value_key(self.kind): self.value, "reason": self.reason}


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
