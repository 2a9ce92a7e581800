"""The ``uform`` command: make checkpoints, list plugins, encode texts."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np


def _new(args: argparse.Namespace) -> int:
    from .core import checkpoint
    from .core.host import get_host

    modalities = None if args.modalities in (None, "all") else [m.strip() for m in args.modalities.split(",") if m.strip()]
    config, tensors = checkpoint.new(get_host(), args.preset, args.seed, modalities)
    checkpoint.save(args.out, config, tensors)
    params = sum(t.size for t in tensors.values())
    print(f"wrote {args.out}: preset {args.preset}, seed {args.seed}, towers {', '.join(config.towers)}, {params:,} parameters")
    return 0


def _plugins(args: argparse.Namespace) -> int:
    from .core.host import get_host

    host = get_host()
    records = host.records
    if args.json:
        print(json.dumps([r.__dict__ | {"provides": list(r.provides)} for r in records], indent=2))
        return 0
    rows = [("name", "version", "kind", "status", "provides / error")]
    for r in records:
        rows.append((r.name, f"{r.distribution} {r.version}", r.kind or "-", r.status, r.error or ", ".join(r.provides)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    if host.conflicts:
        print("\nconflicts:")
        for conflict in host.conflicts:
            print(f"  {conflict.message()}")
    print("\nbackends:")
    for backend in sorted(host.backends.values(), key=lambda b: (b.placement, -b.priority)):
        reason = backend.probe()
        detail = f" ({backend.detail()})" if reason is None and backend.detail is not None else ""
        print(f"  {backend.name} ({backend.placement}): {'available' + detail if reason is None else 'unavailable: ' + reason}")
    return 0


def _similarity(args: argparse.Namespace) -> int:
    from . import Arena, Model

    model = Model.load_ram(args.checkpoint)
    emb = np.array(model.text_encode(args.texts, Arena()).embeddings)
    sims = emb @ emb.T
    labels = [t if len(t) <= 24 else t[:21] + "..." for t in args.texts]
    width = max(len(label) for label in labels)
    print(" " * width + "".join(f"{i:>8}" for i in range(len(labels))))
    for i, label in enumerate(labels):
        print(label.ljust(width) + "".join(f"{s:8.3f}" for s in sims[i]))
    d = model.describe()
    print(f"\n{len(labels)} texts, {d.dimensions} dimensions, cosine similarity of unit embeddings")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from .calibrate import calibrate, summary

    report = calibrate(args.checkpoint, args.examples, args.out, holdout=args.holdout, seed=args.seed, groups=args.groups, bins=args.bins)
    if args.json:
        print(json.dumps(summary(report), indent=2))
        return 0
    temps = ", ".join(f"{t:.4g}" for t in report.temperatures)
    print(f"wrote {report.out}: choice_temperatures [{temps}] (was {list(report.previous)})")
    print(f"fitted on {report.fit_examples} examples (per group {list(report.fit_counts)}), measured on {report.heldout_examples} held out")
    print(f"ECE ({args.bins} bins)  before {report.ece_before:.4f}  after {report.ece_after:.4f}")
    print(f"NLL            before {report.nll_before:.4f}  after {report.nll_after:.4f}   accuracy {report.accuracy:.3f}")
    for note in report.notes:
        print(f"note: {note}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .exporters.towers import export_towers

    written = export_towers(args.checkpoint, args.outdir, args.quantization)
    for tower, path in written.items():
        print(f"{tower}: {path} (+ {path.with_suffix('.json').name})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="uform", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("new", help="write a random-initialised checkpoint (deterministic)")
    p.add_argument("out", help="path of the .safetensors file to write")
    p.add_argument("--preset", choices=["tiny", "small", "base"], default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modalities", default="all", help="comma-separated modalities, or 'all' (default)")
    p.set_defaults(run=_new)

    p = sub.add_parser(
        "plugins", help="list the plugins found, with versions, load errors and conflicts (UFORM_BLOCK_PLUGINS=a,b skips plugins)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_plugins)

    p = sub.add_parser("export", help="write each tower as a standalone .onnx plus a JSON of its inputs, outputs and preprocessing")
    p.add_argument("checkpoint")
    p.add_argument("outdir")
    p.add_argument("--quantization", choices=["f32", "bf16"], default="f32", help="weights in the .onnx files (default f32)")
    p.set_defaults(run=_export)

    p = sub.add_parser("similarity", help="encode texts and print their cosine similarity table")
    p.add_argument("checkpoint")
    p.add_argument("texts", nargs="+")
    p.set_defaults(run=_similarity)

    p = sub.add_parser("calibrate", help="fit text_choose temperatures per question group; write a calibrated checkpoint")
    p.add_argument("checkpoint")
    p.add_argument("examples", help="JSON lines: {\"text\", \"choices\", \"answer\", \"group\"?} (docs/choose.md)")
    p.add_argument("--out", required=True, help="path of the calibrated checkpoint to write")
    p.add_argument("--holdout", type=float, default=0.25, help="fraction held out to measure ECE (default 0.25)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit / held-out split")
    p.add_argument("--groups", type=int, default=None, help="number of groups (default: the checkpoint's count or as many as the examples name, whichever is more)")
    p.add_argument("--bins", type=int, default=15, help="confidence bins of the ECE (default 15)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_calibrate)

    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except Exception as exc:  # noqa: BLE001 - the CLI reports errors as one line
        from .core.errors import UformError

        if isinstance(exc, (UformError, FileNotFoundError, ValueError, TypeError)):
            print(f"uform: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
