"""The records the store reads and writes (store.py): typed rows instead of tuples read by position."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class Known(NamedTuple):
    """What an update needs of a stored item (``text``: a text item, its path a key)."""

    slot: int
    size: int | None  # None: an imported row (no stamp) or a text
    mtime: int | None  # -1: the file changed while it was read
    hash: bytes
    text: bool


class Stored(NamedTuple):
    """One item as the database holds it."""

    slot: int
    path: str
    size: int | None
    mtime: int | None
    hash: bytes
    text: str | None


class Insert(NamedTuple):
    """An item to point at the row appended for it (``kind``: its MODALITIES position)."""

    path: str
    size: int | None
    mtime: int | None
    hash: bytes
    text: str | None
    kind: int


class Move(NamedTuple):
    """A path that takes the stored row ``slot`` (its own content, moved in or read again)."""

    path: str
    size: int | None
    mtime: int | None
    slot: int


class Failed(NamedTuple):
    """An item that failed, with the stamp it had (so an unchanged one is not tried again)."""

    path: str
    size: int | None
    mtime: int | None
    reason: str


@dataclass
class Chunk:
    """What one commit puts in: ``rows`` (of the store's dtype) for ``inserts``, one each."""

    rows: np.ndarray
    inserts: list[Insert] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    failures: list[Failed] = field(default_factory=list)
    new_paths: bool = False  # the inserts' paths are known to hold no row yet (a bulk load): none is looked for
