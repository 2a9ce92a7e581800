"""Opening checkpoints, and making new ones deterministically from presets and a seed."""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from . import files, safetensors
from .config import METADATA_KEY, ModelConfig, make_config
from .errors import CheckpointError, UformError, UnsupportedError
from .host import Host
from .progress import Progress, ProgressHandler

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"dimensions": 32, "context": 32},
    "small": {"dimensions": 256, "context": 128},
    "base": {"dimensions": 512, "context": 512},
}


READ_CHUNK = 64 * 1024 * 1024  # bytes per pread() while reading a tensor
OWN_MAP_BYTES = 1 << 20  # a tensor read for a load gets a map of its own from this size on


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
    except OSError as exc:  # a symlink loop, a file named as a folder (a/b.safetensors/c), a name too long, EIO
        raise CheckpointError(f"{p}: cannot open the checkpoint file ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_a_file(p, mode)
    return fd


class CheckpointFile:
    """A checkpoint file open for a load that reads each tensor when it is asked for.

    Opening reads and checks the header alone. :meth:`read_into` copies one tensor's bytes
    (``pread``, no map: a file that shrinks cannot fault the process) into memory the caller
    owns, a scratch buffer reused from tensor to tensor where a backend repacks the weights,
    and checks that it is finite; :meth:`array` copies one into an array of its own. So a
    load never holds the whole file beside what it builds from it. Errors are
    :class:`CheckpointError` naming the path (a directory, FIFO, socket or device, an empty
    file, a malformed header, a file that ends before a tensor it states), and, from
    :meth:`read_into`, the tensor (NaN or infinite values), a path that cannot be opened (a
    symlink loop, a file named as a folder) with the system's reason; ``FileNotFoundError`` and
    ``PermissionError`` naming the path. Close it (or use it as a context manager) when the load is done.
    """

    streams = True  # tensors are read when asked for: a scratch buffer saves a copy

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = _open(self.path)
        try:
            self.size = os.fstat(self._fd).st_size
            if self.size == 0:
                raise CheckpointError(f"{self.path}: the file is empty")
            try:
                self.metadata, self.entries, self._start = safetensors.header(self.size, self._read)
            except CheckpointError as exc:
                raise CheckpointError(f"{self.path}: {exc}") from None
        except BaseException:
            os.close(self._fd)
            raise
        self._scratch: dict[np.dtype[Any], np.ndarray] = {}

    def _read(self, begin: int, end: int) -> bytes:
        try:  # one read is the whole of a regular file's span, and its bytes are the answer: no copy
            whole = os.pread(self._fd, end - begin, begin)
        except OSError:
            whole = b""
        if len(whole) == end - begin:
            return whole
        out = np.empty(end - begin, np.uint8)
        self._fill(out, begin)
        return out.tobytes()

    def _fill(self, out: np.ndarray, offset: int) -> None:
        """``out`` (flat bytes) filled from the file at ``offset``; a short file is an error."""
        if self._fd < 0:
            raise CheckpointError(f"{self.path}: the checkpoint file was closed when the load ended")
        view, done = memoryview(out.data).cast("B"), 0
        while done < len(view):
            try:
                got = os.preadv(self._fd, [view[done : done + READ_CHUNK]], offset + done)
            except OSError as exc:
                raise CheckpointError(f"{self.path}: cannot read the file at byte {offset + done} ({exc.strerror or exc})") from None
            if not got:
                end = os.lseek(self._fd, 0, os.SEEK_END)  # where it ends now
                raise CheckpointError(
                    f"{self.path}: the file ends at byte {end}, before its stated size of {self.size} bytes "
                    "(was it truncated or rewritten while it was read?)"
                )
            done += got

    def nbytes(self, name: str) -> int:
        e = self.entries[name]
        return e.end - e.begin

    def read_into(self, name: str, out: np.ndarray, skip_bf16_check: bool = False) -> np.ndarray:
        """Tensor ``name`` read into the front of ``out`` (a flat uint8 array of at least
        :meth:`nbytes`), checked finite; answers it as a typed, shaped view of ``out``.
        ``skip_bf16_check``: a BF16 tensor is not checked here, for a caller that checks every
        weight's bits as it reads them anyway (the op library's packing: 0.16 s of a 823 MiB
        load on 2 cores spent scanning the bits twice)."""
        e = self.entries[name]
        data = out[: e.end - e.begin]
        self._fill(data, self._start + e.begin)
        if not (skip_bf16_check and e.dtype == "BF16"):
            safetensors.check_tensor(e, data, self._scratch)
        return data.view(safetensors.DTYPES[e.dtype]).reshape(e.shape)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` read into an array of its own, checked finite. A large one lives in
        a map of its own, unmapped when the array goes: freed heap memory may stay with the
        process (malloc serves tensor-sized blocks from its heap once some were freed)."""
        size = self.nbytes(name)
        if size < OWN_MAP_BYTES:
            return self.read_into(name, np.empty(size, np.uint8))
        private = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_ANONYMOUS") else {}
        return self.read_into(name, np.frombuffer(mmap.mmap(-1, size, **private), np.uint8))

    def named(self, exc: UformError) -> UformError:
        """``exc`` with this file's path in front, once: a fault of the config, of a tensor's
        dtype or shape, or of a weight's values, found after the header was read; a read's own
        error, which names the path, keeps it in front when a backend wrapped it ("a matrix of
        the 'text' tower: ...")."""
        prefix, text = f"{self.path}: ", str(exc)
        return exc if text.startswith(prefix) else type(exc)(prefix + text.replace(prefix, "", 1))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> CheckpointFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def map_file(path: str | os.PathLike[str]) -> mmap.mmap:
    """A read-only map of a checkpoint file; errors name the path and the reason.

    For tools that read a checkpoint once (calibrate, export). ``Model`` loads copy the file
    with :class:`CheckpointFile` instead, so that a file shrinking under them cannot SIGBUS.
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
    """Write a checkpoint: tensors BF16, config JSON in ``__metadata__["uform"]``; whole or not
    at all (:mod:`uform.core.files`: an old file at ``path`` stays as it was when a write fails)."""
    metadata = config.to_metadata()
    files.write_with(path, lambda f: safetensors.write(f, tensors, metadata))


def is_checkpoint_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts with a safetensors header holding uform's config (whatever its
    tensors hold): a file a command that writes checkpoints may replace."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size

            def read(begin: int, end: int) -> bytes:
                f.seek(begin)
                return f.read(end - begin)

            metadata, _, _ = safetensors.header(size, read)
    except (OSError, CheckpointError):
        return False
    return METADATA_KEY in metadata
