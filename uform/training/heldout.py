"""The held-out split of the training's own generators, read through the runtime.

A model is chosen on this split, never on the foreign suite (issue 19's rule): varied pictures,
clips and recordings of :mod:`uform.demo.variety` drawn from ``HELDOUT_STREAM`` (no training
or calibration draw comes from it), written as files (pictures 30 % JPEG, clips MP4 and WebM,
recordings WAV and FLAC) and encoded by the model's own verbs. Each item is read as the meaning
whose canonical caption is nearest to it; a clip's direction as the nearest of the four
captions of its colour and shape. Every figure is the fraction read right, overall and
attribute by attribute (colour / shape / count, colour / shape / direction, kind / pitch /
rhythm)::

    python -m uform.training.heldout CHECKPOINT [CHECKPOINT ...] [--seed 0] [--quantization bf16] [--count N] [--json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from uform import Arena, Model
from uform.demo.variety.captions import meanings
from uform.demo.variety.clips import clip as varied_clip
from uform.demo.variety.pictures import picture as varied_picture
from uform.demo.variety.recordings import PARTIALS, sound as varied_sound
from uform.demo.evaluate import HELDOUT_STREAM, clip_direction
from uform.demo.media import audio_bytes, image_bytes, video_bytes
from uform.verbs import ITEM_VERBS

SIZES = {"image": 300, "video": 240, "audio": 240}


@dataclass(frozen=True)
class Split:
    """One draw of the split: each modality's files and their meanings (indices into ``variety.captions.meanings``)."""

    files: dict[str, list[bytes]]
    labels: dict[str, list[int]]


@dataclass(frozen=True)
class Reading:
    """What a model reads of one modality: ``accuracy`` (the whole meaning), ``attributes`` (each
    attribute alone, in the meaning's order) and, for clips, ``direction`` (among four)."""

    accuracy: float
    attributes: tuple[float, ...]
    direction: float | None = None


def draw(seed: int = 0, sizes: dict[str, int] | None = None, partials: int = PARTIALS) -> Split:
    """The split of ``seed``: ``sizes`` items a modality (:data:`SIZES` unless given), the
    recordings' voices with at most ``partials`` partials (``variety.recordings.varied_voice``; 12, the recipe's
    recordings before 2026-12-04, unless given)."""
    sizes = SIZES if sizes is None else sizes
    index = {m: {x.caption: i for i, x in enumerate(meanings(m))} for m in SIZES}
    rng = np.random.default_rng([HELDOUT_STREAM, seed])
    files: dict[str, list[bytes]] = {m: [] for m in SIZES}
    labels: dict[str, list[int]] = {m: [] for m in SIZES}
    for _ in range(sizes.get("image", 0)):
        pixels, meaning = varied_picture(rng, int(rng.choice([32, 40, 48, 64, 96, 128])))
        jpeg = rng.random() < 0.3
        files["image"].append(image_bytes(pixels, "jpeg", quality=int(rng.integers(60, 96))) if jpeg else image_bytes(pixels, "png"))
        labels["image"].append(index["image"][meaning.caption])
    for i in range(sizes.get("video", 0)):
        clip = varied_clip(rng)
        files["video"].append(video_bytes(clip.frames, "mp4" if i % 2 == 0 else "webm", fps=clip.fps))
        labels["video"].append(index["video"][clip.meaning.caption])
    for i in range(sizes.get("audio", 0)):
        window, meaning = varied_sound(rng, partials=partials)
        pcm = np.clip(np.round(window * 32767.0), -32768, 32767).astype(np.int16)
        files["audio"].append(audio_bytes(pcm, "wav" if i % 2 == 0 else "flac"))
        labels["audio"].append(index["audio"][meaning.caption])
    return Split(files, labels)


def read(model: Model, split: Split) -> dict[str, Reading]:
    """Every modality of ``split`` that has items, read by ``model``."""
    out: dict[str, Reading] = {}
    for modality, files in split.files.items():
        if not files:
            continue
        classes = meanings(modality)
        media = np.array(getattr(model, ITEM_VERBS[modality])(files, Arena()).embeddings)
        texts = np.array(model.text_encode([m.caption for m in classes], Arena()).embeddings)
        guessed = np.argmax(media @ texts.T, axis=1)
        truth = np.array(split.labels[modality])
        attributes = tuple(
            float(np.mean([classes[a].attributes[i] == classes[b].attributes[i] for a, b in zip(guessed, truth)]))
            for i in range(len(classes[0].attributes))
        )  # fmt: skip
        direction = clip_direction(model, media, [classes[t].attributes for t in truth]) if modality == "video" else None
        out[modality] = Reading(float(np.mean(guessed == truth)), attributes, direction)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m uform.training.heldout", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quantization", default="bf16", choices=["bf16", "e4m3", "f32"])
    parser.add_argument("--count", type=int, help=f"items a modality (default {SIZES})")
    parser.add_argument("--json", action="store_true", help="one JSON object a checkpoint")
    parser.add_argument("--voice-partials", type=int, default=PARTIALS, metavar="N",
                        help="the recordings' voices drawn as the recipe's --voice-partials N draws them (default %(default)s)")
    args = parser.parse_args(argv)
    if args.count is not None and args.count < 1:
        parser.error(f"--count is a number of items, 1 or more, got {args.count}")
    if args.voice_partials < 1:
        parser.error(f"--voice-partials is a count of partials, 1 or more, got {args.voice_partials}")
    split = draw(args.seed, None if args.count is None else dict.fromkeys(SIZES, args.count), args.voice_partials)
    for path in args.checkpoints:
        with Model.load_ram(path, quantization=args.quantization) as model:
            readings = read(model, split)
        if args.json:
            print(json.dumps({"checkpoint": str(path), **{m: asdict(r) for m, r in readings.items()}}))
            continue
        print(path)
        for modality, r in readings.items():
            extra = f"  direction {r.direction:.3f}" if r.direction is not None else ""
            print(f"  {modality:6} {r.accuracy:.3f}  ({' / '.join(f'{a:.2f}' for a in r.attributes)}){extra}")


if __name__ == "__main__":
    main()
