"""Who writes a temporary, as its name says, and the sweep of those a killed writer left.

Every temporary uform writes (:mod:`uform.core.files`) is named after its writer:
``.NAME.MACHINE-BOOT-SPACE-PID-START-RANDOM.partial``, or a scratch folder's
``.MACHINE-BOOT-SPACE-PID-START-RANDOM.partial`` (MACHINE, BOOT, SPACE: 8 hex digits each, this
machine, this boot of it and this process-id namespace, :func:`uform.core.boots.ids`; PID and
START: the process id and its start time in clock ticks since boot). :func:`token` makes that
middle, :func:`stem` cuts NAME so the whole stays within :data:`NAME_MAX` bytes, :func:`writer`
says who writes now. :func:`sweep` removes from a folder only the temporaries whose writer is
provably gone: a process of this boot and namespace that no longer runs, or any of an earlier
boot of this machine where that is provable (:func:`uform.core.boots.earlier_boot_here`);
:func:`sweep_once` does so once a process for a folder listed at every load (the system's
temporary folder, which may hold a hundred thousand names of others). :func:`leftovers` finds
what a killed writer of one file left beside it (:func:`target`: where writing a path lands),
:func:`own_folder` makes a process's scratch folder, named the same way.
"""

from __future__ import annotations

import glob
import os
import re
import secrets
import shutil
import threading
from pathlib import Path

from . import boots
from .errors import OutputError, reason_of

PARTIAL = ".partial"
NAME_MAX = 255  # the longest name of a file most file systems take, in bytes
# a temporary uform names after its writer (the module's names); _EARLIER: the names before MACHINE and BOOT
_OWNED = re.compile(
    r"\.(?:.*\.)?([0-9a-f]{8})-([0-9a-f]{8})-([0-9a-f]{8})-([1-9][0-9]{0,9})-([0-9]{1,20})-[0-9a-f]{8}" + re.escape(PARTIAL), re.S
)
_EARLIER = re.compile(r"\.(?:.*\.)?([0-9a-f]{8})-([1-9][0-9]{0,9})-([0-9]{1,20})-[0-9a-f]{8}" + re.escape(PARTIAL), re.S)


def stem(name: str) -> str:
    """``name`` as its temporary holds it: cut (whole characters) so that the temporary's name,
    with the longest middle :func:`token` makes, stays within :data:`NAME_MAX` bytes."""
    room = NAME_MAX - len(f"..{'f' * 8}-{'f' * 8}-{'f' * 8}-{'9' * 10}-{'9' * 20}-{'f' * 8}{PARTIAL}")
    while len(os.fsencode(name)) > room:
        name = name[:-1]
    return name


def token() -> str:
    """The middle of a new temporary's name: its writer (:func:`writer`) and 8 random hex digits."""
    me = writer()
    return f"{me[0]}-{me[1]}-{me[2]}-{secrets.token_hex(4)}" if me else secrets.token_hex(4)


def _started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``); None when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def writer() -> tuple[str, int, int] | None:
    """Who writes a temporary made now: (``MACHINE-BOOT-SPACE``: this machine, this boot of it
    and this process-id namespace, :func:`uform.core.boots.ids`; the process id; its start
    time); None where that cannot be told (not Linux), and then no temporary is ever taken for
    a killed writer's."""
    names, pid = boots.ids(), os.getpid()
    start = _started(pid) if names else None
    return None if names is None or start is None else ("-".join(names), pid, start)


def _gone(pid: int, start: int) -> bool:
    """True only when process ``pid`` that started at ``start`` is provably not running: no such
    process, or one that started at another time (its id taken again)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # there, but not ours to signal (another user's); or no id at all
        pass
    started = _started(pid)
    return started is not None and started != start


def sweep(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries in ``folder`` that a killed uform writer left (the files, and the
    scratch folders of a set), and return them: only names uform makes whose writer is provably
    gone: a process of this boot and process-id namespace (:func:`writer`) that no longer runs
    (:func:`_gone`), or any of an earlier boot of this machine where that is provable
    (:func:`uform.core.boots.earlier_boot_here`). A temporary of a writer still running, of
    another machine, container or a shared folder's other boot, or of a name uform does not
    make stays."""
    me = boots.ids()
    if me is None:
        return []
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(".") and e.name.endswith(PARTIAL)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        if not _left_by_the_gone(entry.name, entry.path, me[2]):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            elif entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
            else:  # a link, a FIFO: uform makes none
                continue
        except OSError:  # another writer removed it first, or it is not ours to remove
            continue
        removed.append(Path(entry.path))
    return removed


_swept: set[str] = set()  # the folders sweep_once has swept in this process
_swept_lock = threading.Lock()


def sweep_once(folder: str | os.PathLike[str]) -> None:
    """:func:`sweep` ``folder`` the first time this process asks, and not again: listing a folder
    of 100,000 names costs about 0.2 s (a 2-core Zen 3), which every load paid for each tower."""
    key = os.path.abspath(folder)
    with _swept_lock:
        if key in _swept:
            return
        _swept.add(key)
    sweep(folder)


def _left_by_the_gone(name: str, path: str, space: str) -> bool:
    """Whether the temporary ``name`` (at ``path``) is a writer's that is provably gone, this
    boot's and process-id namespace being ``space``."""
    owned = _OWNED.fullmatch(name)
    if owned:
        machine, boot, its, pid, start = owned.groups()
        return _gone(int(pid), int(start)) if its == space else boots.earlier_boot_here(machine, boot, path)
    earlier = _EARLIER.fullmatch(name)  # named before BOOT and MACHINE: its SPACE only
    return earlier is not None and earlier[1] == space and _gone(int(earlier[2]), int(earlier[3]))


def target(path: str | os.PathLike[str]) -> Path:
    """Where writing ``path`` lands: a link followed to the file it names (made absolute)."""
    return Path(os.path.realpath(path))


def leftovers(path: str | os.PathLike[str]) -> list[Path]:
    """The temporary files a writer of ``path`` killed before its rename left beside it."""
    real = target(path)
    return sorted(real.parent.glob(f".{glob.escape(stem(real.name))}.*{PARTIAL}"))


def own_folder(parent: str | os.PathLike[str], label: str) -> Path:
    """A new empty folder in ``parent`` (mode 0700) for files a process keeps a while and then
    removes itself (a backend's float32 weights in the system's temporary folder), named after
    its writer: ``.LABEL.MACHINE-BOOT-SPACE-PID-START-RANDOM.partial`` (``label`` with characters other than
    letters, digits, ``-`` and ``_`` as ``_``). The folders killed writers left in ``parent``
    are removed at this process's first own folder there (:func:`sweep_once`), so a kill -9
    leaves its folder only until the next process's first load."""
    sweep_once(parent)
    name = stem(re.sub(r"[^A-Za-z0-9_-]", "_", label) or "uform")
    made = Path(parent) / f".{name}.{token()}{PARTIAL}"
    try:
        made.mkdir(mode=0o700)
    except OSError as exc:
        raise OutputError(f"{parent}: cannot be written ({reason_of(exc)})") from None
    return made
