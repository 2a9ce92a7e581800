"""The power spectrum both audio front ends compute in the graph: frames gathered from the
window, the periodic-Hann-windowed real DFT folded on the frame's symmetry (half the products
of the plain ``[n_fft, 2 bins]`` DFT matrix), ``|rfft|²``. The version-1 front end
(:mod:`uform.plugins.audio`) frames from the window's start; CLAP's
(:mod:`uform.plugins.melfront.clap`) centres its frames, reflecting the window's edges.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from uform.core.graph import GraphBuilder

MAX_FRAME_VALUES = 1 << 26  # frames x n_fft a config may ask for (the frames' Gather indices)


def dft_halves(n_fft: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The windowed real DFT folded on the frame's symmetry: ``(j, C, S)`` with
    ``j = 1 … ⌊n_fft/2⌋`` and ``C``, ``S`` float64 [len(j), bins] such that for a frame ``x``

        Re = (x[j] + x[n_fft − j]) @ C,   Im = (x[j] − x[n_fft − j]) @ S

    (the periodic Hann window is symmetric, ``w[n] = w[n_fft − n]``, and ``w[0] = 0``; at
    ``j = n_fft/2`` the pair is one sample counted twice, so that row of ``C`` is halved).
    """
    bins = n_fft // 2 + 1
    j = np.arange(1, n_fft // 2 + 1)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * j / n_fft)
    angle = 2 * np.pi * ((j[:, None] * np.arange(bins)[None, :]) % n_fft) / n_fft
    once = np.where(2 * j == n_fft, 0.5, 1.0)
    return j, np.cos(angle) * (window * once)[:, None], np.sin(angle) * window[:, None]


def power(b: GraphBuilder, samples: str, n_fft: int, place: Callable[[np.ndarray], np.ndarray], bins: np.ndarray | None = None) -> str:
    """``|rfft(frame · w)|²`` of every frame of ``samples`` [B, N]: float32 [B, frames, bins],
    or of the ``bins`` given alone (indices: a mel bank's filters are zero beyond its edges).
    ``place(offsets)`` answers the window indices of each frame's samples ``offsets`` (int64
    [frames, len(offsets)])."""
    j, cos, sin = dft_halves(n_fft)
    if bins is not None:
        cos, sin = cos[:, bins], sin[:, bins]
    head = b.op("Gather", samples, b.const(place(j), "frame_head", np.int64), axis=1)  # x[j], [B, frames, n_fft/2]
    tail = b.op("Gather", samples, b.const(place(n_fft - j), "frame_tail", np.int64), axis=1)  # x[n_fft − j]
    real = b.op("MatMul", b.op("Add", head, tail), b.const(cos, "dft_cos", np.float32))  # [B, frames, bins]
    imag = b.op("MatMul", b.op("Sub", head, tail), b.const(sin, "dft_sin", np.float32))
    return b.op("Add", b.op("Mul", real, real), b.op("Mul", imag, imag))  # type: ignore[no-any-return]


def ln(b: GraphBuilder, x: str) -> str:
    """``ln(x)`` element by element, each element's bits the same whatever the batch it is in:
    ONNX Runtime's ``Log`` runs its vector code over each thread's block and other code
    over the block's last elements, so where blocks fall (the batch's size, the thread count) moved
    an element's last bit (4.8e-7 on a CLAP image at 3 threads). ``ReduceLogSum`` over a unit axis
    takes the scalar logarithm of each element alone."""
    axis = b.ints([-1])
    return b.op("ReduceLogSum", b.op("Unsqueeze", x, axis), axis, keepdims=0)  # type: ignore[no-any-return]
