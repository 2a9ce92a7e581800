"""``uform encode``: texts, files and folders to embeddings.

``--out OUT`` writes ``OUT.npy`` (the rows), ``OUT.jsonl`` (what each row is), ``OUT.json``
(the scalar, the dimensions, the model, what failed) and, for I8, ``OUT.scales.npy``, as one
set (:mod:`uform.cli.saved`, which also reads it back: :func:`read_saved`); ``docs/cli.md``
states the format.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .common import Bar, add_force, add_model, failed, load, model_path, printable, say
from .saved import FORMAT, SCALARS, SUFFIXES, Saved, check_writable, read_saved, saved_prefix, sha256, write_saved
from uform.inputs import PLURAL, Failure, Item, counted, encode, gather, pass_over_unserved, unserved

__all__ = ["FORMAT", "Saved", "add_parser", "out_prefix", "read_saved", "run", "saved_prefix", "sha256", "write_saved"]


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
    add_force(p, "files at OUT that an earlier encode did not write")
    add_model(p)
    p.set_defaults(run=run)


def out_prefix(out: str) -> Path:
    """The prefix ``--out`` names (a .npy, .jsonl or .json suffix dropped); it must end in a name."""
    path = Path(out)
    prefix = path.with_suffix("") if path.suffix in SUFFIXES else path
    if not out or out.endswith(("/", os.sep)) or prefix.name in ("", ".", ".."):
        raise ValueError(f"--out {out!r} names no file: give a name, such as OUT or folder/OUT (OUT.npy, OUT.jsonl and OUT.json are written)")
    return prefix


def run(args: argparse.Namespace) -> int:
    from uform import Scalar

    failures: list[Failure] = []

    def report(f: Failure) -> None:
        failures.append(f)
        say(failed(f))

    found = gather(args.inputs, texts=True, report=report)
    found.items.extend(Item("text", t) for t in args.text)
    if not found.items and not found.failures:
        raise ValueError("nothing to encode: give texts, files or folders holding " + ", ".join(("images", "videos", "recordings")))
    prefix = out_prefix(args.out)
    if not prefix.parent.is_dir():
        raise FileNotFoundError(f"--out {args.out}: no such folder {prefix.parent}")
    check_writable(prefix, args.outputs_scalar == "i8", args.force)
    model = load(args)
    found.items, passed = pass_over_unserved(found.items, model)
    entries, line = unserved(passed)
    if passed and not found.items and not found.failures:
        raise ValueError(f"nothing to encode: {line}")
    full = model.describe().dimensions
    if args.dimensions is not None and not 1 <= args.dimensions <= full:
        raise ValueError(f"--dimensions must be between 1 and the model's {full}; got {args.dimensions}")
    scalar = Scalar(args.outputs_scalar)
    with Bar("encoding", quiet=args.quiet, total=len(found.items)) as bar:
        result = encode(model, found.items, scalar=scalar, dimensions=args.dimensions, bar=bar, report=report)
    dimensions = args.dimensions or full
    written = write_saved(prefix, result.items, result.embeddings, result.scales, scalar.value, dimensions, full,
                          model_path(args), failures, found.skipped + entries)  # fmt: skip
    counts = {m: sum(1 for i in result.items if i.modality == m) for m in PLURAL}
    what = ", ".join(counted(n, m) for m, n in counts.items() if n) or "no rows"
    print(f"wrote {', '.join(printable(str(p)) for p in written)}: {len(result.items)} row{'' if len(result.items) == 1 else 's'} of {dimensions} {scalar.value} ({what})")
    if found.skipped:
        n = len(found.skipped)
        print(f"passed over {n} {'entry' if n == 1 else 'entries'} of the folders (files of unknown type, links to folders; listed in {printable(str(written[-1]))})")
    if passed:
        print(f"{line} (listed in {printable(str(written[-1]))})")
    if failures:
        print(f"{len(failures)} failed (reported above, and listed in {printable(str(written[-1]))})")
        return 1
    return 0
