"""Reading a conversion's source: a local model directory or a Hugging Face Hub id (hub.py finds
it; mapped.py maps a .safetensors file of it).

A source directory holds what ``save_pretrained`` writes (``config.json``, the weights as
``model.safetensors`` (or shards with ``model.safetensors.index.json``) or ``pytorch_model.bin``,
the tokenizer's files, ``preprocessor_config.json``), or open_clip's own files
(``open_clip_config.json`` with ``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin``).
A ``.safetensors`` source is read with numpy alone, through one read-only memory map of each
file (a conversion reads each tensor once: the map saves copying it into a buffer first); a
``.bin`` needs torch (loaded with ``weights_only=True``, so a pickle cannot run code).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from uform.core import jsontext
from uform.core.errors import CheckpointError

from .errors import ConvertError
from .hub import HUB_BIN_PATTERNS, HUB_PATTERNS, resolve
from .mapped import AHEAD, Mapped

__all__ = ["AHEAD", "HUB_BIN_PATTERNS", "HUB_PATTERNS", "ConvertError", "Mapped", "Weights", "preprocessor_config", "read_json", "resolve", "weights"]


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


def preprocessor_config(directory: Path, section: str) -> tuple[dict[str, Any], str] | None:
    """The preprocessing settings of ``directory`` and where they were read (what errors name):
    ``preprocessor_config.json``, or where only ``processor_config.json`` is there (what a
    processor's ``save_pretrained`` writes in transformers 5: each part's settings under its
    name), its ``section`` (``image_processor``, ``feature_extractor``). None where neither holds them."""
    path = directory / "preprocessor_config.json"
    if path.is_file():
        return read_json(path), str(path)
    combined = directory / "processor_config.json"
    if not combined.is_file():
        return None
    value = read_json(combined).get(section)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConvertError(f"{combined}: {section} is {value!r}, not a JSON object of the processor's settings")
    return value, f"{combined} {section}"


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
