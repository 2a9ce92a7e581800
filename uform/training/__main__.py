"""``python -m uform.training --out PATH --seed 0 [--steps N] [--minutes M] [--phase decoder|reading|clips|pictures|sounds|questions --from CHECKPOINT]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import MISSING, asdict, fields
from pathlib import Path

import torch

from uform.core import files, jsontext
from uform.core.errors import UformError

from .recipe import train
from .settings import ALONE, FRONT, PHASES, Result, Settings

REPORT_KEYS = frozenset(f.name for f in fields(Result) if f.default is MISSING and f.default_factory is MISSING)


def bf16_products_native() -> bool:
    """Whether PyTorch runs BF16 products through oneDNN here (``--bf16-autocast`` is only a
    gain where it does; it honours ``ONEDNN_MAX_CPU_ISA``)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def is_report(path: Path) -> bool:
    """Whether ``path`` holds what ``--report`` writes: a JSON object with every field a
    :class:`Result` has no default for (a file over 64 MiB is not one)."""
    try:
        if path.stat().st_size > 64 << 20:
            return False
        data = jsontext.loads(path.read_bytes())
    except (OSError, jsontext.NotJSON):
        return False
    return isinstance(data, dict) and REPORT_KEYS <= data.keys()


def check_files(out: str, force: bool, report: str | None, start: str | None, phase: str) -> None:
    """Refuse, before any work, what the run could not write at its end (an ``out`` or ``report``
    that is not a writable regular file, an ``out`` that is not a uform checkpoint or a ``report``
    that is not a run's report, unless ``force``)
    and a ``start`` that does not open as a checkpoint, or lacks the byte decoder its phase trains."""
    from uform.core.checkpoint import CheckpointFile, is_checkpoint_file
    from uform.core.config import ModelConfig
    from uform.core.errors import CheckpointError

    files.check_replaceable(out)
    files.refuse_foreign(out, is_checkpoint_file, force, "a uform checkpoint")
    if report is not None:
        files.check_replaceable(report)
        files.refuse_foreign(report, is_report, force, "a report of python -m uform.training")
    if start is not None:
        with CheckpointFile(start) as checkpoint:
            try:
                config = ModelConfig.from_metadata(checkpoint.metadata)
            except CheckpointError as exc:
                raise CheckpointError(f"{start}: {exc}") from None
        if phase in ("decoder", "reading") and "decoder" not in config.towers:
            raise CheckpointError(f"{start}: has no byte decoder (tower 'decoder'), which --phase {phase} trains; give a checkpoint that has one")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uform.training", description="Train the default uform model from generated data.")
    defaults = Settings(out="")
    parser.add_argument("--out", required=True, help="where to write the checkpoint")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data, the initialisation and the calibration (default 0)")
    parser.add_argument("--steps", type=int, default=defaults.steps, help=f"optimiser steps (default {defaults.steps})")
    parser.add_argument("--minutes", type=float, default=None, help="stop early after this many minutes of training")
    parser.add_argument("--batch", type=int, default=defaults.batch, help=f"items per modality per step (default {defaults.batch})")
    parser.add_argument("--image-factor", type=int, default=defaults.image_factor,
                        help="pictures per step: this many times --batch (default %(default)s)")
    parser.add_argument("--text-groups", type=int, default=defaults.text_groups,
                        help="a text step's captions encoded in this many groups of like length: the same loss, less padding (default %(default)s)")
    parser.add_argument("--decoder-row", type=int, default=defaults.decoder_row,
                        help="pack the decoder's questions into rows of this many bytes in both phases; 0: the first phase padded, "
                             "the decoder phase's rows 256 bytes (default %(default)s)")
    parser.add_argument("--image-pool", type=int, default=defaults.image_pool, help="training pictures decoded once (default %(default)s)")
    parser.add_argument("--video-pool", type=int, default=defaults.video_pool, help="training clips decoded once (default %(default)s)")
    parser.add_argument("--audio-pool", type=int, default=defaults.audio_pool, help="varied training recordings made once (default %(default)s)")
    parser.add_argument("--voice-partials", type=int, default=defaults.voice_partials, metavar="N",
                        help="the most partials a varied recording's voice has; past 12 each voice draws its count, 4 to N, "
                             "within the band the tower hears (default %(default)s, the recipe as it was)")
    parser.add_argument("--canonical-vision", type=float, default=defaults.canonical_vision,
                        help="share of pictures and clips from the canonical renderers after the curriculum (default %(default)s)")
    parser.add_argument("--phase", choices=PHASES, default="all",
                        help="all: the towers' phase, then the byte decoder's and its reading stage; decoder: the decoder's "
                             "and its reading stage alone, from --from; reading: the reading stage alone, from --from; "
                             "clips, pictures, sounds: the first phase's clip, picture or sound tower alone, into --from; "
                             "questions: the first phase's byte decoder alone, into --from, then calibrated (default all)")
    parser.add_argument("--from", dest="start", default=None, metavar="CHECKPOINT",
                        help="the checkpoint every phase but all starts from (its other "
                             "tensors are kept byte for byte)")
    parser.add_argument("--variant", type=int, default=None,
                        help="with --phase clips, pictures, sounds or questions: seeds the tower's initialisation and data (default: --seed, "
                             "which seeds the prototypes and must be the checkpoint's own)")
    parser.add_argument("--decoder-seed", type=int, default=None,
                        help="the byte decoder's draw: its initialisation and every question it trains on, in every phase "
                             "(default: --seed; the towers, held-out questions and calibration keep --seed)")
    parser.add_argument("--audio-front", default=None, metavar="n_fft=N,hop=N,n_mels=N",
                        help="with --phase sounds: the sound tower's front end in place of the checkpoint's (any of the three; "
                             "the written checkpoint's config says so)")
    parser.add_argument("--clips-from-pictures", action="store_true",
                        help="with --phase clips: the clip tower starts from --from's picture tower (its patches, positions, "
                             "blocks and projection), not from a fresh initialisation")
    parser.add_argument("--clip-stage", action="store_true",
                        help="the towers' phase trains no clip tower; a clip stage after it trains the clip tower alone from "
                             "that phase's picture tower (as --phase clips --clips-from-pictures), then the decoder's phase")
    parser.add_argument("--decoder-steps", type=int, default=defaults.decoder_steps,
                        help="steps of the byte decoder's own phase; 0 skips it (default %(default)s)")
    parser.add_argument("--reading-steps", type=int, default=defaults.reading_steps,
                        help="steps of the decoder's reading stage (every lettered list in a random order); 0 skips it "
                             "(default %(default)s)")
    parser.add_argument("--bf16-autocast", dest="autocast", action="store_true",
                        help="the first phase's and the clip stage's tower forwards in BF16 autocast, losses in float32 (faster where the CPU has BF16 instructions)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-evaluate", action="store_true", help="skip the BF16 and E4M3 evaluation at the end")
    parser.add_argument("--report", default=None, help="write the run's result as JSON here")
    parser.add_argument("--force", action="store_true", help="replace a file at --out that is not a uform checkpoint, or at --report that is not a run's report")
    args = parser.parse_args(argv)
    if (args.phase != "all") != (args.start is not None):
        parser.error("--from CHECKPOINT goes with --phase decoder, reading, clips, pictures, sounds or questions, and they need it")
    if args.variant is not None and args.phase not in ALONE:
        parser.error("--variant goes with --phase clips, pictures, sounds or questions")
    if args.decoder_seed is not None and args.phase not in ("all", "decoder", "reading", "questions"):
        parser.error("--decoder-seed goes with --phase all, decoder, reading or questions (the phases that train the byte decoder)")
    front = None
    if args.audio_front is not None:
        if args.phase != "sounds":
            parser.error("--audio-front goes with --phase sounds")
        try:
            front = {key.strip(): int(value) for key, value in (part.split("=") for part in args.audio_front.split(","))}
        except ValueError:
            parser.error(f"--audio-front takes n_fft=N,hop=N,n_mels=N (any of them), got {args.audio_front!r}")
        if not front or set(front) - set(FRONT):
            parser.error(f"--audio-front takes n_fft=N,hop=N,n_mels=N (any of them), got {args.audio_front!r}")
    if args.clips_from_pictures and args.phase != "clips":
        parser.error("--clips-from-pictures goes with --phase clips")
    if args.clip_stage and args.phase != "all":
        parser.error("--clip-stage goes with --phase all (the towers' phase)")
    for flag, value in (("--decoder-steps", args.decoder_steps), ("--reading-steps", args.reading_steps)):
        if value < 0:
            parser.error(f"{flag} is a count of steps, 0 or more, got {value}")
    for flag, value, least in (("--seed", args.seed, 0), ("--variant", args.variant, 0), ("--decoder-seed", args.decoder_seed, 0),
                               ("--decoder-row", args.decoder_row, 0), ("--steps", args.steps, 1), ("--batch", args.batch, 1),
                               ("--image-factor", args.image_factor, 1), ("--text-groups", args.text_groups, 1),
                               ("--image-pool", args.image_pool, 1), ("--video-pool", args.video_pool, 1),
                               ("--audio-pool", args.audio_pool, 1), ("--threads", args.threads, 1)):  # fmt: skip
        if value is not None and value < least:  # before the pools are made: a seed of -1 failed in numpy minutes in, a batch of 0 ran on
            parser.error(f"{flag} is an integer of {least} or more, got {value}")
    if args.minutes is not None and not args.minutes > 0:
        parser.error(f"--minutes is a time, more than 0, got {args.minutes}")
    if not args.out or args.out.endswith(("/", os.sep)):
        parser.error(f"--out names the checkpoint file to write, got {args.out!r}")
    if args.voice_partials < 1:
        parser.error(f"--voice-partials is a count of partials, 1 or more, got {args.voice_partials}")
    if args.voice_partials != defaults.voice_partials and args.phase not in ("all", "sounds"):
        parser.error("--voice-partials goes with --phase all or sounds (the phases that train the sound tower)")
    if not 0.0 <= args.canonical_vision <= 1.0:
        parser.error(f"--canonical-vision is a share, 0 to 1, got {args.canonical_vision}")
    if args.autocast and not bf16_products_native():
        parser.error("--bf16-autocast: PyTorch has no native BF16 products on this CPU (oneDNN runs them where the CPU has "
                     "AVX-512 or BF16 instructions); emulated, a 256 x 1024 Linear ran 5.7x slower than in float32: leave "
                     "the option out (the towers then train in float32, and the checkpoint is not the shipped one byte for byte)")
    try:  # a run's minutes (or hours) are not spent on files it cannot use: each refused by name
        check_files(args.out, args.force, args.report, args.start, args.phase)
    except (UformError, OSError, ValueError) as exc:
        parser.error(str(exc))
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings(out=args.out, seed=args.seed, steps=args.steps, minutes=args.minutes, batch=args.batch,
                        image_factor=args.image_factor, text_groups=args.text_groups, decoder_row=args.decoder_row, image_pool=args.image_pool, video_pool=args.video_pool, audio_pool=args.audio_pool,
                        canonical_vision=args.canonical_vision, evaluate=not args.no_evaluate, phase=args.phase, start=args.start,
                        variant=args.variant, clips_from_pictures=args.clips_from_pictures, clip_stage=args.clip_stage, audio_front=front,
                        decoder_steps=args.decoder_steps, reading_steps=args.reading_steps, autocast=args.autocast,
                        decoder_seed=args.decoder_seed, voice_partials=args.voice_partials)  # fmt: skip
    result = train(settings, lambda line: print(line, flush=True))
    if args.report:
        files.write_bytes(args.report, json.dumps(asdict(result), indent=2).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
