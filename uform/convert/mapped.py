"""One ``.safetensors`` file of a conversion's source, mapped read-only (numpy alone), read into
the page cache ahead of the casts on a thread of its own."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from uform.core import safetensors
from uform.core.checkpoint import map_file
from uform.core.errors import CheckpointError

from .errors import ConvertError

__all__ = ["AHEAD", "Mapped"]

AHEAD = 2 << 20  # bytes of the source a read-ahead hint asks for: no more than a kernel reads ahead at once


class Mapped:
    """One ``.safetensors`` file mapped read-only: its header's entries and typed views of its
    tensors. A conversion reads each tensor once, so it reads the map (as ``uform export`` and
    ``calibrate`` do, :func:`uform.core.checkpoint.map_file`), not copies: a source file cut
    short while it is converted ends the process (SIGBUS), as it would theirs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.map = map_file(path)
        try:
            _, self.entries, self.start = safetensors.header(len(self.map), lambda begin, end: self.map[begin:end])
        except CheckpointError as exc:
            self.close()
            raise CheckpointError(f"{path}: {exc}") from None
        except BaseException:
            self.close()
            raise
        self.bytes = np.frombuffer(self.map, np.uint8)
        reading = threading.Event()
        threading.Thread(target=self._read_ahead, args=(reading,), name="uform-convert-read-ahead", daemon=True).start()
        reading.wait(1.0)  # until the thread is in its read, which runs without the GIL

    def _read_ahead(self, reading: threading.Event) -> None:
        """Read the whole file into the page cache, on a thread of its own from the moment it
        is opened, so that the disk reads the source while the tokenizer is checked (a parse
        that holds the GIL) and ahead of the casts: one ``sendfile`` to ``/dev/null`` (the kernel
        reads the file through its cache and copies nothing), or where that is refused
        ``POSIX_FADV_WILLNEED`` hints of :data:`AHEAD` bytes (one reads no more than the
        kernel's read-ahead size). A hint either way: a failure leaves the reads to the casts'
        page faults."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            reading.set()
            return
        try:
            size = os.fstat(fd).st_size
            if not send_to_null(fd, size, reading):
                for offset in range(0, size, AHEAD):
                    os.posix_fadvise(fd, offset, AHEAD, os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):  # a hint only (AttributeError: neither call on this system)
            pass
        finally:
            reading.set()
            os.close(fd)

    def view(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a typed, shaped view of the map: nothing is read until it is touched."""
        e = self.entries[name]
        return self.bytes[self.start + e.begin : self.start + e.end].view(safetensors.DTYPES[e.dtype]).reshape(e.shape)

    def check(self, name: str) -> None:
        """Refuse tensor ``name`` if it holds a NaN or an infinity, naming it and the first such value."""
        e = self.entries[name]
        try:
            safetensors.check_tensor(e, self.bytes[self.start + e.begin : self.start + e.end])
        except CheckpointError as exc:
            raise ConvertError(f"{exc}") from None

    def close(self) -> None:
        self.bytes = np.empty(0, np.uint8)
        try:
            self.map.close()
        except BufferError:  # a view is still held (an error's traceback): the map goes with it
            pass



def send_to_null(fd: int, size: int, reading: threading.Event) -> bool:
    """The file of ``fd`` sent to ``/dev/null`` (read into the page cache), ``reading`` set as
    the read begins; False where the system refuses it at once."""
    null = os.open(os.devnull, os.O_WRONLY)
    offset = 0
    try:
        reading.set()
        while offset < size:
            sent = os.sendfile(null, fd, offset, size - offset)
            if not sent:
                break
            offset += sent
        return True
    except OSError:
        return offset > 0
    finally:
        os.close(null)
