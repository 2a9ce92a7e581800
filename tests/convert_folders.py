"""Source model folders to edit for ``uform convert``'s tests (copy, edit_config, sharded,
safetensors_file), what a conversion wrote (header: its config, tensors and metadata), and what
a refused conversion leaves (refused: nothing written; snapshot: every file of a folder and its
bytes)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uform.convert import ConvertError, convert


def header(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    h = json.loads(data[8 : 8 + n])
    meta = h.pop("__metadata__")
    return json.loads(meta["uform"]), h, meta


def copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def refused(source: Path | str, tmp_path: Path, match: str) -> None:
    out = tmp_path / "out" / "x.safetensors"
    out.parent.mkdir(exist_ok=True)
    with pytest.raises(ConvertError, match=match):
        convert(source, out)
    assert list(out.parent.iterdir()) == []


def edit_config(directory: Path, change: Any) -> None:
    path = directory / "config.json"
    cfg = json.loads(path.read_text())
    change(cfg)
    path.write_text(json.dumps(cfg))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too: a temporary left behind shows) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


class safetensors_file:
    """The float32 tensors of a safetensors file, as a dict to edit (a context manager)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> dict[str, np.ndarray]:
        from uform.core.checkpoint import CheckpointFile

        with CheckpointFile(self.path) as f:
            return {name: np.array(f.array(name)) for name in f.entries}

    def __exit__(self, *exc: object) -> None:
        pass


def sharded(d: Path) -> dict[str, list[str]]:
    """``d``'s model.safetensors split in two shards (every other tensor), the file removed: the
    tensors' names by shard, for an index to name."""
    from uform.core import safetensors

    with safetensors_file(d / "model.safetensors") as tensors:
        names = sorted(tensors)
        shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        for shard, part in shards.items():
            safetensors.write(d / shard, {n: tensors[n] for n in part}, {"format": "pt"})
    (d / "model.safetensors").unlink()
    return shards
