"""The small model the training tests train (tiny_config: every tower 32 wide, one block) and
a checkpoint's tensors as bytes (tensors), to compare what two runs wrote."""

from __future__ import annotations

from pathlib import Path

from uform.core.config import make_config


STACK = {"width": 32, "depth": 1, "heads": 2, "mlp_width": 64}
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def tiny_config():  # type: ignore[no-untyped-def]
    return make_config(16, 128, {
        "text": {**STACK, "token_width": 0},
        "image": {**STACK, "image_size": 32, "patch_size": 8, "mean": MEAN, "std": STD},
        "video": {**STACK, "frames": 4, "image_size": 32, "patch_size": 8, "mean": MEAN, "std": STD},
        "audio": {**STACK, "sample_rate": 16000, "samples": 16000, "n_fft": 400, "hop": 160, "n_mels": 16, "patch_frames": 7},
        "decoder": dict(STACK),
    }, choice_temperatures=(1.0, 1.0, 1.0))  # fmt: skip


def tensors(path: Path) -> dict[str, bytes]:
    from uform.core.checkpoint import CheckpointFile

    with CheckpointFile(path) as f:
        return {name: f.array(name).tobytes() for name in f.entries}
