"""One tower of the first phase alone (``--phase clips``, ``--phase pictures``, ``--phase sounds``,
``--phase questions``): what a tower's recipe gives from seed to seed.

The media towers learn against fixed prototypes (:func:`~uform.training.losses.prototypes`,
drawn from the seed) and their gradients are clipped tower by tower, so the first phase's clip
tower or picture tower can be trained on its own: the same steps, schedule, curriculum, batch,
data and losses, without the other towers' work. A ``variant`` seeds the tower's
initialisation and the stream of its media, the ``seed`` the prototypes (it must be the seed the
checkpoint was trained with: the shipped one's is 0). The tower is written into the checkpoint
it starts from, every other tensor and the choice temperatures kept byte for byte (a media
tower plays no part in ``text_choose``), so the result reads at once with ``uform evaluate``.
The sound tower may take another front end (``Settings.audio_front``: its ``n_fft``, ``hop``
and ``n_mels``); the checkpoint's config then says so, and the tower's shapes follow it.
The byte decoder (``--phase questions``) shares nothing with the towers either: its first-phase
steps alone (every ``decoder_every``-th step of the schedule, the questions' own stream) give the
decoder the whole first phase gives, bit for bit, in a tenth of the time; its checkpoint is
written with the temperatures reset, and :func:`~uform.training.recipe.train` then fits them.
docs/notes/training-history.md has what its draws read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from uform.core.config import ModelConfig
from uform.exporters.reference import ReferenceModel
from uform.exporters.reference.decoder import DecoderTower
from uform.exporters.reference.video import VideoTower

from .inputs import Inputs
from .losses import clip_losses, contrastive, prototypes
from .questions import decoder_loss, packed_decoder_step
from .settings import ALONE, FRONT, Result, Settings, decoder_draw, default_config
from .steps import class_tokens_only, cosine, initialise, neutral, optimise, save


def pictures_into_clips(model: ReferenceModel, tower: nn.Module) -> list[str]:
    """Every tensor of ``model``'s picture tower that the clip ``tower`` has by the same name and
    shape (the patches' projection, class token, positions, blocks, final norm and projection into
    the shared space: a clip's colour and shape have the prototypes a picture's have) copied into
    ``tower``; the frames' embedding keeps its fresh initialisation. Answers the names taken."""
    source = model.towers["image"].state_dict()
    mine = tower.state_dict()
    taken = [key for key, value in source.items() if key in mine and mine[key].shape == value.shape]
    tower.load_state_dict({**mine, **{key: source[key].clone() for key in taken}})
    return taken


def in_recipe_order(config: ModelConfig) -> ModelConfig:
    """``config`` with its towers in the order the recipe's configuration lists them (text,
    image, video, audio, decoder; any other after), the order the first phase builds and
    initialises them in."""
    order = list(default_config().towers)
    towers = config.raw["towers"]
    ranked = sorted(towers, key=lambda name: order.index(name) if name in order else len(order))
    return ModelConfig.from_dict({**config.raw, "towers": {name: towers[name] for name in ranked}})


def with_audio_front(config: ModelConfig, front: dict[str, int]) -> ModelConfig:
    """``config`` with the audio tower's ``front`` (a subset of :data:`FRONT`) in place of its own."""
    unknown = sorted(set(front) - set(FRONT))
    if unknown:
        raise ValueError(f"audio_front sets {', '.join(FRONT)}, not {', '.join(unknown)}")
    raw = {**config.raw, "towers": {**config.raw["towers"], "audio": {**config.raw["towers"]["audio"], **front}}}
    return ModelConfig.from_dict(raw)


