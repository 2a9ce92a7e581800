"""Commands about checkpoints: ``new``, ``describe``, ``similarity``, ``export``, ``calibrate``, ``plugins``."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from .common import Bar, add_force, add_model, add_quiet, checkpoint_path, load, model_path, printable


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("new", help="write a random-initialised checkpoint (deterministic)")
    p.add_argument("out", help="path of the .safetensors file to write")
    p.add_argument("--preset", choices=["tiny", "small", "base"], default="tiny", help="the towers' size (default tiny; docs/checkpoint.md)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0): the same arguments write the same bytes")
    p.add_argument("--modalities", default="all", help="comma-separated modalities, or 'all' (default)")
    add_force(p, "a file at OUT that is not a uform checkpoint")
    add_quiet(p)
    p.set_defaults(run=_new)

    p = sub.add_parser("describe", help="what a model is: Model.describe(), its backend and what it computes in")
    add_model(p)
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(run=_describe)

    p = sub.add_parser(
        "plugins", help="list the plugins found, with versions, load errors and conflicts (UFORM_BLOCK_PLUGINS=a,b skips plugins)"
    )
    p.add_argument("--json", action="store_true", help="print the plugins as a JSON list of objects (docs/plugins.md)")
    p.set_defaults(run=_plugins)

    p = sub.add_parser("export", help="write each tower as a standalone .onnx plus a JSON of its inputs, outputs and preprocessing")
    p.add_argument("checkpoint", nargs="?", type=checkpoint_path, default=None, help="the checkpoint (default: the model shipped with uform)")
    p.add_argument("outdir")
    p.add_argument("--quantization", choices=["f32", "bf16"], default="f32", help="weights in the .onnx files (default f32)")
    add_force(p, "files of the towers' names in OUTDIR that an earlier export did not write")
    add_quiet(p)
    p.set_defaults(run=_export)

    p = sub.add_parser(
        "similarity", help="encode texts and print their cosine similarity table",
        description="Encode texts and print their cosine similarity table. A first TEXT naming an existing "
        ".safetensors file is the checkpoint (the form `uform similarity CHECKPOINT TEXT...`).",
    )  # fmt: skip
    add_model(p)
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.set_defaults(run=_similarity)

    p = sub.add_parser("calibrate", help="fit text_choose temperatures per question group; write a calibrated checkpoint")
    p.add_argument("checkpoint", nargs="?", type=checkpoint_path, default=None, help="the checkpoint (default: the model shipped with uform)")
    p.add_argument("examples", help="JSON lines: {\"text\", \"choices\", \"answer\", \"group\"?} (docs/choose.md)")
    p.add_argument("--out", required=True, help="path of the calibrated checkpoint to write")
    p.add_argument("--holdout", type=float, default=0.25, help="fraction held out to measure ECE (default 0.25)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit / held-out split")
    p.add_argument("--groups", type=int, default=None, help="number of groups (default: the checkpoint's count or as many as the examples name, whichever is more)")
    p.add_argument("--bins", type=int, default=15, help="confidence bins of the ECE (default 15)")
    p.add_argument("--json", action="store_true", help="print the calibration report as a JSON object")
    add_force(p, "a file at --out that is not a uform checkpoint")
    add_quiet(p)
    p.set_defaults(run=_calibrate)


def _new(args: argparse.Namespace) -> int:
    from uform.core import checkpoint
    from uform.core.host import get_host

    writable_checkpoint(args.out, args.force)

    modalities = None if args.modalities in (None, "all") else [m.strip() for m in args.modalities.split(",") if m.strip()]
    with Bar("initialising", quiet=args.quiet, unit="param") as bar:
        config, tensors = checkpoint.new(get_host(), args.preset, args.seed, modalities, progress=bar.handler())
        bar.describe(f"writing {args.out}")
        checkpoint.save(args.out, config, tensors)
    params = sum(t.size for t in tensors.values())
    print(f"wrote {printable(args.out)}: preset {args.preset}, seed {args.seed}, towers {', '.join(config.towers)}, {params:,} parameters")
    return 0


def description(args: argparse.Namespace) -> dict[str, Any]:
    """What ``describe`` prints: the checkpoint, ``Model.describe()``'s fields, backend and compute."""
    model = load(args)
    with model:
        d = model.describe()
        fields = {k: (v.value if hasattr(v, "value") else v) for k, v in d._asdict().items()}
        info = {"model": printable(str(model_path(args))), **fields, "backend": model.backend, "compute": model.compute}
        source = {"source": model.source} if model.source is not None else {}  # a converted model's (format version 2)
        return info | source | {"modalities": dict(model.served.modalities)}


def _describe(args: argparse.Namespace) -> int:
    info = description(args)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key == "modalities":  # audio (audio_encode, audio_encode_samples), choose (text_choose), ...
            value = ", ".join(f"{name} ({', '.join(verbs)})" for name, verbs in value.items()) or "-"
        elif key == "source":  # clip openai/clip-vit-base-patch32 (CLIPModel), converted by uform 4.0.0rc1
            arch = f" ({value['architecture']})" if value.get("architecture") else ""
            by = f", converted by {value['converter']}" if value.get("converter") else ""
            value = printable(f"{value.get('family', '')} {value.get('name', '')}{arch}{by}")  # the file's words: no escapes reach the terminal
        print(f"{key.ljust(width)}  {'-' if value is None else value}")
    return 0


