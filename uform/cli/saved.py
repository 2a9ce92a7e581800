"""The files ``uform encode --out OUT`` writes, and reading them back.

``OUT.npy`` (the rows), ``OUT.scales.npy`` (I8), ``OUT.jsonl`` (what each row is) and ``OUT.json``
(the manifest: the scalar, the dimensions, the model, what failed, and each member's size and
SHA-256) are one set, written whole or not at all by :mod:`uform.core.files`, the manifest
renamed into place last. A set replaces only files an earlier encode wrote (named by its
manifest), unless ``force``. Reading checks every member against the manifest, and every fault
is an error naming the file (and line).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .common import printable
from uform.core import jsontext
from uform.core.files import Outputs, check_replaceable, refuse_foreign
from uform.inputs import Failure, Item

FORMAT = "uform-embeddings/1"
SCALARS = ("f32", "f16", "bf16", "e4m3", "e5m2", "i8", "b1")
# .npy has no BF16 or FP8 dtypes (numpy reads them back as opaque void): their bits are saved
_BITS = {"bf16": np.uint16, "e4m3": np.uint8, "e5m2": np.uint8}
SUFFIXES = (".npy", ".jsonl", ".json")
MEMBERS = ("npy", "index", "scales")  # the manifest's fields that name the set's other files


def sha256(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def members(prefix: Path, scales: bool) -> list[Path]:
    """The files of the output at ``prefix``, in the order they are put in place (manifest last)."""
    return [Path(f"{prefix}.npy")] + ([Path(f"{prefix}.scales.npy")] if scales else []) + [Path(f"{prefix}.jsonl"), Path(f"{prefix}.json")]


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


def json_name(name: str) -> str:
    """``name`` as a JSON key: itself, or as it prints when it is not UTF-8 (:func:`json_record`)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return printable(name)
    return name


def json_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as valid UTF-8 JSON can hold it: a string that is not UTF-8 (a file name's bytes
    that are not, which Python holds as lone surrogates) is written as it prints
    (:func:`~uform.cli.common.printable`: ``r\\xffd.png``), and its exact bytes as hex beside it
    under the key ``KEY_hex`` (``"path_hex": "72ff642e706e67"``), which :func:`record_name` reads back."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                out[key], out[f"{key}_hex"] = printable(value), value.encode("utf-8", "surrogateescape").hex()
                continue
        out[key] = value
    return out


def record_name(row: dict[str, Any], key: str, where: str) -> str | None:
    """The name ``row[key]`` as the file system gives it: from ``KEY_hex`` where :func:`json_record`
    wrote one (a name that is not UTF-8), else the string itself; None when neither is a string."""
    exact = row.get(f"{key}_hex")
    if exact is None:
        value = row.get(key)
        return value if isinstance(value, str) else None
    try:
        return bytes.fromhex(exact).decode("utf-8", "surrogateescape") if isinstance(exact, str) else None
    except ValueError:
        raise ValueError(f"{where}: {key}_hex is not hex digits") from None


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
    stored = embeddings.view(_BITS[scalar]) if scalar in _BITS else embeddings
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
    text = "".join(line for _, line in _lines(path))
    try:
        manifest = jsontext.loads(text)
    except jsontext.NotJSON as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
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


_STORED = {"f32": np.float32, "f16": np.float16, "i8": np.int8, "b1": np.uint8, **_BITS}  # each scalar's .npy dtype


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


def row_key(row: dict[str, Any]) -> str:
    """Which field of an index row holds what it is: ``text`` for a text, else ``path``."""
    return "text" if row.get("kind") == "text" else "path"
