"""``uform convert``: a CLIP, SigLIP, Chinese-CLIP or CLAP checkpoint (a Hugging Face directory or Hub id, or
open_clip's files) as one uform file; ``uform labels``: zero-shot label probabilities."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from .common import Bar, add_model, failed, load, printable, say

def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "convert", help="convert a CLIP, SigLIP, Chinese-CLIP or CLAP checkpoint (a Hugging Face directory or Hub id) into one uform file",
        description="Convert a CLIP, SigLIP, Chinese-CLIP or CLAP checkpoint into one uform file (docs/models.md). SOURCE is a directory as "
        "save_pretrained writes it, an open_clip directory, or a Hugging Face Hub id (the local cache first; "
        "HF_HUB_OFFLINE=1 forbids a download). OUT is written atomically; a refused source writes nothing.",
    )  # fmt: skip
    p.add_argument("source", help="model directory or Hugging Face Hub id (owner/name)")
    p.add_argument("out", help="path of the .safetensors file to write")
    p.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16", help="stored weights (default bf16; f32 keeps a float32 source exact)")
    p.add_argument("--name", default=None, help="the source's name the file records (default: the Hub id or directory name)")
    p.add_argument("--frames", type=int, default=None, help="frames video_encode averages through the image tower (default 8; refused for a model without one, CLAP)")
    p.add_argument("--force", action="store_true", help="replace a file at OUT that is not a uform checkpoint (refused without it)")
    p.set_defaults(run=_convert)

    p = sub.add_parser(
        "labels", help="zero-shot labels: the probability of each label text for each image, video or recording (a converted CLIP, SigLIP, Chinese-CLIP or CLAP)",
        description="Zero-shot label probabilities of each PATH's media against label texts, as the model was trained "
        "to give them: CLIP's softmax over the labels (each item's sum to 1), SigLIP's sigmoid of each label on its own. "
        "Needs a model with labels (uform convert); unreadable files are reported on stderr and left out (exit status 1).",
    )  # fmt: skip
    p.add_argument("paths", nargs="+", metavar="PATH", help="media files or folders (walked recursively)")
    p.add_argument("--labels", default=None, metavar="LIST", help="the label texts, comma-separated")
    p.add_argument("--label", action="append", default=[], metavar="TEXT", help="one label text (repeatable; may hold commas)")
    p.add_argument("-k", "--top", type=int, default=5, metavar="K", help="labels printed per item, most probable first (default 5; 0 for all)")
    p.add_argument("--json", action="store_true", help="print a JSON list of {path, modality, labels: {text: probability}}")
    add_model(p)
    p.set_defaults(run=_labels, quantization=None)


def _convert(args: argparse.Namespace) -> int:
    from uform.convert import convert

    done = convert(args.source, args.out, dtype=args.dtype, name=args.name, frames=args.frames, force=args.force)
    print(
        f"wrote {printable(str(done.out))}: {done.family} ({done.architecture}) from {done.name}, {done.tensors} tensors, "
        f"{done.parameters:,} parameters, {done.dtype}, {done.bytes / 2**20:.1f} MiB"
    )
    for note in done.notes:
        print(f"note: {note}")
    return 0


def _labels(args: argparse.Namespace) -> int:
    import numpy as np

    from uform import Arena, Scalar
    from uform.core import labels as zero_shot
    from uform.inputs import Failure, encode, gather, pass_over_unserved, unserved

    texts = [t.strip() for t in (args.labels or "").split(",") if t.strip()] + list(args.label)
    if any(not t.strip() for t in args.label):
        raise ValueError("--label: a label text is empty (or only spaces); give each label some words")
    if not texts:
        raise ValueError("give the label texts with --labels 'a cat,a dog' or --label TEXT (repeatable)")
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes of another encoding, which Python's argv escapes
            raise ValueError(f"label '{text}' is not valid UTF-8 (a command-line argument in another encoding)") from None
    twice = sorted(t for t, n in Counter(texts).items() if n > 1)
    if twice:  # one row each: a softmax would split the label's probability between its copies
        raise ValueError("label texts given more than once: '" + "', '".join(twice) + "'")
    if args.top < 0:
        raise ValueError(f"--top must be 0 (all) or more; got {args.top}")
    failures: list[Failure] = []

    def report(f: Failure) -> None:
        failures.append(f)
        say(failed(f))

    media = gather(args.paths, texts=False, report=report)
    args.quantization = args.quantization or "bf16"
    model = load(args)
    if model.labels is None:
        raise ValueError(f"{args.model or 'the default model'} has no labels: zero-shot labels need a converted CLIP, SigLIP, Chinese-CLIP or CLAP (uform convert, docs/models.md)")
    spec = zero_shot.spec(model.labels)
    label_rows = np.array(model.text_encode(texts, Arena()).embeddings)  # before the media: a refused label costs no encoding
    first: dict[bytes, str] = {}
    for text, row in zip(texts, label_rows):
        same = first.setdefault(row.tobytes(), text)
        if same != text:  # the same tokens (the tokenizer lower-cases, folds spaces ...): as a copy, it splits a softmax
            raise ValueError(f"label texts '{same}' and '{text}' are the same text to this model (the same tokens); give one of them")
    media.items, passed = pass_over_unserved(media.items, model)
    if passed:
        say(f"uform: {unserved(passed)[1]}")
    rows: list[dict[str, Any]] = []
    if media.items:
        with Bar("encoding", quiet=args.quiet, total=len(media.items)) as bar:
            result = encode(model, media.items, scalar=Scalar.F32, dimensions=None, bar=bar, report=report)
        if result.items:  # Model.label_probabilities' math, on the label rows encoded once above
            probs = zero_shot.probabilities(spec, zero_shot.rows(result.embeddings, model.describe().dimensions), label_rows)
            for item, p in zip(result.items, probs):
                order = sorted(range(len(texts)), key=lambda j: -float(p[j]))
                shown = printable(item.value)  # and the exact name's bytes where it prints otherwise (not UTF-8, a line break ...)
                exact = {} if shown == item.value else {"path_hex": item.value.encode("utf-8", "surrogateescape").hex()}
                labelled = {texts[j]: round(float(p[j]), 6) for j in order}
                rows.append({"path": shown, **exact, "modality": item.modality, "labels": labelled})
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        kind = model.labels["kind"]
        for r in rows:
            print(f"{r['path']}  ({kind})")
            for text, prob in list(r["labels"].items())[: args.top or None]:
                print(f"  {prob:6.3f}  {printable(text)}")
    if failures:
        say(f"uform: {len(failures)} failed (reported above)")
        return 1
    if not rows:
        raise ValueError(f"nothing to label: no images, videos or recordings under {', '.join(args.paths)}")
    return 0
