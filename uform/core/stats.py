"""Counters a call adds to when the caller passes a stats object."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class EncodeStats:
    """What every encode call counts. Calls add to these fields, so one object can total many calls.

    ``seconds_preprocess`` is time the compute loop waited for inputs to be prepared
    (decoding runs ahead in threads, so it is the part that did not overlap compute).
    """

    items: int = 0
    batches: int = 0
    seconds_preprocess: float = 0.0
    seconds_compute: float = 0.0
    seconds_total: float = 0.0

    def reset(self) -> None:
        """Set every counter back to zero."""
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())

    def add(self, other: EncodeStats) -> None:
        """Add every counter of ``other`` (of this class or a base of it) to this object's."""
        for f in fields(other):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