def train_alone(settings: Settings, log: Callable[[str], None], started: float) -> Result:
    """``settings.steps`` steps of the tower of ``settings.phase`` (:data:`~uform.training.settings.ALONE`) alone, from
    a fresh initialisation (stream ``settings.variant``, else the seed), written with the rest
    of ``settings.start`` to ``settings.out``. Clips learn with the first phase's auxiliary
    losses; pictures come ``settings.image_factor × settings.batch`` a step, as there;
    recordings ``settings.batch`` a step (a share ``settings.canonical`` made afresh by the
    canonical renderer, the rest from a pool of varied ones, as in the first phase, whose
    sound tower steps every ``settings.audio_every`` steps); the decoder ``settings.decoder_batch``
    questions on every ``settings.decoder_every``-th step of the schedule, as there."""
    assert settings.start is not None
    name = ALONE[settings.phase]
    variant = settings.variant if settings.variant is not None else decoder_draw(settings) if name == "decoder" else settings.seed
    model = ReferenceModel.from_checkpoint(Path(settings.start))
    config = model.config
    if settings.audio_front:
        if name != "audio":
            raise ValueError("audio_front goes with the sounds phase")
        config = with_audio_front(config, settings.audio_front)
        log(f"the sound tower's front end: {', '.join(f'{k} {v}' for k, v in settings.audio_front.items())}")
    torch.manual_seed(variant)
    # the decoder as the first phase initialises it: its towers in the recipe's order (a checkpoint
    # lists them sorted, and the initialisation draws tower after tower)
    fresh = ReferenceModel(in_recipe_order(config) if name == "decoder" else config)
    initialise(fresh, variant)  # as the first phase initialises every tower
    class_tokens_only(fresh)
    tower = fresh.towers[name]
    if settings.clips_from_pictures and name == "video":
        taken = pictures_into_clips(model, tower)
        log(f"the clip tower starts from the checkpoint's picture tower: {len(taken)} tensors taken, the frames' embedding fresh")
    target = prototypes(config.dimensions, settings.seed).get(name, torch.zeros(0))  # the decoder has none
    scale = nn.Parameter(torch.tensor(float(np.log(10.0))))
    clipped = list(tower.parameters())
    if name == "video":
        assert isinstance(tower, VideoTower)
        where = nn.Linear(int(config.towers["video"]["width"]), 2 * int(config.towers["video"]["frames"]))
        clipped += list(where.parameters())
        inputs = Inputs(config, variant, settings.video_pool, log, canonical=settings.canonical, jumbled=settings.jumbled)

        def loss(canonical: float) -> torch.Tensor:
            data, labelled = inputs.videos(settings.batch, canonical)
            return torch.stack(list(clip_losses(tower, where, scale, target, data, labelled, settings.motion, settings.autocast).values())).sum()
    elif name == "audio":
        inputs = Inputs(config, variant, 0, log, audio_pool=settings.audio_pool, canonical=settings.canonical, jumbled=settings.jumbled,
                        partials=settings.voice_partials)  # fmt: skip

        def loss(canonical: float) -> torch.Tensor:  # the recordings' share from the canonical renderer is settings.canonical
            data, labelled = inputs.sounds(settings.batch)
            return contrastive(tower(torch.from_numpy(data)), target, torch.from_numpy(labelled), scale)
    elif name == "decoder":
        assert isinstance(tower, DecoderTower)
        inputs = Inputs(config, variant, 0, log, canonical=settings.canonical, jumbled=settings.jumbled)

        def loss(canonical: float) -> torch.Tensor:
            asked = inputs.questions(settings.decoder_batch)
            return packed_decoder_step(tower, asked, settings.decoder_row)[0] if settings.decoder_row else decoder_loss(tower, asked)[0]
    else:
        inputs = Inputs(config, variant, 0, log, image_pool=settings.image_pool, canonical=settings.canonical,
                        jumbled=settings.jumbled)  # fmt: skip

        def loss(canonical: float) -> torch.Tensor:
            data, labelled = inputs.images(settings.image_factor * settings.batch, canonical)
            return contrastive(tower(torch.from_numpy(data)), target, torch.from_numpy(labelled), scale)

    params = clipped + ([] if name == "decoder" else [scale])
    optimiser = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.05},
                                   {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                                  lr=settings.lr, betas=(0.9, 0.98))  # fmt: skip
    every = settings.decoder_every if name == "decoder" else 1  # the first phase steps the decoder every this many steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: cosine(step * every, settings.warmup, settings.steps))
    losses: list[float] = []
    window: list[float] = []
    tower.train()
    step = 0
    steps = -(-settings.steps // every)
    for step in range(steps):
        if settings.minutes is not None and time.perf_counter() - started > 60 * settings.minutes:
            log(f"stopping after {settings.minutes} minutes at step {step}")
            break
        total = loss(1.0 if step * every < settings.curriculum * settings.steps else settings.canonical_vision)
        optimise(total, optimiser, scheduler, clipped)
        window.append(float(total.detach()))
        if (step + 1) % settings.log_every == 0 or step + 1 == steps:
            losses.append(float(np.mean(window)))
            window = []
            if (step + 1) % (8 * settings.log_every) == 0 or step + 1 == steps:
                log(f"{settings.phase} step {step + 1}/{steps}  loss {losses[-1]:.4f}  {time.perf_counter() - started:.0f} s")
    if window:
        losses.append(float(np.mean(window)))
    tower.eval()
    if settings.audio_front:
        model.towers[name] = tower  # shapes of its own front end (config says so)
    else:
        model.towers[name].load_state_dict(tower.state_dict())
    save(model, neutral(config) if name == "decoder" else config, settings.out)  # the decoder's temperatures are fitted afresh
    return Result(str(settings.out), step + 1, 0.0, losses[0], losses[-1], losses, tuple(config.choice_temperatures))
