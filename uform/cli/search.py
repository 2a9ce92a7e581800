"""``uform search``: rank images, videos and recordings by a text query."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from .common import Bar, add_model, failed, from_here, load, model_path, printable, say
from .saved import read_saved, record_name, row_key, saved_prefix, sha256
from uform.inputs import PLURAL, Failure, Gathered, Item, encode, gather, pass_over_unserved, unserved


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "search", help="rank the images, videos and recordings under PATHs (or saved encode outputs) by a text query",
        description="Rank media by their cosine similarity to QUERY's embedding. A PATH is a media file, a folder "
        "(walked recursively), or an `uform encode` output (its .npy, .jsonl or .json, or its OUT prefix), whose "
        "media rows are ranked without encoding them again. Unreadable files are reported on stderr and left out; "
        "the exit status is 1 when any failed.",
    )  # fmt: skip
    p.add_argument("query", nargs="?", help="the text to search for")
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.add_argument("--index", metavar="INDEX", help="answer from an index `uform index` keeps, without encoding media (docs/index.md)")
    p.add_argument("--like", metavar="FILE", help="with --index: rank by a media file's embedding instead of a QUERY (near-duplicates)")
    p.add_argument("-k", "--top", type=int, default=10, metavar="K", help="how many results to print (default 10; 0 for all)")
    p.add_argument("--json", action="store_true", help="print a JSON list of {path, score, modality}, best first")
    p.add_argument("--modalities", default="image,video,audio", metavar="LIST",
                   help="which media to rank, comma-separated (default image,video,audio)")  # fmt: skip
    add_model(p)
    p.set_defaults(run=run, quantization=None)  # None: bf16, or with --index the index's own


def run(args: argparse.Namespace) -> int:
    from uform import Arena, Scalar

    if args.top < 0:
        raise ValueError(f"--top must be 0 (all) or more; got {args.top}")
    if args.query is not None and not args.query.strip():  # an unset shell variable: every score would mean nothing
        raise ValueError(f"QUERY '{args.query}' is empty: give the text to search for")
    try:
        (args.query or "").encode("utf-8")
    except UnicodeEncodeError:  # bytes of another encoding, which Python's argv escapes
        raise ValueError(f"QUERY '{args.query}' is not valid UTF-8 (a command-line argument in another encoding)") from None
    if args.index is not None:
        from .index import search as search_index

        return search_index(args)
    if args.query is None or not args.paths or args.like is not None:
        raise ValueError("give a QUERY and PATHs to search (--like FILE needs --index INDEX)")
    args.quantization = args.quantization or "bf16"
    wanted = {m.strip() for m in args.modalities.split(",") if m.strip()}
    if not wanted or not wanted <= {"image", "video", "audio"}:
        raise ValueError(f"--modalities must name image, video or audio, comma-separated; got {args.modalities!r}")
    failures: list[Failure] = []

    def report(f: Failure) -> None:
        failures.append(f)
        say(failed(f))

    media = Gathered()
    saved = []
    for path in args.paths:
        prefix = saved_prefix(path)
        if prefix is not None:
            saved.append(read_saved(prefix))
            continue
        found = gather([path], texts=False, report=report)
        media.items.extend(i for i in found.items if i.modality in wanted)
    media.items = _once(media.items)
    if saved:
        checkpoint = model_path(args)
        digest = sha256(checkpoint)
        for s in saved:
            if s.manifest.get("model_sha256") != digest:
                raise ValueError(
                    f"the encode output {s.manifest['npy']} was made with the model {s.manifest.get('model')}, not {checkpoint}: "
                    "its rows cannot be compared with this model's query; pass that model with --model"
                )  # fmt: skip
    if not media.items and not any(r["modality"] in wanted for s in saved for r in s.rows):
        if failures:
            return _print([], args, failures)
        names = [PLURAL[m] for m in ("image", "video", "audio") if m in wanted]
        kinds = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
        raise ValueError(f"nothing to search: no {kinds} under {', '.join(args.paths)}")

    model = load(args)
    media.items, passed = pass_over_unserved(media.items, model)
    if passed:
        line = unserved(passed)[1]
        if not media.items and not any(r["modality"] in wanted for s in saved for r in s.rows):
            raise ValueError(f"nothing to search: {line}")
        say(f"uform: {line}")
    query = np.array(model.text_encode([args.query], Arena()).embeddings[0])
    paths: list[str] = []
    modalities: list[str] = []
    scores: list[np.ndarray] = []
    for s in saved:
        keep = [i for i, r in enumerate(s.rows) if r["modality"] in wanted]
        base = record_name(s.manifest, "cwd", f"the encode output {s.manifest['npy']}")  # None: written before outputs recorded it
        paths += [_opened_here(s.rows[i][row_key(s.rows[i])], base) for i in keep]
        modalities += [s.rows[i]["modality"] for i in keep]
        scores.append(s.scores(query)[keep])
    if media.items:
        with Bar("encoding", quiet=args.quiet, total=len(media.items)) as bar:
            result = encode(model, media.items, scalar=Scalar.F32, dimensions=None, bar=bar, report=report)
        paths += [i.value for i in result.items]
        modalities += [i.modality for i in result.items]
        scores.append(result.embeddings @ query)
    values = np.concatenate(scores) if scores else np.zeros(0, np.float32)
    order = np.argsort(-values, kind="stable")
    if args.top:
        order = order[: args.top]
    ranked = [{"path": printable(paths[i]), "score": round(float(values[i]), 6), "modality": modalities[i]} for i in order]
    return _print(ranked, args, failures)


def _opened_here(path: str, base: str | None) -> str:
    """An encode output's row path as it opens from the current folder: a relative one is
    relative to the folder ``encode`` ran in (the output's ``cwd``), which may be another."""
    if base is None or os.path.isabs(path):
        return path
    return from_here(os.path.normpath(os.path.join(base, path)))


def _once(items: list[Item]) -> list[Item]:
    """Each file once, the first time it is named: a folder given twice (or a file and its folder)
    put each of its files in the ranking twice, as two hits of one score."""
    seen: set[str] = set()
    out = []
    for item in items:
        key = os.path.normpath(os.path.abspath(item.value))
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _print(ranked: list[dict[str, Any]], args: argparse.Namespace, failures: list[Failure]) -> int:
    if args.json:
        print(json.dumps(ranked, indent=2))
    else:
        for rank, r in enumerate(ranked, 1):
            print(f"{rank:>3}  {r['score']:6.3f}  {r['path']}")
    if failures:
        say(f"uform: {len(failures)} failed (reported above)")
        return 1
    return 0
