"""``uform demo-media`` and ``uform evaluate``: generated media the default model understands,
and how well a model retrieves and answers on held-out generated data (``uform.demo``)."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from .common import Bar, add_model, load, model_path


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("demo-media", help="write sample images, videos and recordings (and captions.jsonl) the default model understands")
    p.add_argument("dir", metavar="DIR", help="the folder to write into (made if missing)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated media (default 0)")
    p.add_argument("--per-modality", type=int, default=None, metavar="N", help="items of each modality (default: uform.demo's)")
    p.set_defaults(run=_demo_media)

    p = sub.add_parser("evaluate", help="recall@1/@5 text→image/video/audio and text_choose accuracy and ECE on held-out generated data")
    add_model(p)
    p.add_argument("--seed", type=int, default=None, help="seed of the held-out data (default: uform.demo's)")
    p.add_argument("--count", type=int, default=None, help="held-out items per task (default: uform.demo's)")
    p.add_argument("--json", action="store_true", help="print the figures as a JSON object")
    p.set_defaults(run=_evaluate)


def _demo_media(args: argparse.Namespace) -> int:
    from uform import demo

    options: dict[str, Any] = {"seed": args.seed}
    if args.per_modality is not None:
        if args.per_modality < 1:
            raise ValueError(f"--per-modality must be 1 or more; got {args.per_modality}")
        options["per_modality"] = args.per_modality
    items = demo.write_media(args.dir, **options)
    counts = Counter(str(item.modality) for item in items)
    what = ", ".join(f"{n} {m}" for m, n in sorted(counts.items()))
    print(f"wrote {len(items)} files to {args.dir} ({what}) and their captions in {args.dir}/captions.jsonl")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from uform import demo

    model = load(args)
    options: dict[str, Any] = {}
    if args.seed is not None:
        options["seed"] = args.seed
    if args.count is not None:
        if args.count < 1:
            raise ValueError(f"--count must be 1 or more; got {args.count}")
        options["count"] = args.count
    with model, Bar("evaluating", quiet=args.quiet) as bar:
        result = demo.evaluate(model, progress=bar.handler(), **options)
    figures = result.as_dict()
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"model {model_path(args)} ({args.quantization})")
    rows = list(_flatten(figures))
    width = max((len(k) for k, _ in rows), default=0)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value:.3f}" if isinstance(value, float) else f"{key.ljust(width)}  {value}")
    return 0


def _flatten(figures: dict[str, Any], prefix: str = "") -> Any:
    for key, value in figures.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key} ")
        else:
            yield f"{prefix}{key}", value
