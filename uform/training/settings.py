"""What a run of the recipe does (:class:`Settings`), what it did (:class:`Result`), and the
default model's geometry (:func:`default_config`); the phases' names.

Every other module of :mod:`uform.training` reads these; this one reads none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from uform.core.config import ModelConfig, make_config
from uform.demo import generate as g
from uform.demo.variety.recordings import PARTIALS

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
STACK = {"width": 128, "depth": 3, "heads": 4, "mlp_width": 256}
DIMENSIONS, CONTEXT = 64, 128
PHASES = ("all", "decoder", "reading", "clips", "pictures", "sounds", "questions")  # Settings.phase, --phase
# the phases that train one tower of the first phase alone (uform.training.alone), and its tower
ALONE = {"clips": "video", "pictures": "image", "sounds": "audio", "questions": "decoder"}
FRONT = ("n_fft", "hop", "n_mels")  # what Settings.audio_front (--audio-front) may set of the sound tower's config
MODALITIES = ("image", "video", "audio")  # the media towers, each learning against its meanings' prototypes


def decoder_draw(settings: Settings) -> int:
    """The seed of the byte decoder's draw: ``settings.decoder_seed``, else ``settings.seed``."""
    return settings.seed if settings.decoder_seed is None else settings.decoder_seed


def default_config() -> ModelConfig:
    """The default model's geometry: every tower 128 wide, 3 blocks, 4 heads (docs/training.md)."""
    return make_config(
        DIMENSIONS,
        CONTEXT,
        {
            "text": {**STACK, "token_width": 0},
            "image": {**STACK, "image_size": 32, "patch_size": 8, "mean": MEAN, "std": STD},
            "video": {**STACK, "frames": 4, "image_size": 32, "patch_size": 8, "mean": MEAN, "std": STD},
            "audio": {**STACK, "sample_rate": g.SAMPLE_RATE, "samples": int(g.SAMPLE_RATE * g.AUDIO_SECONDS), "n_fft": 400,
                      "hop": 160, "n_mels": 32, "patch_frames": 7},  # fmt: skip
            "decoder": dict(STACK),
        },
        choice_temperatures=(1.0, 1.0, 1.0),
    )


@dataclass
class Settings:
    """What a run does; the defaults are the recipe's (docs/training.md)."""

    out: str
    seed: int = 0
    steps: int = 4400
    minutes: float | None = None  # stop early after this long (the schedule still assumes ``steps``)
    batch: int = 64  # pictures and clips a step (recordings on the steps that have them)
    image_factor: int = 2  # pictures a step: this many times ``batch`` (the seventh run's 2; 1 the fourth run's, docs/notes/training-history.md)
    decoder_batch: int = 48  # questions a decoder step
    text_groups: int = 4  # a text step encodes its captions in this many groups of like length (the same embeddings as 1, less padding)
    decoder_row: int = 128  # > 0: the decoder's questions packed into rows of this many bytes in both phases (the same losses, less
    # padding); 0: the first phase's padded (decoder_loss), the decoder phase's rows of 256 bytes, as the fourth run's
    lr: float = 2e-3
    warmup: int = 100
    image_pool: int = 24000  # pictures decoded once through the runtime (canonical and varied), drawn from every step
    video_pool: int = 12000  # clips decoded once through the runtime, drawn from every step
    audio_pool: int = 5000  # varied recordings made once (through the runtime's resampler), drawn from every step
    voice_partials: int = PARTIALS  # the most partials a varied recording's voice has (variety.recordings.varied_voice: 12 as before; more
    # draws each voice's count, bright and dull alike)
    canonical: float = 0.3  # share of recordings from the canonical renderer (the own suite's), the rest varied
    canonical_vision: float = 0.2  # share of pictures and clips from the canonical renderers after the curriculum (the fourth run's 0.4)
    curriculum: float = 0.25  # share of the steps, first, whose pictures and clips are all canonical
    audio_every: int = 2  # the audio tower's steps: every this many
    text_every: int = 3  # the text tower's steps (every meaning in one phrasing against its prototype)
    decoder_every: int = 2  # the byte decoder's steps
    jumbled: float = 0.35  # share of non-canonical captions that are jumbles (variety.captions.jumbles)
    motion: float = 1.0  # weight of the video tower's auxiliary losses: where the shape is in each frame, and looking at it
    calibration_examples: int = 6000  # about 220 of them how-many questions: with fewer, all answered right, that group sat at the floor
    log_every: int = 25
    evaluate: bool = True
    config: ModelConfig = field(default_factory=default_config)
    # the second phase: the byte decoder alone, from the first phase's BF16 checkpoint (docs/training.md)
    phase: str = "all"  # "all": the towers' phase, then the decoder's; "decoder": the decoder's alone (and its reading stage),
    # from ``start``; "reading": the decoder's reading stage alone, from ``start``;
    # "clips", "pictures", "sounds" or "questions": the first phase's clip, picture or sound tower or its decoder alone, into
    # ``start`` (uform.training.alone)
    start: str | None = None  # the checkpoint every phase but "all" starts from
    clips_from_pictures: bool = False  # the clips phase: the clip tower starts from the checkpoint's picture tower (uform.training.alone)
    clip_stage: bool = False  # the whole recipe: the first phase trains no clip tower; the clip stage then trains it alone from
    # the first phase's picture tower (the clips phase with clips_from_pictures), before the decoder's phase
    variant: int | None = None  # the phases of one tower: seeds the tower's initialisation and data (default: ``seed``, which seeds the prototypes)
    decoder_seed: int | None = None  # the byte decoder's draw: its initialisation and every question it trains on, in every
    # phase (default: ``seed``); the towers, the held-out questions and calibration keep ``seed`` (docs/training.md)
    audio_front: dict[str, int] | None = None  # the sounds phase: the audio tower's n_fft, hop and n_mels in place of the checkpoint's
    decoder_steps: int = 2000  # 0 skips the phase (the recipe as it was before it)
    decoder_phase_batch: int = 64  # questions a step of the decoder phase
    decoder_lr: float = 1e-3
    decoder_warmup: int = 100
    # the decoder's reading stage, after its phase (uform.training.reading): every lettered list in a random order
    reading_steps: int = 2000  # 0 skips it (the seventh run's recipe)
    reading_letters: float = 0.4  # share of its questions that are lettered
    smoothing: bool = True  # calibration labels smoothed by 1/(n+2) a group (uform.calibrate.fit_temperatures): no group at the floor
    autocast: bool = False  # the first phase's and the clip stage's tower forwards in BF16 autocast, the losses in float32 (towers_in_bf16)


@dataclass
class Result:
    """What a run did: losses (first and last logged means), steps, seconds, calibration, evaluations."""

    out: str
    steps: int
    seconds: float
    first_loss: float
    last_loss: float
    losses: list[float]
    temperatures: tuple[float, ...] = ()
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)
    decoder_steps: int = 0  # steps of the decoder phase
    decoder_seconds: float = 0.0
    decoder_losses: list[float] = field(default_factory=list)  # the decoder phase's logged answer losses
    reading_steps: int = 0  # steps of the decoder's reading stage
    reading_seconds: float = 0.0
    reading_losses: list[float] = field(default_factory=list)
    clip_steps: int = 0  # steps of the clip stage (Settings.clip_stage)
    clip_seconds: float = 0.0
    heldout: dict[str, float] = field(default_factory=dict)  # the decoder's accuracy on held-out questions (stream 6) after its last stage
