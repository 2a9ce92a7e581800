"""Opening checkpoints, and making new ones deterministically from presets and a seed."""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np

from . import safetensors
from .config import ModelConfig, make_config
from .errors import CheckpointError, UnsupportedError
from .host import Host
from .progress import Progress, ProgressHandler

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"dimensions": 32, "context": 32},
    "small": {"dimensions": 256, "context": 128},
    "base": {"dimensions": 512, "context": 512},
}


READ_CHUNK = 64 * 1024 * 1024  # bytes per read() while copying a checkpoint into memory


def _not_a_file(p: Path, mode: int) -> CheckpointError:
    if stat.S_ISDIR(mode):
        return CheckpointError(f"{p}: is a directory, not a checkpoint file")
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return CheckpointError(f"{p}: is not a regular file ({kind}); a checkpoint must be a regular file")


def _open(p: Path) -> int:
    """A descriptor of the regular file ``p``; anything else is refused before it could block.

    ``O_NONBLOCK`` keeps ``open`` of a FIFO without a writer from waiting forever; the
    descriptor's type is then checked with ``fstat`` (no race with a swapped path).
    """
    try:
        before = os.stat(p)
        if not stat.S_ISREG(before.st_mode):
            raise _not_a_file(p, before.st_mode)
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no such checkpoint file") from None
    except PermissionError as exc:
        raise PermissionError(f"{p}: permission denied, cannot read the checkpoint file ({exc.strerror})") from None
    except IsADirectoryError:
        raise CheckpointError(f"{p}: is a directory, not a checkpoint file") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_a_file(p, mode)
    return fd


def read_file(path: str | os.PathLike[str]) -> memoryview:
    """A checkpoint file's bytes, copied into anonymous memory (a flat byte view).

    Nothing returned refers to the file afterwards, so a file truncated or rewritten while
    (or after) it is read cannot fault the process, as a memory map would (SIGBUS). A file
    that ends before the size ``fstat`` stated is a :class:`CheckpointError` naming the path.
    Errors: ``FileNotFoundError``, ``PermissionError`` (both naming the path), and
    :class:`CheckpointError` for a directory, a FIFO, socket or device, an empty file, a file
    that shrank while it was read, or a read error.
    """
    p = Path(path)
    fd = _open(p)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise CheckpointError(f"{p}: the file is empty")
        view = np.empty(size, np.uint8).data  # untouched pages: no zero-filling pass before the read
        done = 0
        with open(fd, "rb", buffering=0, closefd=False) as f:
            while done < size:
                try:
                    got = f.readinto(view[done : min(done + READ_CHUNK, size)])
                except OSError as exc:
                    raise CheckpointError(f"{p}: cannot read the file at byte {done} ({exc.strerror or exc})") from None
                if not got:
                    raise CheckpointError(
                        f"{p}: the file ends at byte {done}, before its stated size of {size} bytes "
                        "(was it truncated or rewritten while it was read?)"
                    )
                done += got
        return view
    finally:
        os.close(fd)


def map_file(path: str | os.PathLike[str]) -> mmap.mmap:
    """A read-only map of a checkpoint file; errors name the path and the reason.

    For tools that read a checkpoint once (calibrate, export). ``Model`` loads copy the file
    with :func:`read_file` instead, so that a file shrinking under them cannot SIGBUS.
    """
    p = Path(path)
    fd = _open(p)
    try:
        if os.fstat(fd).st_size == 0:
            raise CheckpointError(f"{p}: the file is empty")
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def new(
    host: Host, preset: str, seed: int, modalities: Sequence[str] | None = None, progress: ProgressHandler | None = None
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """A random-initialised checkpoint: the same arguments always give the same tensors.

    Each tensor is drawn from its own generator, seeded by ``seed`` and the tensor's name,
    so the values do not depend on which other towers are present. ``progress(done, total)``
    is called after each tensor, counting parameters (False cancels: ``CancelledError``).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    chosen = list(host.modalities) if modalities is None else list(modalities)
    unknown = [m for m in chosen if m not in host.modalities]
    if unknown:
        raise UnsupportedError(f"no installed plugin provides the modalities {unknown}; installed: {sorted(host.modalities)}")
    if not chosen:
        raise ValueError("a checkpoint needs one modality at least")
    towers = {host.modalities[m].tower.name: host.modalities[m].tower for m in sorted(chosen)}
    shape = PRESETS[preset]
    config = make_config(shape["dimensions"], shape["context"], {name: t.presets[preset] for name, t in towers.items()})
    tensors: dict[str, np.ndarray] = {}
    specs = {name: tower.tensors(tower.read(config.towers[name], config), config) for name, tower in towers.items()}
    done = Progress(progress, 0, sum(int(np.prod(spec.shape)) for named in specs.values() for spec in named.values()))
    for named in specs.values():
        for tensor, spec in named.items():
            digest = hashlib.sha256(f"{seed}:{tensor}".encode()).digest()
            rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            values = rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(spec.std) + np.float32(spec.mean)
            tensors[tensor] = values.astype(ml_dtypes.bfloat16)
            done.advance(values.size)
    return config, tensors


def save(path: str | os.PathLike[str], config: ModelConfig, tensors: dict[str, np.ndarray]) -> None:
    """Write a checkpoint: tensors BF16, config JSON in ``__metadata__["uform"]``."""
    safetensors.write(path, tensors, config.to_metadata())
