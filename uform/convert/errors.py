"""The error of a conversion: a source uform cannot convert."""

from __future__ import annotations

from uform.core.errors import CheckpointError

__all__ = ["ConvertError"]


class ConvertError(CheckpointError):
    """A source uform cannot convert: the message names the file, tensor or field and why."""
