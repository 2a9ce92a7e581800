"""This machine, its boot and its process-id namespace, as the names of uform's temporaries carry them.

A temporary's name says who writes it (:func:`uform.core.leftovers.writer`): this machine
(``/etc/machine-id``), this boot of it (``/proc/sys/kernel/random/boot_id``), the process-id
namespace, a process id and that process's start time. A process of this boot and namespace
is gone when its id names no process, or one that started at another time. A temporary of an
earlier boot of this machine is gone too, its writer with that boot, but only where that is
provable (:func:`earlier_boot_here`): the same machine id, in a folder on a local file system
(one that no other machine writes into: not NFS, SMB, 9p, virtiofs, FUSE or a cluster file
system), last changed before this boot began. A machine id alone proves nothing of a shared
folder: cloned images share one.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

# file systems only one kernel writes into (a shared folder's writers may be other machines)
LOCAL = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs", "ramfs", "zfs", "bcachefs", "jfs", "reiserfs", "overlay"})


def _digits(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:8]


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read().strip() or None
    except OSError:
        return None


@functools.cache
def ids() -> tuple[str, str, str] | None:
    """8 hex digits each naming this machine, this boot of it, and this boot's process-id
    namespace (Linux); None where the boot or the namespace cannot be told. A machine without
    a machine id is named ``00000000``, whose earlier boots are never taken for its own."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.fsencode(os.readlink("/proc/self/ns/pid"))
    except OSError:
        return None
    if boot is None:
        return None
    machine = _read("/etc/machine-id") or _read("/var/lib/dbus/machine-id")
    return ("0" * 8 if machine is None else _digits(b"machine", machine)), _digits(b"boot", boot), _digits(boot, namespace)


@functools.cache
def booted() -> float | None:
    """When this boot began, in seconds since the epoch (``btime`` of ``/proc/stat``)."""
    for line in (_read("/proc/stat") or b"").splitlines():
        if line.startswith(b"btime "):
            return float(line.split()[1])
    return None


def file_system(folder: str | os.PathLike[str]) -> str | None:
    """The type of the file system ``folder`` is on (``/proc/self/mountinfo``); None when unknown."""
    return mounted((_read("/proc/self/mountinfo") or b"").decode(errors="replace"), os.path.realpath(folder))


def mounted(mountinfo: str, where: str) -> str | None:
    """The file system type that ``mountinfo`` (``/proc/self/mountinfo``'s text) gives the
    absolute path ``where``: its deepest mount's, the last of those stacked there."""
    best, kind = "", None
    for line in mountinfo.splitlines():
        fields = line.split(" - ", 1)
        if len(fields) != 2 or len(fields[0].split()) < 5 or not fields[1].split():
            continue
        point = _unescaped(fields[0].split()[4])
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[1].split()[0]
    return kind


def _unescaped(point: str) -> str:
    """A mount point as mountinfo writes it (space, tab, line break, backslash as \\ooo) decoded."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        point = point.replace(code, char)
    return point


def earlier_boot_here(machine: str, boot: str, path: str | os.PathLike[str]) -> bool:
    """True only when a temporary at ``path`` named with ``machine`` and ``boot`` is provably
    of an earlier boot of this machine: its machine id this one's (and known), its boot not
    this one, its folder on a :data:`LOCAL` file system, and itself last changed before this
    boot began."""
    mine, began = ids(), booted()
    if mine is None or began is None or machine != mine[0] or machine == "0" * 8 or boot == mine[1]:
        return False
    if file_system(Path(path).parent) not in LOCAL:
        return False
    try:
        return os.lstat(path).st_ctime < began
    except OSError:
        return False
