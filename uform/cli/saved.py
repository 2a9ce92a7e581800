"""The files ``uform encode --out OUT`` writes, and reading them back.

``OUT.npy`` (the rows), ``OUT.scales.npy`` (I8), ``OUT.jsonl`` (what each row is) and ``OUT.json``
(the manifest: the scalar, the dimensions, the model, what failed, and each member's size and
SHA-256) are one set, written whole or not at all by :mod:`uform.core.files`, the manifest
renamed into place last. A set replaces only files an earlier encode wrote (named by its
manifest), unless ``force``. Reading checks every member against the manifest, and every fault
is an error naming the file (and line): :mod:`uform.cli.readback`. The set's files and the
manifest's names are :mod:`uform.cli.manifest`. Both modules' names are re-exported here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .manifest import BITS, MEMBERS
from .manifest import FORMAT as FORMAT
from .manifest import SCALARS as SCALARS
from .manifest import SUFFIXES as SUFFIXES
from .manifest import json_name as json_name
from .manifest import json_record as json_record
from .manifest import members as members
from .manifest import record_name as record_name
from .manifest import row_key as row_key
from .manifest import sha256 as sha256
from .readback import Saved as Saved
from .readback import read_saved as read_saved
from .readback import saved_prefix as saved_prefix
from uform.core import jsontext
from uform.core.files import Outputs, check_replaceable, refuse_foreign
from uform.inputs import Failure, Item

def _old_manifest(prefix: Path) -> dict[str, Any] | None:
    try:
        manifest = jsontext.loads(Path(f"{prefix}.json").read_bytes())
    except (OSError, jsontext.NotJSON):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    try:
        return {**manifest, **{k: record_name(manifest, k, str(prefix)) for k in MEMBERS}}
    except ValueError:
        return None


def check_writable(prefix: Path, scales: bool, force: bool) -> None:
    """Refuse, before anything is encoded, an output that cannot be written, or whose files
    exist without being named by an earlier encode's manifest at ``prefix.json`` (unless ``force``)."""
    old = _old_manifest(prefix)
    ours = {prefix.parent / str(old[k]) for k in ("npy", "scales", "index") if old.get(k)} if old else set()

    def written(p: Path) -> bool:
        return old is not None and (p == Path(f"{prefix}.json") or p in ours)

    for path in members(prefix, scales):  # what --force cannot replace first, so that its refusal never offers --force
        check_replaceable(path)
        refuse_foreign(path, written, force, f"a file of an earlier `uform encode --out {prefix}`")


def write_saved(
    prefix: Path,
    items: list[Item],
    embeddings: np.ndarray,
    scales: np.ndarray | None,
    scalar: str,
    dimensions: int,
    model_dimensions: int,
    model: Path,
    failures: list[Failure],
    skipped: list[tuple[str, str]],
) -> list[Path]:
    """Write an encode output as one set; answer the paths written, the manifest (``.json``) last."""
    from uform import __version__

    paths = members(prefix, scales is not None)
    npy, index, manifest = paths[0], paths[-2], paths[-1]
    stored = embeddings.view(BITS[scalar]) if scalar in BITS else embeddings
    old = _old_manifest(prefix)
    digests: dict[str, dict[str, Any]] = {}
    with Outputs() as out:
        for path, write in ((npy, lambda f: np.save(f, np.ascontiguousarray(stored))),
                            *(((paths[1], lambda f: np.save(f, scales.astype(np.float32))),) if scales is not None else ()),
                            (index, lambda f: f.writelines(json.dumps(json_record({"row": row, **item.record()})).encode() + b"\n"
                                                           for row, item in enumerate(items)))):  # fmt: skip
            with out.open(path) as f:
                write(f)
            digests[json_name(path.name)] = {"bytes": os.path.getsize(f.name), "sha256": sha256(f.name)}
        info = json_record({
            "format": FORMAT,
            "rows": len(items),
            "scalar": scalar,
            "dimensions": dimensions,
            "model_dimensions": model_dimensions,
            "npy": npy.name,
            "npy_dtype": str(stored.dtype),
            "scales": None if scales is None else paths[1].name,
            "index": index.name,
            "files": digests,
            "cwd": os.getcwd(),  # the folder the rows' relative paths are relative to (uform search resolves them from it)
            "model": os.fspath(model.resolve()),
            "model_sha256": sha256(model),
            "uform": __version__,
            "failed": [json_record(f.record()) for f in failures],
            "skipped": [json_record({"path": p, "reason": why}) for p, why in skipped],
        })
        with out.open(manifest) as f:
            f.write((json.dumps(info, indent=2) + "\n").encode())
        if old is not None and old.get("scales") and scales is None:  # the old set's scales: not of this set
            out.remove(prefix.parent / str(old["scales"]))
    return paths
