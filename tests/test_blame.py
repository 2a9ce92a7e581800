"""Whose fault a non-finite output is: the checkpoint's (weights that overflow float32 arithmetic)
or the caller's (an input outside the range the tower documents), for the media towers."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import media
import media_audio
import ml_dtypes
import numpy as np
import pytest

import uform
from ckpt import make_checkpoint
from uform.core import safetensors

R = 16000  # the tiny preset's audio rate
BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)  # 3.3895314e38: finite, loads at every quantization


def _overflowing(tmp_path: Path, tower: str) -> Path:
    """A tiny checkpoint whose ``tower``'s first MLP holds only ±BF16's largest value (random signs:
    the products of a normalised activation do not cancel): any input overflows it."""
    source = make_checkpoint(tmp_path / "source.safetensors", "tiny", 0, ["image", "video", "audio"])
    container = safetensors.parse(memoryview(source.read_bytes()))
    tensors = {name: container.array(name) for name in container.entries}
    name = f"{tower}.blocks.0.mlp.fc1.weight"
    signs = np.where(np.random.default_rng(1).random(tensors[name].shape) < 0.5, -1.0, 1.0)
    tensors[name] = (BF16_MAX * signs).astype(np.float32)
    path = tmp_path / f"{tower}.safetensors"
    safetensors.write(path, tensors, {"uform": json.dumps(json.loads(container.metadata["uform"]) | {"format_version": 2})})
    return path


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def _sine(amplitude: float) -> np.ndarray:
    return (amplitude * np.sin(np.arange(R, dtype=np.float64) / 7)).astype(np.float32)


def _calls(tmp_path: Path) -> dict[str, list[tuple[str, str, Callable[[uform.Model], object]]]]:
    wav = media_audio.write(tmp_path / "a.wav", _sine(0.5)[None, :], R, "pcm_s16le", "wav")
    clip = media.clip()
    pixels = "pixels (uint8, 0 to 255)"
    samples = "samples within [-1, 1], the range the tower documents"
    return {
        "image": [
            ("image_encode", pixels, lambda m: m.image_encode([_png()], uform.Arena())),
            ("image_encode_pixels", pixels, lambda m: m.image_encode_pixels([np.full((40, 40, 3), 200, np.uint8)], uform.Arena())),
        ],
        "video": [("video_encode", pixels, lambda m: m.video_encode([clip], uform.Arena()))],
        "audio": [
            ("audio_encode", samples, lambda m: m.audio_encode([wav], uform.Arena())),
            ("audio_encode_samples", samples, lambda m: m.audio_encode_samples([_sine(1.0)], R, uform.Arena())),
        ],
    }


@pytest.mark.parametrize("tower", ["image", "video", "audio"])
def test_a_media_towers_overflowing_weight_is_blamed_on_the_checkpoint_not_the_input(tmp_path: Path, tower: str) -> None:
    # Before: image and video said 'its input is token ids' (their uint8 pixels passed as integers);
    # audio raised InputError 'item 0: the encoder's output for it is not finite ... its values
    # overflow', for a recording within [-1, 1], decoded from a file or given as samples.
    path = _overflowing(tmp_path, tower)
    for verb, inputs, call in _calls(tmp_path)[tower]:
        message = (
            f"the '{tower}' tower's outputs for item 0 are not finite (NaN or infinity) and its input is {inputs}, which cannot "
            "overflow: the checkpoint's weights overflow float32 arithmetic; nothing was written (use a checkpoint whose weights are in range)"
        )
        for quantization in ("e4m3", "f32"):
            with uform.Model.load_ram(path, quantization=quantization) as model:
                with pytest.raises(uform.CheckpointError, match=f"^{re.escape(message)}$"):
                    call(model)


def test_samples_outside_the_documented_range_are_blamed_on_the_input_naming_the_range(tmp_path: Path) -> None:
    # Beyond [-1, 1] the input may be the cause, whatever the weights: the caller's item is named.
    path = _overflowing(tmp_path, "audio")
    with uform.Model.load_ram(path, quantization="f32") as model:
        with pytest.raises(uform.InputError) as info:
            model.audio_encode_samples([np.full(R, -3.0, np.float32)], R, uform.Arena())
    assert str(info.value).startswith(
        "item 0: the encoder's output for it is not finite (NaN or infinity): its values overflow float32 arithmetic "
        "(they reach -3, outside [-1, 1], the range the tower documents); nothing was written"
    )


def test_a_nan_near_the_end_of_a_resampled_window_is_refused_before_any_item_is_resampled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At 44.1 kHz the up-front check read the first 43,923 samples ((16000 - 64) x 44100 // 16000):
    # a NaN at 44,099, the last sample whose place lies in the 16,000-sample window, was refused
    # only by the resampling of its window, after the items before it were resampled and encoded.
    from uform.plugins import audio

    resampled: list[int] = []
    real = audio.resample
    monkeypatch.setattr(audio, "resample", lambda i, *a: resampled.append(i) or real(i, *a))
    ok = np.full(2 * 44100, 0.1, np.float32)
    late = ok.copy()
    late[44099] = np.nan
    with uform.Model.load_ram(make_checkpoint(tmp_path / "a.safetensors", "tiny", 0, ["audio"])) as model:
        with pytest.raises(uform.InputError, match=r"^item 2: holds NaN or infinite samples$"):
            model.audio_encode_samples([ok, ok, late], 44100, uform.Arena())
        assert resampled == []
        late[44099], late[44300] = 0.1, np.nan  # past the window and its filter's reach: never read, as before
        assert np.isfinite(np.array(model.audio_encode_samples([late], 44100, uform.Arena()).embeddings)).all()
