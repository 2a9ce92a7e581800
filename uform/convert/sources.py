"""Reading a conversion's source: a local model directory or a Hugging Face Hub id.

A source directory holds what ``save_pretrained`` writes (``config.json``, the weights as
``model.safetensors`` (or shards with ``model.safetensors.index.json``) or ``pytorch_model.bin``,
the tokenizer's files, ``preprocessor_config.json``), or open_clip's own files
(``open_clip_config.json`` with ``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin``).
A ``.safetensors`` source is read with numpy alone, through one read-only memory map of each
file (a conversion reads each tensor once: the map saves copying it into a buffer first); a
``.bin`` needs torch (loaded with ``weights_only=True``, so a pickle cannot run code).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from uform.core import jsontext, safetensors
from uform.core.checkpoint import map_file
from uform.core.errors import CheckpointError


class ConvertError(CheckpointError):
    """A source uform cannot convert: the message names the file, tensor or field and why."""


# The files a Hub download fetches: everything a conversion reads, and no other weights.
HUB_PATTERNS = ["*.json", "*.txt", "*.model", "model.safetensors", "model-*.safetensors", "open_clip_model.safetensors"]
HUB_BIN_PATTERNS = ["pytorch_model.bin", "open_clip_pytorch_model.bin"]
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
            if not _send_to_null(fd, size, reading):
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


@dataclass
class Weights:
    """The source's tensors by name, read when asked for; ``files`` are the paths read."""

    files: list[Path]
    _where: dict[str, tuple[Path, str]] = field(default_factory=dict)  # name -> (file, name inside it)
    _opened: dict[Path, Any] = field(default_factory=dict)  # a Mapped file, or a .bin's arrays by name
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    index: Path | None = None  # model.safetensors.index.json, for sharded weights
    unlisted: dict[str, str] = field(default_factory=dict)  # a tensor a shard holds that the index leaves out -> the shard
    absent: dict[str, str] = field(default_factory=dict)  # a tensor the index gives a shard without it -> the shard

    def names(self) -> list[str]:
        return list(self._where)

    def missing(self, name: str) -> str:
        """Tensor ``name`` is not there, said naming the file at fault: the index when its
        weight_map leaves out a tensor a shard holds, or gives it a shard that does not."""
        if name in self.absent:
            holder = f"; {self.unlisted[name]} does" if name in self.unlisted else ""
            return f"{self.index}: weight_map gives tensor {name!r} the shard {self.absent[name]}, which does not hold it{holder}"
        if name in self.unlisted:
            return f"{self.index}: weight_map leaves out tensor {name!r}, which {self.unlisted[name]} holds"
        return f"{', '.join(str(p) for p in self.files)}: tensor {name!r} is missing"

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a float array of its own (BF16, F16 or F32, as stored); NaN refused, naming it."""
        array, check = self.source(name)
        check()
        return np.array(array)

    def source(self, name: str) -> tuple[np.ndarray, Callable[[], None]]:
        """Tensor ``name`` as stored (BF16, F16 or F32), not yet checked: a view of the source's
        map (or a .bin's array), and the call that refuses it, naming it, if it holds a NaN or
        an infinity."""
        path, inner = self._where[name]
        opened = self._opened[path]
        if isinstance(opened, Mapped):
            array, check = opened.view(inner), lambda: opened.check(inner)
        else:
            array = opened[inner]
            check = lambda: _check_array(path, inner, array)  # noqa: E731
        if array.dtype.kind != "f" and array.dtype != ml_dtypes.bfloat16:
            raise ConvertError(f"{path}: tensor {inner!r} is {array.dtype}, not floating point")
        return array, check

    def close(self) -> None:
        for opened in self._opened.values():
            if isinstance(opened, Mapped):
                opened.close()
        self._opened.clear()


def _check_array(path: Path, name: str, array: np.ndarray) -> None:
    if not np.isfinite(array.astype(np.float32) if array.dtype == ml_dtypes.bfloat16 else array).all():
        first = np.argwhere(~np.isfinite(array.astype(np.float32)))[0].tolist()
        raise ConvertError(f"{path}: tensor {name!r} holds NaN or infinite values (the first at index {first})")


def resolve(source: str | os.PathLike[str]) -> tuple[Path, str]:
    """The local directory of ``source`` and the name the file records for it.

    A path that exists is used as it is (a directory). Otherwise ``source`` must look like a
    Hub id (``owner/name``): it is looked up in the local Hugging Face cache first, and
    downloaded only where ``HF_HUB_OFFLINE`` is unset.
    """
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise ConvertError(f"{path}: not a model directory (a conversion reads a directory with config.json or open_clip_config.json)")
        return path, path.resolve().name
    text = str(source)
    parts = text.split("/")
    if len(parts) != 2 or not all(parts) or text.startswith((".", "~")):
        raise ConvertError(f"{text}: no such directory, and not a Hugging Face Hub id of the form owner/name")
    return _hub(text), text


def _hub(repo: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ConvertError(f"{repo}: not a local directory; reading a Hub id needs huggingface_hub (pip install huggingface_hub)") from None
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    home = os.environ.get("HF_HOME")
    cache = os.environ.get("HF_HUB_CACHE") or (os.path.join(home, "hub") if home else None)  # read now, not at import
    try:
        found = Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS, local_files_only=True, cache_dir=cache))
        if _has_weights(found) and (offline or _complete(found)):  # offline, the conversion names what is missing
            return found
    except LocalEntryNotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - any Hub error is the user's to read
        raise ConvertError(f"{repo}: cannot read it from the Hugging Face cache ({exc})") from None
    if offline:
        raise ConvertError(f"{repo}: not in the local Hugging Face cache, and HF_HUB_OFFLINE forbids a download")
    try:
        found = Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS, cache_dir=cache))
        if not _has_weights(found):
            found = Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS + HUB_BIN_PATTERNS, cache_dir=cache))
    except Exception as exc:  # noqa: BLE001
        raise ConvertError(f"{repo}: cannot download it from the Hugging Face Hub ({type(exc).__name__}: {exc})") from None
    return found


def _complete(directory: Path) -> bool:
    """Whether a cached snapshot holds the rest of what a conversion reads, not the weights
    alone (``CLIPModel.from_pretrained`` caches only config.json and the weights): open_clip's
    config, or config.json with a tokenizer and ``preprocessor_config.json``."""
    if (directory / "open_clip_config.json").is_file():
        return True
    tokenizer = any((directory / n).is_file() for n in ("tokenizer.json", "spiece.model")) or all(
        (directory / n).is_file() for n in ("vocab.json", "merges.txt")
    )
    return tokenizer and all((directory / n).is_file() for n in ("config.json", "preprocessor_config.json"))


def _has_weights(directory: Path) -> bool:
    return any((directory / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                                   "open_clip_model.safetensors", "open_clip_pytorch_model.bin"))  # fmt: skip


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; errors name the file."""
    try:
        value = jsontext.loads(path.read_bytes())
    except FileNotFoundError:
        raise ConvertError(f"{path}: missing") from None
    except (OSError, jsontext.NotJSON) as exc:
        raise ConvertError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    return value


def weights(directory: Path, prefix: str = "") -> Weights:
    """The weights of ``directory`` (``prefix``: ``"open_clip_"`` for open_clip's files).

    ``{prefix}model.safetensors`` (or its sharded index) is preferred to ``{prefix}pytorch_model.bin``.
    """
    single = directory / f"{prefix}model.safetensors"
    index = directory / f"{prefix}model.safetensors.index.json"
    binary = directory / f"{prefix}pytorch_model.bin"
    if single.is_file():
        return _safetensors({single: None})
    if index.is_file():
        table = read_json(index).get("weight_map")
        if not isinstance(table, dict):
            raise ConvertError(f"{index}: has no weight_map object")
        shards: dict[Path, list[str]] = {}
        for name, shard in table.items():
            if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
                raise ConvertError(f"{index}: weight_map gives {name!r} the shard {shard!r}, not a file name in {directory}")
            shards.setdefault(directory / shard, []).append(name)
        return _safetensors({p: set(n) for p, n in shards.items()}, index)
    if binary.is_file():
        return _torch_bin(binary)
    raise ConvertError(f"{directory}: no weights: expected {single.name}, {index.name} or {binary.name}")


def _safetensors(files: Mapping[Path, set[str] | None], index: Path | None = None) -> Weights:
    """The tensors of ``files``: each file's, or those ``index`` gives it."""
    out = Weights(list(files), index=index)
    try:
        for path, names in files.items():
            try:
                opened = Mapped(path)
            except FileNotFoundError:
                raise ConvertError(f"{path}: missing (the weights' index names it)") from None
            except CheckpointError as exc:
                raise ConvertError(str(exc)) from None
            out._opened[path] = opened
            for name, entry in opened.entries.items():
                if names is None or name in names:
                    out._where[name] = (path, name)
                    out.shapes[name] = entry.shape
                else:
                    out.unlisted[name] = path.name
            out.absent.update((name, path.name) for name in names or () if name not in opened.entries)
    except BaseException:
        out.close()
        raise
    return out


def _torch_bin(path: Path) -> Weights:
    try:
        import torch
    except ImportError:
        raise ConvertError(f"{path}: reading a .bin source needs torch (pip install torch), or convert it from model.safetensors") from None
    import zipfile

    try:  # mapped where torch can map it: the zip format of torch >= 1.6 (the legacy format is read whole)
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as exc:  # noqa: BLE001 - torch's errors vary; the message names the file
        raise ConvertError(f"{path}: cannot be read as a PyTorch state dict ({type(exc).__name__}: {exc})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # a training checkpoint (open_clip's epoch_N.pt): its model's weights
    if not isinstance(state, dict):
        raise ConvertError(f"{path}: expected a state dict (a mapping of names to tensors), got {type(state).__name__}")
    if state and all(isinstance(k, str) and k.startswith("module.") for k in state):  # saved from DistributedDataParallel
        state = {k.removeprefix("module."): v for k, v in state.items()}
    arrays: dict[str, np.ndarray] = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        t = tensor.detach()
        arrays[name] = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()
    out = Weights([path])
    out._opened[path] = arrays
    for name, array in arrays.items():
        out._where[name] = (path, name)
        out.shapes[name] = tuple(array.shape)
    return out


def _send_to_null(fd: int, size: int, reading: threading.Event) -> bool:
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
