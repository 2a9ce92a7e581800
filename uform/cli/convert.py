"""``uform convert``: a CLIP or SigLIP checkpoint (a Hugging Face directory or Hub id, or
open_clip's files) as one uform file; ``uform labels``: zero-shot label probabilities."""

from __future__ import annotations

import argparse
from typing import Any


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "convert", help="convert a CLIP or SigLIP checkpoint (a Hugging Face directory or Hub id) into one uform file",
        description="Convert a CLIP or SigLIP checkpoint into one uform file (docs/models.md). SOURCE is a directory as "
        "save_pretrained writes it, an open_clip directory, or a Hugging Face Hub id (the local cache first; "
        "HF_HUB_OFFLINE=1 forbids a download). OUT is written atomically; a refused source writes nothing.",
    )  # fmt: skip
    p.add_argument("source", help="model directory or Hugging Face Hub id (owner/name)")
    p.add_argument("out", help="path of the .safetensors file to write")
    p.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16", help="stored weights (default bf16; f32 keeps a float32 source exact)")
    p.add_argument("--name", default=None, help="the source's name the file records (default: the Hub id or directory name)")
    p.add_argument("--frames", type=int, default=8, help="frames video_encode averages through the image tower (default 8)")
    p.set_defaults(run=_convert)


def _convert(args: argparse.Namespace) -> int:
    from uform.convert import convert

    done = convert(args.source, args.out, dtype=args.dtype, name=args.name, frames=args.frames)
    print(
        f"wrote {done.out}: {done.family} ({done.architecture}) from {done.name}, {done.tensors} tensors, "
        f"{done.parameters:,} parameters, {done.dtype}, {done.bytes / 2**20:.1f} MiB"
    )
    for note in done.notes:
        print(f"note: {note}")
    return 0
