"""``uform index PATH... --into INDEX``: keep an index current; and ``uform search ... --index
INDEX``, answered from it. The index itself is ``uform.index`` (docs/index.md)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .common import QUANTIZATIONS, Bar, add_force, checkpoint_path, failed, from_here, printable, say
from uform.inputs import Failure, counted, unserved

SCALARS = ("f32", "f16", "bf16", "i8", "b1")
TEXT_SHOWN = 200  # characters of a text hit printed (a text line may be megabytes)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "index", help="keep an index of files, folders and texts current: embed only what is new or changed",
        description="Walk files and folders as `uform encode` does (a .txt or .jsonl file named here: a text a line) and "
        "bring the index INDEX up to date: new or changed content is embedded, unchanged files are not read, moved files "
        "are matched by their hash, deleted ones leave. Failed items are reported and recorded; the exit status is 1 "
        "when any item failed. docs/index.md.",
    )  # fmt: skip
    p.add_argument("paths", nargs="*", metavar="PATH", help="a media file, a folder, or a .txt/.jsonl file of texts")
    p.add_argument("--into", required=True, metavar="INDEX", help="the index folder (made when missing)")
    p.add_argument("--outputs-scalar", choices=SCALARS, default=None, help="how a new index stores vectors (default f32)")
    p.add_argument("--remove", action="append", default=[], metavar="PATH", help="remove the items of PATH (a folder: all under it); repeatable")
    p.add_argument("--export-parquet", metavar="FILE", help="write every item to a Parquet file after the update (needs pyarrow)")
    p.add_argument("--import-parquet", metavar="PATH", help="add the rows of a Parquet file or folder (an export, or uform.ray.index_rows)")
    add_force(p, "a file at --export-parquet FILE that is not a Parquet export of an index")
    add_model_options(p)
    p.set_defaults(run=run)


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", type=checkpoint_path, default=None, metavar="PATH", help="checkpoint (default: the model shipped with uform)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default=None, help="the weights' scalar (default: the index's, else bf16)")
    p.add_argument("-q", "--quiet", action="store_true", help="draw no progress bars")


def open_index(args: argparse.Namespace, path: str, *, read_only: bool, scalar: str | None = None) -> Any:
    """The index at ``path`` with ``--model`` at ``--quantization`` (None: the index's own)."""
    from uform.index import Index

    return Index(path, checkpoint=args.model, quantization=args.quantization, outputs_scalar=scalar, read_only=read_only)


def run(args: argparse.Namespace) -> int:
    if not (args.paths or args.remove or args.export_parquet is not None or args.import_parquet is not None):
        raise ValueError("nothing to do: give PATHs to index (or --remove, --import-parquet, --export-parquet)")
    named = (("--into", args.into, "the index folder"), ("--export-parquet", args.export_parquet, "the Parquet file to write"),
             ("--import-parquet", args.import_parquet, "the Parquet file or folder to read"))  # fmt: skip
    for option, value, what in named:
        if value == "":  # an unset shell variable: not the current folder
            raise ValueError(f"{option} is empty: name {what}")
    if args.export_parquet is not None or args.import_parquet is not None:
        parquet_ready(args.export_parquet, args.force)
    failures: list[Failure] = []

    def report(f: Failure) -> None:
        failures.append(f)
        say(failed(f))

    from uform.index.sources import refuse_inside

    refuse_inside(args.into, args.paths)  # before an index is made in a folder it would then walk
    refuse_overlap(args.remove, args.paths)
    only_export = not (args.paths or args.remove or args.import_parquet)  # export only reads: no writer's lock, no write permission
    with open_index(args, args.into, read_only=only_export, scalar=args.outputs_scalar) as index:
        if args.import_parquet:
            print(f"imported {printable(args.import_parquet)}: {rows(index.import_parquet(args.import_parquet))}")
        removed = index.remove(args.remove) if args.remove else 0
        result = None
        if args.paths:
            with Bar("indexing", quiet=args.quiet) as bar:
                result = index.update(args.paths, progress=bar.handler(), report=report)
            for f in result.still_failed:
                say(f"{failed(f)} (unchanged since it failed; not tried again)")
            if result.unserved:
                say(f"uform: {unserved(result.unserved)[1]}")
        counts = index.counts()
        what = ", ".join(counted(n, m) for m, n in counts.items() if n) or "no items"
        total = sum(counts.values())
        print(f"index {printable(args.into)}: {total} item{'' if total == 1 else 's'} ({what}) of {index.identity.describe()}")
        if result is not None:
            print(f"this run: {result.added} embedded, {result.unchanged} unchanged, {result.touched} read again unchanged, "
                  f"{result.moved} moved, {result.copied} copied, {result.removed + removed} removed, "
                  f"{len(result.failed)} failed, {len(result.still_failed)} failed before")  # fmt: skip
        elif removed:
            print(f"this run: {removed} removed")
        if args.export_parquet:
            print(f"wrote {printable(args.export_parquet)}: {rows(index.export_parquet(args.export_parquet))}")
        if result is not None and (result.failed or result.still_failed):
            return 1
    return 0


def refuse_overlap(removed: list[str], paths: list[str]) -> None:
    """Refuse a --remove PATH at, under or over a PATH the same run indexes: the removal goes first,
    so the update would embed its items again, and the run report them removed."""
    for r in removed:
        for p in paths:
            a, b = os.path.abspath(r), os.path.abspath(p)
            where = "is" if a == b else "is under" if a.startswith(b.rstrip(os.sep) + os.sep) else "holds" if b.startswith(a.rstrip(os.sep) + os.sep) else ""
            if r and p and where:
                raise ValueError(f"--remove {printable(r)}: {where} {printable(p)}, which this run indexes: its items would be embedded again; "
                                 f"remove them in a run that does not index {printable(p)}, or move the files away first")  # fmt: skip


def rows(n: int) -> str:
    """``"1 row"``, ``"48 rows"``."""
    return f"{n} row{'' if n == 1 else 's'}"


def parquet_ready(export: str | None, force: bool) -> None:
    """Before any work, as for every file uform writes: pyarrow is there, and ``export`` can be
    written: nothing is there, or an earlier export (any other file only with ``force``)."""
    from uform.core.files import check_replaceable, refuse_foreign
    from uform.index.parquet import arrow, is_export

    try:
        arrow()
    except ImportError as exc:
        raise ValueError(str(exc)) from None
    if export is not None:
        check_replaceable(export)
        refuse_foreign(export, is_export, force, "a Parquet export of an index")


def search(args: argparse.Namespace) -> int:
    """``uform search QUERY --index INDEX`` (or ``--like FILE``): ranked from the stored vectors."""
    if args.paths:
        raise ValueError("--index searches the index alone: give no PATHs with it (index them first with `uform index PATH --into INDEX`)")
    if (args.query is None) == (args.like is None):
        raise ValueError("give a QUERY or --like FILE (one of them)")
    wanted = [m.strip() for m in args.modalities.split(",") if m.strip()]
    if not wanted or not set(wanted) <= {"text", "image", "video", "audio"}:
        raise ValueError(f"--modalities must name text, image, video or audio, comma-separated; got {args.modalities!r}")
    with open_index(args, args.index, read_only=True) as index:
        if args.like is not None:
            from uform import InputError

            try:
                hits = index.search_file(args.like, args.top, modalities=wanted)
            except InputError as exc:  # the API's "item 0 (PATH): ...": here the one file is --like's
                raise ValueError(f"--like {args.like}: {exc.reason}") from None
        else:
            hits = index.search(args.query, args.top, modalities=wanted)
    ranked = [{"path": printable(from_here(h.path)), "score": round(h.score, 6), "modality": h.modality,
               **({"text": h.text} if h.text is not None else {})} for h in hits]  # fmt: skip
    if args.json:
        print(json.dumps(ranked, indent=2))
    else:  # a line a hit: names and texts escaped (common.printable), a text clipped
        for rank, r in enumerate(ranked, 1):
            text = r.get("text")
            shown = "" if text is None else "  " + printable(text[:TEXT_SHOWN]) + (f"… ({len(text):,} characters)" if len(text) > TEXT_SHOWN else "")
            print(f"{rank:>3}  {r['score']:6.3f}  {r['path']}{shown}")
    return 0
