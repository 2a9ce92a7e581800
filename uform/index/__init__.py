"""The persistent index: what was embedded, keyed by content (docs/index.md).

``from uform.index import Index``; ``uform index PATH... --into INDEX`` and ``uform search
QUERY --index INDEX`` are its command. SQLite (the standard library) holds the items, a file of
fixed-size rows beside it the vectors; ``pyarrow`` (an optional extra) only for Parquet.
"""

from __future__ import annotations

from .identity import FORMAT, Entry, Identity, IndexBusyError, IndexFormatError, IndexModelError
from .index import Index
from .scoring import Hit
from .sources import Text
from .update import UpdateReport

__all__ = ["FORMAT", "Entry", "Hit", "Identity", "Index", "IndexBusyError", "IndexFormatError", "IndexModelError", "Text", "UpdateReport"]
