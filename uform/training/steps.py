"""What every phase's steps share: a fresh model's initialisation, the class-token-only towers,
the schedule and one optimiser step, deterministic algorithms, BF16 autocast of the tower
forwards, and writing a checkpoint.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import ml_dtypes
import torch
from torch import nn

from uform.core import checkpoint as ckpt
from uform.core.config import ModelConfig
from uform.exporters.reference import ReferenceModel
from uform.exporters.reference.blocks import Stack


def towers_in_bf16(enabled: bool) -> AbstractContextManager[Any]:
    """The media and text towers' forward passes under BF16 autocast when ``enabled``
    (``Settings.autocast``): their products in BF16 with float32 sums; what they answer is cast
    back to float32 by the caller, so every loss head (logits, cross-entropies, the auxiliary
    losses) and the decoder run in float32."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else nullcontext()


@contextmanager
def deterministic() -> Iterator[None]:
    """``torch.use_deterministic_algorithms`` within the block, as it was after it: on 2 threads
    a decoder trained without it differed from run to run (an op's reduction order), in the
    first phase and in the decoder's own phase alike. Without the fill of every fresh tensor
    that deterministic mode adds by default (NaN, to catch a read of memory no op wrote): the
    steps write all they read, the same bytes come out, and a first-phase step costs 4 % less."""
    fill = torch.utils.deterministic  # its flag is a module property that the stubs do not declare
    before, filled = torch.are_deterministic_algorithms_enabled(), getattr(fill, "fill_uninitialized_memory")  # noqa: B009
    torch.use_deterministic_algorithms(True)
    setattr(fill, "fill_uninitialized_memory", False)  # noqa: B010
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)
        setattr(fill, "fill_uninitialized_memory", filled)  # noqa: B010


def class_tokens_only(model: ReferenceModel) -> None:
    """Every tower but the decoder runs its last block for its class token alone: training
    reads nothing else of them (the same losses and gradients, a quarter of the last block;
    a first-phase step 0.75 -> 0.68 s on 2 Zen 1 cores, docs/training.md)."""
    for name, tower in model.towers.items():
        if name != "decoder" and isinstance(tower, Stack):
            tower.class_token_only = True


def initialise(model: nn.Module, seed: int) -> None:
    """As ``uform new`` does: normal(0, 0.02) for every tensor, LayerNorm weights 1 and biases 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln" in name or "ln_final" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)


def cosine(step: int, warmup: int, steps: int) -> float:
    """The recipe's learning-rate factor: linear warm-up over ``warmup`` steps, then a cosine
    decay to 2 % at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    done = (step - warmup) / max(1, steps - warmup)
    return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))


def optimise(total: torch.Tensor, optimiser: torch.optim.Optimizer, scheduler: Any, clipped: list[nn.Parameter]) -> None:
    """One step of a single tower's phase: the gradients of ``total``, clipped at norm 1 over
    ``clipped``, then the optimiser's step and the schedule's."""
    optimiser.zero_grad(set_to_none=True)
    total.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(clipped, 1.0)
    optimiser.step()
    scheduler.step()


def save(model: ReferenceModel, config: ModelConfig, path: str | os.PathLike[str]) -> None:
    """The reference's weights as a uform checkpoint (BF16, names from the state dict)."""
    tensors = {
        name.removeprefix("towers."): value.detach().float().numpy().astype(ml_dtypes.bfloat16)
        for name, value in model.state_dict().items()
    }
    ckpt.save(path, config, tensors)


def neutral(config: ModelConfig) -> ModelConfig:
    """``config`` with every choice temperature 1.0, as an uncalibrated checkpoint carries them:
    calibration reads the logits back through ``text_choose`` at the checkpoint's temperatures,
    and at a low one (0.001, 0.02) the wrong choices' probabilities underflow and their logits are lost."""
    return ModelConfig.from_dict(dict(config.raw) | {"choice_temperatures": [1.0] * len(config.choice_temperatures)})
