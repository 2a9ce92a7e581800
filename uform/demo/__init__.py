"""Procedural demo data for the default model: sample media, and a held-out evaluation.

Runtime code (numpy, Pillow and PyAV; no torch). :func:`write_media` writes pictures, clips
and recordings the default model understands, with their captions; :func:`evaluate`
measures a model on held-out generated data through the runtime. The generators themselves
(:mod:`uform.demo.generate`) also feed the training recipe (:mod:`uform.training`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from uform.core.files import Outputs

from . import generate
from .evaluate import EVALUATION_STREAM, MEDIA_STREAM, Evaluation, evaluate, recall
from .media import audio_bytes, image_bytes, video_bytes

__all__ = ["DemoItem", "Evaluation", "evaluate", "recall", "write_media", "generate", "EVALUATION_STREAM"]

MODALITIES = ("image", "video", "audio")
RED_CIRCLES = 3  # the first pictures of every write_media are this many red circles


@dataclass(frozen=True)
class DemoItem:
    """One written file: its path, its modality (``image``, ``video``, ``audio``) and caption."""

    path: str
    modality: str
    caption: str


def _slug(caption: str) -> str:
    words = caption.split()
    if words and words[0] in ("a", "an"):
        words = words[1:]
    return re.sub(r"[^a-z0-9]+", "-", " ".join(words).lower()).strip("-")


def write_media(directory: str | os.PathLike[str], *, seed: int = 0, per_modality: int = 8) -> list[DemoItem]:
    """Write ``per_modality`` pictures, clips and recordings into ``directory`` (made if
    missing), plus ``captions.jsonl`` (one ``{"path", "modality", "caption"}`` a line, paths
    relative to ``directory``); answer the items in that order.

    File names say what they hold: ``image-00-red-circle.png``, ``video-03-purple-circle-moving-up.webm``,
    ``audio-04-slowly-pulsing-low-tone.wav``. Pictures are 128 x 128, alternately PNG and JPEG; clips
    64 x 64, eight frames at 8 fps, alternately MP4 (H.264) and WebM (VP8); recordings one
    second of 16-bit mono at 16 kHz, alternately WAV and FLAC. The first ``min(3,
    per_modality)`` pictures are red circles (so a search for "a red circle" has several right
    answers). The same ``seed`` writes the same media. The files are one set, written whole or
    not at all (:mod:`uform.core.files`), ``captions.jsonl`` put in place last. Raises
    ``ValueError`` for ``per_modality < 1`` and ``OSError`` when the directory cannot be written.
    """
    if per_modality < 1:
        raise ValueError(f"per_modality must be at least 1, got {per_modality}")
    with Outputs() as files:
        return _write_media(files, Path(directory), seed, per_modality)


def _write_media(files: Outputs, out: Path, seed: int, per_modality: int) -> list[DemoItem]:
    files.folder(out)
    rng = np.random.default_rng([MEDIA_STREAM, seed])
    items: list[DemoItem] = []

    def put(modality: str, index: int, caption: str, ext: str, data: bytes) -> None:
        name = f"{modality}-{index:02d}-{_slug(caption)}.{ext}"
        with files.open(out / name) as f:
            f.write(data)
        items.append(DemoItem(str(out / name), modality, caption))

    for i in range(per_modality):
        red = i < RED_CIRCLES
        p = generate.picture(rng, 128, colour="red" if red else None, shape="circle" if red else None, count=1 if red else None)
        fmt = "png" if i % 2 == 0 else "jpeg"
        put("image", i, p.caption, "png" if fmt == "png" else "jpg", image_bytes(p.pixels, fmt))
    for i in range(per_modality):
        c = generate.clip(rng, 64)
        fmt = "mp4" if i % 2 == 0 else "webm"
        put("video", i, c.caption, fmt, video_bytes(c.frames, fmt))
    for i in range(per_modality):
        s = generate.sound(rng)
        fmt = "wav" if i % 2 == 0 else "flac"
        put("audio", i, s.caption, fmt, audio_bytes(s.samples, fmt))
    with files.open(out / "captions.jsonl") as f:
        for item in items:
            f.write((json.dumps({"path": os.path.basename(item.path), "modality": item.modality, "caption": item.caption}) + "\n").encode())
    return items
