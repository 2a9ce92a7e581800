"""Which files loading reads: an artifact's own files, in its own folder, and nothing else.

An artifact is a folder someone else made; its names are links or special files as easily as
regular files. Loading reads a file only when it is a regular file once its links are followed
(a FIFO blocks the reader's open and ``/dev/zero`` never ends: either hung ``load``) and lies in
the artifact's folder (a link to ``../other/model.safetensors`` or ``/etc/passwd`` is a file
outside it). The same rule holds an ONNX model's external-data entries to files of its folder.
"""

import os
import re
import stat
from pathlib import Path, PureWindowsPath

from fastermodels._errors import ArtifactReadError


def outside(location: str, folder: Path, within: list[Path]) -> str | None:
    """Why ``location`` (a file name given relative to ``folder``) is not a file of the artifact,
    or None when it is: named inside ``folder``, and, its links followed, in one of the folders
    ``within`` (the artifact's; for a Hub download also the cache's blobs)."""
    if not location or "\0" in location:
        return "not a file name"
    if os.path.isabs(location) or PureWindowsPath(location).anchor:
        return "an absolute path"
    if ".." in re.split(r"[/\\]", location):
        return "a path through '..'"
    real = os.path.realpath(folder / location)
    if any(os.path.commonpath([real, inside]) == inside for inside in map(os.path.realpath, within)):
        return None
    return f"a link leading outside the artifact's folder, to {real}"


def irregular(path: str | os.PathLike[str]) -> str | None:
    """Why ``path``, its links followed, is not a regular file (a folder, a FIFO, a device, a link
    to nothing), or None when it is one; nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:  # a link to nothing, a loop
        return f"a link to nothing readable ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket") + ", not a regular file"


def artifact_file(folder: str | os.PathLike[str], name: str) -> Path | None:
    """``folder/name`` when it is a regular file of the artifact, None when there is no such
    entry; :class:`ArtifactReadError` naming it when it is a link leading outside ``folder`` or
    not a regular file (:func:`irregular`), before anything opens it."""
    path = Path(folder) / name
    if not os.path.lexists(path):
        return None
    why = outside(name, Path(folder), [Path(folder)]) or irregular(path)
    if why is not None:
        raise ArtifactReadError(f"{path}: {why}, so not a {name}: an artifact's files are regular files "
                                "in its folder; nothing was read")
    return path
