"""``uform encode``: texts, files and folders to embeddings, and the files it writes.

``--out OUT`` writes ``OUT.npy`` (the rows), ``OUT.jsonl`` (what each row is), ``OUT.json``
(the scalar, the dimensions, the model, what failed) and, for I8, ``OUT.scales.npy``;
``docs/cli.md`` states the format, and :func:`read_saved` reads it back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .common import Bar, add_model, load, model_path, say
from uform.inputs import PLURAL, Failure, Item, counted, encode, gather

FORMAT = "uform-embeddings/1"
SCALARS = ("f32", "f16", "bf16", "e4m3", "e5m2", "i8", "b1")
# .npy has no BF16 or FP8 dtypes (numpy reads them back as opaque void): their bits are saved
_BITS = {"bf16": np.uint16, "e4m3": np.uint8, "e5m2": np.uint8}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "encode", help="embed texts, media files and folders of them; write OUT.npy, OUT.jsonl and OUT.json",
        description="Embed texts, image/video/audio files (by extension) and folders (walked recursively). "
        "An argument naming an existing path is a file or folder; any other is a text. Inputs that cannot be "
        "read are reported on stderr with their path and reason and left out; the exit status is 1 when any failed.",
    )  # fmt: skip
    p.add_argument("inputs", nargs="*", metavar="INPUT", help="a text, a file, or a folder")
    p.add_argument("--text", action="append", default=[], metavar="TEXT", help="a text, even one that looks like a path (repeatable; after the INPUTs)")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="where to write: OUT.npy, OUT.jsonl, OUT.json (a .npy suffix is dropped)")
    p.add_argument("--outputs-scalar", choices=SCALARS, default="f32", help="how rows are stored (default f32; docs/api.md, Output scalars)")
    p.add_argument("--dimensions", type=int, default=None, metavar="N", help="keep each row's first N values, made unit again (Matryoshka); default: all")
    add_model(p)
    p.set_defaults(run=run)


def out_prefix(out: str) -> Path:
    path = Path(out)
    return path.with_suffix("") if path.suffix in (".npy", ".jsonl", ".json") else path


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def run(args: argparse.Namespace) -> int:
    from uform import Scalar

    failures: list[Failure] = []

    def report(f: Failure) -> None:
        failures.append(f)
        say(f.line())

    found = gather(args.inputs, texts=True, report=report)
    found.items.extend(Item("text", t) for t in args.text)
    if not found.items and not found.failures:
        raise ValueError("nothing to encode: give texts, files or folders holding " + ", ".join(("images", "videos", "recordings")))
    prefix = out_prefix(args.out)
    if not prefix.parent.is_dir():
        raise FileNotFoundError(f"--out {args.out}: no such folder {prefix.parent}")
    model = load(args)
    full = model.describe().dimensions
    if args.dimensions is not None and not 1 <= args.dimensions <= full:
        raise ValueError(f"--dimensions must be between 1 and the model's {full}; got {args.dimensions}")
    scalar = Scalar(args.outputs_scalar)
    with Bar("encoding", quiet=args.quiet, total=len(found.items)) as bar:
        result = encode(model, found.items, scalar=scalar, dimensions=args.dimensions, bar=bar, report=report)
    dimensions = args.dimensions or full
    written = write_saved(prefix, result.items, result.embeddings, result.scales, scalar.value, dimensions, full,
                          model_path(args), failures, found.skipped)  # fmt: skip
    counts = {m: sum(1 for i in result.items if i.modality == m) for m in PLURAL}
    what = ", ".join(counted(n, m) for m, n in counts.items() if n) or "no rows"
    print(f"wrote {', '.join(str(p) for p in written)}: {len(result.items)} rows of {dimensions} {scalar.value} ({what})")
    if found.skipped:
        n = len(found.skipped)
        print(f"passed over {n} {'entry' if n == 1 else 'entries'} of the folders (files of unknown type, links to folders; listed in {written[-1]})")
    if failures:
        print(f"{len(failures)} failed (reported above, and listed in {written[-1]})")
        return 1
    return 0


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
    """Write an encode output; answer the paths written, the manifest (``.json``) last."""
    npy, index, manifest = Path(f"{prefix}.npy"), Path(f"{prefix}.jsonl"), Path(f"{prefix}.json")
    stored = embeddings.view(_BITS[scalar]) if scalar in _BITS else embeddings
    np.save(npy, np.ascontiguousarray(stored))
    written = [npy, index]
    scales_path = None
    if scales is not None:
        scales_path = Path(f"{prefix}.scales.npy")
        np.save(scales_path, scales.astype(np.float32))
        written.insert(1, scales_path)
    with open(index, "w", encoding="utf-8") as f:
        for row, item in enumerate(items):
            f.write(json.dumps({"row": row, **item.record()}) + "\n")
    from uform import __version__

    info = {
        "format": FORMAT,
        "rows": len(items),
        "scalar": scalar,
        "dimensions": dimensions,
        "model_dimensions": model_dimensions,
        "npy": npy.name,
        "npy_dtype": str(stored.dtype),
        "scales": None if scales_path is None else scales_path.name,
        "index": index.name,
        "model": os.fspath(model.resolve()),
        "model_sha256": sha256(model),
        "uform": __version__,
        "failed": [f.record() for f in failures],
        "skipped": [{"path": p, "reason": why} for p, why in skipped],
    }
    manifest.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    written.append(manifest)
    return written


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
    prefix = p.with_suffix("") if p.suffix in (".npy", ".jsonl", ".json") else p
    manifest = Path(f"{prefix}.json")
    if not manifest.is_file() or (p != prefix and not p.is_file()):
        return None
    try:
        return prefix if json.loads(manifest.read_text(encoding="utf-8")).get("format") == FORMAT else None
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None


def read_saved(prefix: str | os.PathLike[str]) -> Saved:
    """Read the encode output at ``prefix`` (``prefix.json``, ``.npy``, ``.jsonl``, ``.scales.npy``)."""
    import ml_dtypes

    base = Path(prefix)
    manifest = json.loads(Path(f"{base}.json").read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{base}.json is not a uform encode output (format {manifest.get('format')!r}, expected {FORMAT!r})")
    folder = base.parent
    embeddings = np.load(folder / manifest["npy"], allow_pickle=False)
    kinds = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
    if manifest["scalar"] in kinds:
        embeddings = embeddings.view(kinds[manifest["scalar"]])
    scales = None if manifest["scales"] is None else np.load(folder / manifest["scales"], allow_pickle=False)
    with open(folder / manifest["index"], encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if len(rows) != len(embeddings) or len(rows) != manifest["rows"]:
        raise ValueError(f"{base}: the index holds {len(rows)} rows, the embeddings {len(embeddings)}, the manifest says {manifest['rows']}")
    return Saved(manifest, rows, embeddings, scales)
