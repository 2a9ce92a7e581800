"""The recipe of the default model: procedural paired data, contrastive towers, a byte decoder.

Every tower is the PyTorch reference (:mod:`uform.exporters.reference`) of the runtime's
graphs, so trained weights mean the same in both. Inputs are prepared exactly as the
runtime prepares them: pictures go through file bytes and the image plugin's own decode
(:func:`uform.plugins.media.image.decode`), clips through MP4/WebM bytes and the video plugin's
own sampling (:func:`uform.plugins.media.video.sample`), recordings are 16-bit samples read as
``s16 / 32768`` at the tower's rate (what the runtime reads from a WAV or FLAC at 16 kHz:
no resampling, the window is exactly the one-second recording).

Losses, summed each step: for images, clips and recordings a CLIP-style contrastive loss
with the caption text as the anchor (the distinct captions of a batch are the classes: the
media → text direction is a cross-entropy over them, the text → media direction a
cross-entropy whose target spreads evenly over the batch's items carrying that caption),
each with its own learnt logit scale; for the byte decoder, the cross-entropy of the answer
byte after each question. AdamW, linear warm-up then cosine decay. Afterwards the
checkpoint is written in BF16. A second phase (:func:`~uform.training.decoder.train_decoder`) trains the byte decoder
alone from that checkpoint on more varied questions, keeping every other tensor byte for
byte; it also runs alone from a given checkpoint (``phase="decoder"``, ``--phase decoder
--from CHECKPOINT``). Last, the choice temperatures are fitted per question group through
the runtime (:func:`uform.calibrate.calibrate`, labels smoothed).

This module runs the stages in order (:func:`train`); each stage, and what they share, has a
module of its own: :mod:`~uform.training.settings` (what a run does and did),
:mod:`~uform.training.inputs` (the data), :mod:`~uform.training.losses` (the towers' losses and
targets), :mod:`~uform.training.questions` (the byte decoder's questions and losses),
:mod:`~uform.training.steps` (initialisation, schedule, optimiser step, determinism, saving),
:mod:`~uform.training.towers` (the first phase), :mod:`~uform.training.alone` (one of its towers
alone), :mod:`~uform.training.decoder` (the decoder's phase), :mod:`~uform.training.reading` (its
reading stage) and :mod:`~uform.training.calibration` (temperatures and evaluation).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from safetensors import safe_open

from uform.calibrate import write_temperatures
from uform.core import files
from uform.core.config import ModelConfig

from .alone import train_alone
from .calibration import calibrate, evaluate_all
from .decoder import train_decoder
from .reading import train_reading
from .settings import ALONE, PHASES, Result, Settings
from .steps import deterministic
from .towers import train_towers


def train(settings: Settings, log: Callable[[str], None] = print) -> Result:
    """Train, save, calibrate and (``settings.evaluate``) evaluate; reproducible from the seed.

    Two phases. The towers' (:func:`~uform.training.towers.train_towers`; ``phase="all"``): every tower learns on its
    own against fixed targets (:func:`~uform.training.losses.prototypes`), the media towers mapping each item near its
    meaning's prototype, the text tower each phrasing there, and the byte decoder the
    questions; their losses share a step but no parameters. Its weights are written BF16. The
    decoder's (:func:`~uform.training.decoder.train_decoder`, ``decoder_steps`` > 0): the byte decoder alone, from that
    BF16 checkpoint, on more and more varied questions; every other tensor is kept byte for
    byte; then its reading stage (:func:`uform.training.reading.train_reading`,
    ``reading_steps`` > 0), every lettered list in a random order. With ``phase="decoder"``
    only the second phase runs, from the checkpoint ``start`` (whose towers are then the first
    phase's output: the shipped checkpoint's are); with ``phase="reading"`` only the reading
    stage, from ``start`` (a checkpoint after the decoder phase). Then the choice temperatures
    are fitted (:func:`~uform.training.calibration.calibrate`). With ``phase="clips"``, ``"pictures"`` or ``"sounds"`` the
    first phase's clip, picture or sound tower alone is trained into ``start``, which keeps its
    temperatures (:mod:`uform.training.alone`); with ``phase="questions"`` the first phase's
    decoder alone (the decoder that phase gives, bit for bit), then the temperatures are fitted."""
    if settings.phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(map(repr, PHASES))}, got {settings.phase!r}")
    if settings.phase != "all" and not settings.start:
        raise ValueError(f"the {settings.phase} phase starts from a checkpoint: give Settings.start (--from CHECKPOINT)")
    started = time.perf_counter()
    out = Path(settings.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_name(out.name + ".uncalibrated")
    if settings.phase in ALONE and settings.phase != "questions":  # a media tower: the checkpoint keeps its temperatures
        return finish(train_alone(settings, log, started), out, settings, log, started)
    try:
        if settings.phase == "questions":  # the first phase's decoder alone, deterministic as there, then calibrated
            with deterministic():
                result = train_alone(replace(settings, out=str(raw)), log, started)
            result.out = str(out)
            result.temperatures = calibrate(raw, out, settings, log)
            return finish(result, out, settings, log, started)
        if settings.phase == "all":
            steps, losses = train_towers(settings, raw, log, started)
            result = Result(str(out), steps, 0.0, losses[0], losses[-1], losses)
            source = raw
            if settings.clip_stage:
                clip_stage(raw, settings, log, result)
        else:
            result, source = Result(str(out), 0, 0.0, float("nan"), float("nan"), []), Path(str(settings.start))
        trained = False
        if settings.decoder_steps > 0 and settings.phase != "reading":
            train_decoder(source, raw, settings, log, result)
            source, trained = raw, True
        if settings.reading_steps > 0:
            train_reading(source, raw, settings, log, result)
            source, trained = raw, True
        if not result.losses and trained:
            stage = result.decoder_losses or result.reading_losses
            result.first_loss, result.last_loss = stage[0], stage[-1]
        if not trained and settings.phase != "all":  # recalibration alone: the same tensors, the temperatures fitted afresh
            with safe_open(str(source), framework="np") as f:
                groups = len(ModelConfig.from_metadata(f.metadata() or {}).choice_temperatures)
            write_temperatures(source, [1.0] * groups, raw)
        source = raw
        result.temperatures = calibrate(source, out, settings, log)
    finally:
        raw.unlink(missing_ok=True)
    return finish(result, out, settings, log, started)


def clip_stage(raw: Path, settings: Settings, log: Callable[[str], None], result: Result) -> None:
    """The clip stage (``settings.clip_stage``): the clip tower of the first phase's checkpoint
    ``raw`` trained alone from its picture tower (:func:`uform.training.alone.train_alone` with
    ``clips_from_pictures``: the first phase's clip steps, schedule, data and losses), written
    back into ``raw``, every other tensor byte for byte. Deterministic algorithms, as the phases."""
    started = time.perf_counter()
    staged = raw.with_name(raw.name + ".clips")
    try:
        with deterministic():
            done = train_alone(replace(settings, phase="clips", start=str(raw), out=str(staged), variant=None, clips_from_pictures=True),
                               log, started)  # fmt: skip
        files.move(staged, raw)  # synced, renamed
    finally:
        staged.unlink(missing_ok=True)
    result.clip_steps, result.clip_seconds = done.steps, time.perf_counter() - started
    log(f"clip stage: {done.steps} steps in {result.clip_seconds:.0f} s")


def finish(result: Result, out: Path, settings: Settings, log: Callable[[str], None], started: float) -> Result:
    """A run's seconds and log line, and (``settings.evaluate``) both suites' figures."""
    result.seconds = time.perf_counter() - started
    media = settings.phase in ALONE and settings.phase != "questions"  # a media tower keeps the temperatures
    done = "trained and saved" if media else "trained, saved and calibrated"
    log(f"{done} in {result.seconds:.0f} s: {out} ({out.stat().st_size} bytes)")
    if settings.evaluate:
        result.evaluations = evaluate_all(out, settings.seed, log)
    return result