def _plugins(args: argparse.Namespace) -> int:
    from uform.core.host import get_host

    host = get_host()
    records = host.records
    if args.json:
        print(json.dumps([r.__dict__ | {"provides": list(r.provides)} for r in records], indent=2))
        return 0
    rows: list[tuple[str, ...]] = [("name", "version", "kind", "status", "provides / error")]
    for r in records:  # a plugin's names and errors are its own text: one printable line each
        cells = (r.name, f"{r.distribution} {r.version}", r.kind or "-", r.status, r.error or ", ".join(r.provides))
        rows.append(tuple(printable(c) for c in cells))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    if host.conflicts:
        print("\nconflicts:")
        for conflict in host.conflicts:
            print(f"  {printable(conflict.message())}")
    print("\nbackends:")
    for backend in sorted(host.backends.values(), key=lambda b: (b.placement, -b.priority)):
        reason = host.probe(backend)  # a probe that raises is its reason, naming the plugin
        state = "available" if reason is None else f"unavailable: {reason}"
        if reason is None and backend.detail is not None:
            try:
                state += f" ({backend.detail()})"
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - what it runs is unknown; the rest is listed still
                state += f" (its detail raised {type(exc).__name__}: {exc})"
        print(f"  {printable(f'{backend.name} ({backend.placement}): {state}')}")
    return 0


def _similarity(args: argparse.Namespace) -> int:
    import os

    from uform import Arena

    if args.model is None and args.texts[0].endswith(".safetensors") and os.path.isfile(args.texts[0]):
        args.model, args.texts = args.texts[0], args.texts[1:]
        if not args.texts:
            raise ValueError("similarity needs one text at least after the checkpoint")
    model = load(args)
    emb = np.array(model.text_encode(args.texts, Arena()).embeddings)
    sims = emb @ emb.T
    labels = [printable(t if len(t) <= 24 else t[:21] + "...") for t in args.texts]
    width = max(len(label) for label in labels)
    print(" " * width + "".join(f"{i:>8}" for i in range(len(labels))))
    for i, label in enumerate(labels):
        print(label.ljust(width) + "".join(f"{s:8.3f}" for s in sims[i]))
    d = model.describe()
    print(f"\n{len(labels)} texts, {d.dimensions} dimensions, cosine similarity of unit embeddings")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from uform.calibrate import calibrate, summary

    checkpoint = model_path(argparse.Namespace(model=args.checkpoint))
    writable_checkpoint(args.out, args.force)
    with Bar("scoring examples", quiet=args.quiet) as bar:
        report = calibrate(checkpoint, args.examples, args.out, holdout=args.holdout, seed=args.seed, groups=args.groups,
                           bins=args.bins, progress=bar.handler())  # fmt: skip
    if args.json:
        print(json.dumps(summary(report), indent=2))
        return 0
    temps = ", ".join(f"{t:.4g}" for t in report.temperatures)
    print(f"wrote {printable(str(report.out))}: choice_temperatures [{temps}] (was {list(report.previous)})")
    print(f"fitted on {report.fit_examples} examples (per group {list(report.fit_counts)}), measured on {report.heldout_examples} held out")
    print(f"ECE ({args.bins} bins)  before {report.ece_before:.4f}  after {report.ece_after:.4f}")
    print(f"NLL            before {report.nll_before:.4f}  after {report.nll_after:.4f}   accuracy {report.accuracy:.3f}")
    for note in report.notes:
        print(f"note: {note}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from uform.exporters.towers import export_towers

    checkpoint = model_path(argparse.Namespace(model=args.checkpoint))
    with Bar("exporting", quiet=args.quiet, bytes_=True) as bar:
        written = export_towers(checkpoint, args.outdir, args.quantization, progress=bar.handler(), force=args.force)
    for tower, path in written.items():
        print(f"{tower}: {printable(str(path))} (+ {printable(path.with_suffix('.json').name)})")
    return 0


def writable_checkpoint(path: str, force: bool) -> None:
    """Refuse, before any work, a checkpoint path that cannot be written or holds a file that is
    not a uform checkpoint (unless ``--force``)."""
    from uform.core.checkpoint import is_checkpoint_file
    from uform.core.files import check_replaceable, refuse_foreign

    if not path:
        raise ValueError("the checkpoint path is empty: name the .safetensors file to write")
    if path.endswith(("/", os.sep)):  # pathlib drops the slash: 'out/' was written as the file 'out'
        raise ValueError(f"{printable(path)} names a folder (it ends in '/'): name the .safetensors file to write")
    check_replaceable(path)  # first: --force cannot replace a device, a read-only file, a missing folder
    refuse_foreign(path, is_checkpoint_file, force, "a uform checkpoint")
