"""An encode output read back (``read_saved``): every member checked against its manifest, and
every fault an error naming the file (and line); ``saved_prefix``, whether a path names one.
The files are named in :mod:`uform.cli.manifest`, written by :mod:`uform.cli.saved`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .common import printable
from .manifest import BITS, FORMAT, MEMBERS, SCALARS, SUFFIXES, json_name, record_name, row_key, sha256
from uform.core import jsontext

@dataclass(frozen=True)
class Saved:
    """An encode output read back: its manifest, its index rows and its embeddings."""

    manifest: dict[str, Any]
    rows: list[dict[str, Any]]
    embeddings: np.ndarray  # in the stored scalar (BF16 and FP8 as their ml_dtypes types)
    scales: np.ndarray | None

    @property
    def scalar(self) -> str:
        return str(self.manifest["scalar"])

    def scores(self, query: np.ndarray) -> np.ndarray:
        """Cosine of every row with a unit float32 ``query`` of the model's full dimensions, as
        docs/api.md compares stored rows (B1: ``cos(pi * hamming / dimensions)``)."""
        d = int(self.manifest["dimensions"])
        if d > len(query):
            raise ValueError(f"the encode output {self.manifest['npy']} holds rows of {d} dimensions, the query {len(query)}: "
                             "it was made with another model; pass that model with --model")  # fmt: skip
        q = query[:d] / max(float(np.linalg.norm(query[:d])), 1e-12)
        if self.scalar == "b1":
            bits = np.packbits(q > 0, bitorder="big")
            hamming = np.unpackbits(self.embeddings ^ bits, axis=1, count=d).sum(axis=1)
            cosines: np.ndarray = np.cos(np.pi * hamming / d).astype(np.float32)
            return cosines
        rows = self.embeddings.astype(np.float32)
        if self.scales is not None:
            rows = rows * self.scales[:, None]
        scores: np.ndarray = rows @ q.astype(np.float32)
        return scores


def saved_prefix(path: str) -> Path | None:
    """The prefix of the encode output ``path`` names (its .npy, .jsonl or .json, or the prefix
    when that is not a folder), or None."""
    p = Path(path)
    if p.is_dir():  # a folder is walked, even beside an output of its name
        return None
    prefix = p.with_suffix("") if p.suffix in SUFFIXES else p
    manifest = Path(f"{prefix}.json")
    if not manifest.is_file() or (p != prefix and not p.is_file()):
        return None
    try:
        head = manifest.read_bytes()[:4096]
    except OSError:
        return None
    return prefix if b'"format"' in head and FORMAT.encode() in head else None  # damaged manifests too: read_saved names the fault


_FIELDS: dict[str, tuple[type, ...]] = {"rows": (int,), "scalar": (str,), "dimensions": (int,), "npy": (str,), "index": (str,), "scales": (str, type(None))}


def _lines(path: Path) -> list[tuple[int, str]]:
    """The text lines of ``path`` with their numbers; a byte that is not UTF-8 names its line."""
    out = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                out.append((number, raw.decode("utf-8")))
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{number}: not UTF-8 (byte 0x{raw[exc.start]:02x}, byte {exc.start + 1} of the line)") from None
    return out


def _json(text: str, where: str) -> Any:
    try:
        return jsontext.loads(text)
    except jsontext.NotJSON as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None


def _manifest(path: Path) -> dict[str, Any]:
    manifest = _json("".join(line for _, line in _lines(path)), str(path))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{path} is not a uform encode output (format {got!r}, expected {FORMAT!r})")
    for key, kinds in _FIELDS.items():
        value = manifest.get(key)
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise ValueError(f"{path}: the manifest's {key!r} is {'missing' if key not in manifest else repr(value)}")
        if key in MEMBERS and isinstance(value, str):
            value = manifest[key] = record_name(manifest, key, str(path))  # a name that is not UTF-8: from its hex
            if value is None or value in ("", ".", "..") or value != Path(value).name:
                raise ValueError(f"{path}: the manifest's {key!r} must name a file beside it; got {printable(str(value))!r}")
    if manifest["scalar"] not in SCALARS:
        raise ValueError(f"{path}: the manifest's scalar {manifest['scalar']!r} is not one of {', '.join(SCALARS)}")
    return manifest


def _check_member(path: Path, manifest: dict[str, Any], where: Path) -> None:
    expected = (manifest.get("files") or {}).get(json_name(path.name)) if isinstance(manifest.get("files"), dict) else None
    if not path.is_file():
        raise ValueError(f"{path}: missing (named by {where})")
    if isinstance(expected, dict) and (expected.get("bytes") != path.stat().st_size or expected.get("sha256") != sha256(path)):
        raise ValueError(f"{path}: does not match its manifest {where} (written by another encode, or damaged); encode again")


_STORED = {"f32": np.float32, "f16": np.float16, "i8": np.int8, "b1": np.uint8, **BITS}  # each scalar's .npy dtype


def _check_rows(rows: np.ndarray, scales: np.ndarray | None, manifest: dict[str, Any], path: Path, where: Path) -> None:
    """ValueError naming ``path`` when its rows are not what the manifest ``where`` says (a hand-edited
    manifest: numpy's matmul or bitwise_xor error, naming no file, or a silently shorter query)."""
    scalar, d = manifest["scalar"], manifest["dimensions"]
    width = -(-d // 8) if scalar == "b1" else d
    if d < 1 or rows.ndim != 2 or rows.dtype != _STORED[scalar] or rows.shape[1] != width:
        raise ValueError(f"{path}: holds {rows.dtype} rows of shape {rows.shape}, not the {scalar} rows of {d} dimensions "
                         f"that {where} says; encode again")  # fmt: skip
    if (scales is None) != (scalar != "i8"):
        raise ValueError(f"{where}: the manifest's scales {manifest['scales']!r} do not fit its scalar {scalar!r}; encode again")


def _array(path: Path) -> np.ndarray:
    try:
        array: np.ndarray = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npy file ({exc})") from None
    return array


def read_saved(prefix: str | os.PathLike[str]) -> Saved:
    """Read the encode output at ``prefix`` (``prefix.json``, ``.npy``, ``.jsonl``, ``.scales.npy``);
    a fault is a ``ValueError`` naming the file (and line)."""
    import ml_dtypes

    base = Path(prefix)
    where = Path(f"{base}.json")
    manifest = _manifest(where)
    folder = base.parent
    named = {key: folder / manifest[key] for key in ("npy", "index", "scales") if manifest[key] is not None}
    for path in named.values():
        _check_member(path, manifest, where)
    embeddings = _array(named["npy"])
    kinds = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
    if embeddings.ndim != 2:
        raise ValueError(f"{named['npy']}: holds an array of shape {embeddings.shape}, not rows")
    scales = _array(named["scales"]) if "scales" in named else None
    _check_rows(embeddings, scales, manifest, named["npy"], where)
    if manifest["scalar"] in kinds:
        embeddings = embeddings.view(kinds[manifest["scalar"]])
    rows = []
    for number, line in _lines(named["index"]):
        if not line.strip():
            continue
        where_line = f"{named['index']}:{number}"
        row = _json(line, where_line)
        name = record_name(row, row_key(row), where_line) if isinstance(row, dict) else None
        if not isinstance(row, dict) or not isinstance(row.get("modality"), str) or name is None:
            raise ValueError(f"{where_line}: expected an object with a modality and a path (or a text)")
        rows.append({**row, row_key(row): name})
    if len(rows) != len(embeddings) or len(rows) != manifest["rows"] or (scales is not None and scales.shape != (len(rows),)):
        raise ValueError(f"{base}: the index holds {len(rows)} rows, the embeddings {len(embeddings)}, the manifest says {manifest['rows']}"
                         + ("" if scales is None else f", the scales {scales.shape}"))  # fmt: skip
    return Saved(manifest, rows, embeddings, scales)
