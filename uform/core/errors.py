"""The exceptions uform raises; every one derives from :class:`UformError`.

::

    UformError
    ├── UnsupportedError        the hardware, install or checkpoint cannot do what was asked
    ├── CheckpointError         a malformed checkpoint (names the tensor or config field)
    ├── InputError              a bad input item (names its index, path and the reason)
    ├── ArenaError
    │   ├── StaleArenaError     an Encoded read after its Arena was reused
    │   └── ArenaBusyError      an Arena handed to two calls at once
    ├── CancelledError          a progress handler returned False
    ├── OutputError             an output not written or not replaced (an OSError too; names the file)
    └── PluginError
        └── PluginConflictError two plugins claim one modality, tower, verb or backend
"""

from __future__ import annotations


class UformError(Exception):
    """Base class of every error uform raises on purpose."""


class UnsupportedError(UformError):
    """What was asked cannot run here: a class the hardware lacks, a missing tower or plugin."""


class CheckpointError(UformError, ValueError):
    """A checkpoint is malformed; the message names the tensor or config field at fault."""


class InputError(UformError, ValueError):
    """One input item is unusable; nothing was written to the caller's arena.

    ``index`` is the item's position in the call, ``path`` its file path when it has one.
    """

    def __init__(self, index: int, reason: str, path: str | None = None) -> None:
        self.index = index
        self.path = path
        self.reason = reason
        where = f"item {index}" + (f" ({path})" if path else "")
        super().__init__(f"{where}: {reason}")


def check_not_released(index: int, item: object) -> None:
    """InputError naming item ``index`` when it is a released ``memoryview`` (any read of it
    raises a bare ValueError, and numpy reads it as an empty object array)."""
    if isinstance(item, memoryview):
        try:
            item.nbytes
        except ValueError:
            raise InputError(index, "the memoryview was released (memoryview.release() or the end of its "
                                    "with block): nothing can be read from it") from None


class ArenaError(UformError):
    """Misuse of an :class:`~uform.Arena`."""


class StaleArenaError(ArenaError):
    """An output was read after its arena was reused by a later call."""


class ArenaBusyError(ArenaError):
    """An arena was handed to a call while another call was still writing into it."""


class CancelledError(UformError):
    """A progress handler returned False; the call stopped and wrote nothing."""


class OutputError(UformError, OSError):
    """An output was not written (or not allowed to be replaced); the message names the file.
    Every old file is as it was (:mod:`uform.core.files`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0])


def reason_of(exc: BaseException) -> str:
    """Why an operating-system call failed, as an :class:`OutputError` says it: an ``OSError``'s
    ``strerror`` ("Permission denied"), else the exception's text or its type's name."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class PluginError(UformError):
    """A plugin is broken or misdeclared."""


class PluginConflictError(PluginError):
    """Two plugins claim the same name; the message names both distributions."""
