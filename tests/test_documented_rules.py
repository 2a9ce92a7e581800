"""Details docs/checkpoint.md and docs/media-audio.md state for a second implementation, checked
against what the code does: I8 scales per row, token vectors after ``text.ln_final``, the
audio resampler's tail and output length, libswscale's colour matrix and range."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import uform
from uform.plugins.media import audio as recordings


def test_i8_has_one_scale_per_embedding_row_and_per_token_vector(tiny_model: uform.Model) -> None:
    texts = ["a cat", "", "a dog on a mat"]
    both = uform.Outputs.EMBEDDINGS | uform.Outputs.TOKENS
    exact = tiny_model.text_encode(texts, uform.Arena(), outputs=both)
    quant = tiny_model.text_encode(texts, uform.Arena(), outputs=both, outputs_scalar=uform.Scalar.I8)
    assert exact.tokens is not None and quant.tokens is not None and quant.tokens.scales is not None
    assert quant.embedding_scales is not None and quant.embedding_scales.shape == (3,)
    for rows, q, scales in [
        (np.array(exact.embeddings), np.array(quant.embeddings), np.array(quant.embedding_scales)),
        (np.array(exact.tokens.values), np.array(quant.tokens.values), np.array(quant.tokens.scales)),
    ]:
        assert scales.shape == (len(rows),)  # 3 items; 5 + 0 + 14 token vectors
        peak = np.abs(rows).max(axis=1)
        np.testing.assert_array_equal(scales, np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32))
        np.testing.assert_array_equal(q, np.clip(np.rint(rows / scales[:, None]), -127, 127).astype(np.int8))
    assert len(quant.tokens.scales) == 19


def test_token_vectors_come_after_ln_final(tiny_text: object) -> None:
    torch = pytest.importorskip("torch")

    model = uform.Model.load_ram(tiny_text)  # type: ignore[arg-type]
    tokens = model.text_encode(["a cat"], uform.Arena(), outputs=uform.Outputs.TOKENS).tokens
    assert tokens is not None
    weights = {name: torch.from_numpy(np.asarray(w, np.float32)) for name, w in _weights(tiny_text).items()}
    ids = torch.tensor([list(b"a cat")])
    x = weights["text.embed.weight"][ids] + weights["text.pos.weight"][1:6]
    x = torch.cat([(weights["text.cls"] + weights["text.pos.weight"][0])[None, None], x], 1)
    h = _stack(x, weights, depth=2, heads=2)  # the tiny preset
    normed = torch.nn.functional.layer_norm(h, (h.shape[-1],), weights["text.ln_final.weight"], weights["text.ln_final.bias"], 1e-5)
    errors = []
    for states in (normed, h):
        u = states[0, 1:] @ weights["text.token_head.weight"].T
        u = u / u.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        errors.append(float(np.abs(np.array(tokens.values) - u.numpy()).max()))
    assert errors[0] < 5e-3 < 0.05 < errors[1]  # after ln_final it agrees (to the backend's precision), before it does not


def _weights(path: object) -> dict[str, np.ndarray]:
    from uform.core import safetensors

    container = safetensors.parse(memoryview(Path(path).read_bytes()))  # type: ignore[arg-type]
    return {name: container.array(name).astype(np.float32) for name in container.entries}


def _stack(x, w, depth: int, heads: int):  # type: ignore[no-untyped-def]
    """docs/checkpoint.md "Blocks", literally, without the final LayerNorm."""
    import torch
    from torch.nn.functional import gelu, layer_norm

    width = x.shape[-1]
    for i in range(depth):
        p = f"text.blocks.{i}."
        h = layer_norm(x, (width,), w[p + "ln1.weight"], w[p + "ln1.bias"], 1e-5)
        q, k, v = (h @ w[p + "attn.qkv.weight"].T + w[p + "attn.qkv.bias"]).split(width, -1)
        split = [t.reshape(1, -1, heads, width // heads).transpose(1, 2) for t in (q, k, v)]
        a = torch.softmax(split[0] / (width // heads) ** 0.5 @ split[1].transpose(-1, -2), -1) @ split[2]
        x = x + a.transpose(1, 2).reshape(1, -1, width) @ w[p + "attn.out.weight"].T + w[p + "attn.out.bias"]
        h = layer_norm(x, (width,), w[p + "ln2.weight"], w[p + "ln2.bias"], 1e-5)
        x = x + gelu(h @ w[p + "mlp.fc1.weight"].T + w[p + "mlp.fc1.bias"]) @ w[p + "mlp.fc2.weight"].T + w[p + "mlp.fc2.bias"]
    return x


@pytest.mark.parametrize(("n", "rate"), [(1000, 44100), (17, 48000), (5, 8000), (44101, 44100), (999, 22050)])
def test_resampled_length_and_tail(n: int, rate: int, monkeypatch: pytest.MonkeyPatch) -> None:
    fed: list[int] = []
    real = recordings.Window._resample

    def spy(self: recordings.Window, x: np.ndarray, source_rate: int) -> list[np.ndarray]:
        fed.append(len(x))
        return real(self, x, source_rate)

    monkeypatch.setattr(recordings.Window, "_resample", spy)
    tone = np.sin(np.arange(n, dtype=np.float32) / 7).astype(np.float32)
    window = recordings.Window(16000, 10**6)
    window.add(tone, rate)
    got = window.finish()
    assert window.produced == (n * 16000 + rate // 2) // rate  # n R / rate rounded
    assert fed[-1] == 64 * (-(-rate // 16000) + 1)  # the zeros: 64 periods of ceil(rate / R) + 1 samples
    assert not got[window.produced :].any()


def test_video_colour_matrix_and_range_follow_the_frame_tags() -> None:
    av = pytest.importorskip("av")

    def rgb(colorspace: int | None, color_range: int | None) -> list[int]:
        frame = av.VideoFrame(16, 16, "yuv420p")
        for plane, value in zip(frame.planes, (100, 150, 90)):
            plane.update(np.full(plane.buffer_size, value, np.uint8).tobytes())
        if colorspace is not None:
            frame.colorspace = colorspace
        if color_range is not None:
            frame.color_range = color_range
        return [int(v) for v in frame.to_ndarray(format="rgb24")[0, 0]]  # what clips.py calls

    untagged = rgb(None, None)
    assert untagged == [36, 118, 141]  # the example docs/checkpoint.md gives (exact BT.601 limited: 37.2, 120.1, 142.2)
    assert untagged == rgb(5, 1) == rgb(6, 1)  # BT.601 (BT.470BG, SMPTE 170M), limited range
    assert rgb(1, 1) != untagged and rgb(5, 2) != untagged  # BT.709, and full range, are honoured
