"""``uform demo-media`` and ``uform evaluate``: generated media the default model understands,
and how well a model retrieves and answers on held-out generated data (``uform.demo``)."""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from typing import Any

from .common import Bar, add_model, load, model_path, printable


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("demo-media", help="write sample images, videos and recordings (and captions.jsonl) the default model understands")
    p.add_argument("dir", metavar="DIR", help="the folder to write into (made if missing)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated media (default 0)")
    p.add_argument("--per-modality", type=int, default=None, metavar="N", help="items of each modality (default: uform.demo's)")
    p.set_defaults(run=_demo_media)

    p = sub.add_parser("evaluate", help="recall@1/@5 text→image/video/audio and text_choose accuracy and ECE on held-out generated data")
    add_model(p)
    p.add_argument("--seed", type=int, default=None, help="seed of the held-out data (default: uform.demo's)")
    p.add_argument("--count", type=int, default=None, help="held-out items per modality (default: uform.demo's)")
    p.add_argument("--questions", type=int, default=None, help="held-out text_choose questions (default: uform.demo's)")
    p.add_argument("--suite", choices=SUITES, default="own",
                   help="own: media of the training generator's renderer (uform.demo.evaluate); foreign: media, captions and "
                        "questions made by independent code (uform.demo.foreign); both (default: own)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the figures as a JSON object")
    p.set_defaults(run=_evaluate)


def _demo_media(args: argparse.Namespace) -> int:
    from uform import demo

    if not args.dir:  # an unset shell variable: not the current folder
        raise ValueError("DIR is empty: name the folder to write into")
    options: dict[str, Any] = {"seed": seed(args)}
    if args.per_modality is not None:
        if args.per_modality < 1:
            raise ValueError(f"--per-modality must be 1 or more; got {args.per_modality}")
        options["per_modality"] = args.per_modality
    items = demo.write_media(args.dir, **options)
    counts = Counter(str(item.modality) for item in items)
    what = ", ".join(f"{n} {m}" for m, n in sorted(counts.items()))
    print(f"wrote {len(items)} files to {printable(args.dir)} ({what}) and their captions in {printable(os.path.join(args.dir, 'captions.jsonl'))}")
    return 0


SUITES = ("own", "foreign", "both")


def seed(args: argparse.Namespace) -> int:
    """``--seed``, refused by name below 0 (numpy's generators take no negative seed)."""
    if args.seed < 0:
        raise ValueError(f"--seed must be 0 or more; got {args.seed}")
    return int(args.seed)


def _evaluate(args: argparse.Namespace) -> int:
    from uform import demo
    from uform.demo import foreign

    options: dict[str, Any] = {}
    if args.seed is not None:
        options["seed"] = seed(args)
    if args.count is not None:
        if args.count < 1:
            raise ValueError(f"--count must be 1 or more; got {args.count}")
        options["count"] = args.count
    if args.questions is not None:
        if args.questions < 1:
            raise ValueError(f"--questions must be 1 or more; got {args.questions}")
        options["questions"] = args.questions
    model = load(args)  # after the options' checks
    suites = ("own", "foreign") if args.suite == "both" else (args.suite,)
    runs = {"own": demo.evaluate, "foreign": foreign.evaluate}
    results: dict[str, dict[str, Any]] = {}
    with model, Bar("evaluating", quiet=args.quiet) as bar:
        for i, suite in enumerate(suites):
            results[suite] = runs[suite](model, progress=bar.handler(4 * i), **options).as_dict()
    if args.json:
        print(json.dumps(results[suites[0]] if len(suites) == 1 else results, indent=2))
        return 0
    first = results[suites[0]]
    print(f"model {printable(str(model_path(args)))} ({first.get('quantization', args.quantization)} weights, {model.backend} backend)")
    print("\n".join(table(results[suite]) for suite in suites))
    return 0


TASKS = {"image": "text→image", "video": "text→video", "audio": "text→audio"}


def table(figures: dict[str, Any]) -> str:
    """The figures of an ``Evaluation`` as a table: retrieval per modality, then text_choose."""
    keys = [f"{m}_{k}" for m in TASKS for k in ("recall_at_1", "recall_at_5", "queries")] + ["choose_accuracy", "choose_ece", "questions"]
    if not all(k in figures for k in keys):  # another Evaluation than this module knows: every figure, one a line
        rows = list(_flatten(figures))
        width = max((len(k) for k, _ in rows), default=0)
        return "\n".join(f"{k.ljust(width)}  {v:.3f}" if isinstance(v, float) else f"{k.ljust(width)}  {v}" for k, v in rows)
    lines = [f"{'task':<12}{'recall@1':>10}{'recall@5':>10}{'queries':>11}"]
    for m, name in TASKS.items():
        lines.append(f"{name:<12}{figures[m + '_recall_at_1']:>10.3f}{figures[m + '_recall_at_5']:>10.3f}{figures[m + '_queries']:>11}")
    lines.append(f"{'':<12}{'accuracy':>10}{'ECE':>10}{'questions':>11}")
    lines.append(f"{'text_choose':<12}{figures['choose_accuracy']:>10.3f}{figures['choose_ece']:>10.3f}{figures['questions']:>11}")
    if "video_direction" in figures and "items" in figures:
        lines.append(f"{'direction':<12}{figures['video_direction']:>10.3f}{'':>10}{figures['items']:>11}")
    suite = figures.get("suite")
    extra = [f"{suite} suite" if suite else "", f"{figures['items']} held-out items per modality" if "items" in figures else "",
             f"seed {figures['seed']}" if "seed" in figures else "",
             f"{figures['seconds']:.1f} s" if "seconds" in figures else ""]  # fmt: skip
    if any(extra):
        lines.append(", ".join(e for e in extra if e))
    return "\n".join(lines)


def _flatten(figures: dict[str, Any], prefix: str = "") -> Any:
    for key, value in figures.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key} ")
        else:
            yield f"{prefix}{key}", value
