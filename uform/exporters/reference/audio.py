"""PyTorch reference of the audio tower (docs/checkpoint.md, "Audio tower").

The log-mel front end is written independently of the ONNX graph: ``torch.stft`` with a
periodic Hann window, and the HTK mel filters computed in float64 from the formula.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from uform.core.config import Geometry, ModelConfig

from .blocks import Stack, normalize, with_class_token

LOG_FLOOR = 1e-6


def hz_to_mel(f: torch.Tensor) -> torch.Tensor:
    return 2595.0 * torch.log10(1.0 + f / 700.0)


def mel_to_hz(m: torch.Tensor) -> torch.Tensor:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


def mel_filters(sample_rate: int, n_fft: int, n_mels: int) -> torch.Tensor:
    """Triangular HTK filters, float64 [n_mels, n_fft // 2 + 1], not area-normalised."""
    nyquist = torch.tensor(sample_rate / 2, dtype=torch.float64)
    z = mel_to_hz(torch.linspace(0.0, float(hz_to_mel(nyquist)), n_mels + 2, dtype=torch.float64))
    freqs = torch.arange(n_fft // 2 + 1, dtype=torch.float64) * sample_rate / n_fft
    rows = []
    for m in range(n_mels):
        rising = (freqs - z[m]) / (z[m + 1] - z[m])
        falling = (z[m + 2] - freqs) / (z[m + 2] - z[m + 1])
        rows.append(torch.clamp(torch.minimum(rising, falling), min=0.0))
    return torch.stack(rows)


class AudioTower(Stack):
    window: torch.Tensor
    filters: torch.Tensor

    def __init__(self, cfg: Mapping[str, Any], model: ModelConfig) -> None:
        g = Geometry.read(cfg, "towers.audio")
        super().__init__(g)
        self.sample_rate, self.samples = int(cfg["sample_rate"]), int(cfg["samples"])
        self.n_fft, self.hop, self.n_mels = int(cfg["n_fft"]), int(cfg["hop"]), int(cfg["n_mels"])
        self.patch_frames = int(cfg["patch_frames"])
        self.tokens = (1 + (self.samples - self.n_fft) // self.hop) // self.patch_frames
        self.patch = nn.Linear(self.n_mels * self.patch_frames, g.width)
        self.cls = nn.Parameter(torch.zeros(g.width))
        self.pos = nn.Embedding(1 + self.tokens, g.width)
        self.projection = nn.Linear(g.width, model.dimensions, bias=False)
        # derived from the config, never stored in the checkpoint
        self.register_buffer("window", torch.hann_window(self.n_fft, periodic=True, dtype=torch.float64), persistent=False)
        self.register_buffer("filters", mel_filters(self.sample_rate, self.n_fft, self.n_mels), persistent=False)

    def logmel(self, samples: torch.Tensor) -> torch.Tensor:
        """``ln(mel + 1e-6)`` of float samples [B, N]: [B, n_mels, frames]."""
        spectrum = torch.stft(
            samples, self.n_fft, self.hop, window=self.window.to(samples.dtype), center=False,
            onesided=True, return_complex=True,
        )  # fmt: skip
        power = spectrum.real**2 + spectrum.imag**2  # [B, bins, frames]
        return torch.log(self.filters.to(samples.dtype) @ power + LOG_FLOOR)

    def forward(self, samples: torch.Tensor) -> torch.Tensor:
        """``samples`` float [B, N] at the tower's rate → unit embeddings [B, D]."""
        b, q, t = samples.shape[0], self.patch_frames, self.tokens
        logmel = self.logmel(samples)[:, :, : t * q]  # trailing frames dropped
        # token j flattens logmel[:, jQ:(j+1)Q] in (mel, frame) order
        patches = logmel.reshape(b, self.n_mels, t, q).permute(0, 2, 1, 3).reshape(b, t, self.n_mels * q)
        patches = patches.to(self.patch.weight.dtype)  # float32 samples into a bf16 or fp16 reference
        x = self.patch(patches) + self.pos.weight[1 : t + 1]
        hidden = self.run(with_class_token(x, self.cls, self.pos.weight[0]))
        return normalize(self.projection(hidden[:, 0]))

    def encode(self, windows: torch.Tensor) -> torch.Tensor:
        """Embeddings [B, D] of windows already preprocessed to [B, N] float32 at the tower's rate."""
        if windows.shape[-1] != self.samples:
            raise ValueError(f"expected windows of {self.samples} samples, got {windows.shape[-1]}")
        return self.forward(windows)

