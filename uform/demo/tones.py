"""Generated recordings: tones, chords, noise and sweeps, plain float64 arithmetic rounded to
16-bit samples at ``SAMPLE_RATE``, drawn from the :class:`numpy.random.Generator` given alone."""

from __future__ import annotations

import numpy as np

from .spaces import AUDIO_SECONDS, PITCHES, RHYTHMS, SAMPLE_RATE, SOUNDS, SWEEPS, Sound, audio_caption, audio_captions, parse_audio

__all__ = ["samples_float", "sound"]


def _envelope(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """1 throughout for steady; else ``rate`` pulses a second, each on for about 45 % of its period."""
    t = np.arange(n) / SAMPLE_RATE
    if rate == 0:
        env = np.ones(n)
    else:
        period = 1.0 / (rate * float(rng.uniform(0.9, 1.1)))
        phase = (t + float(rng.uniform(0, period))) % period
        env = (phase < 0.45 * period).astype(np.float64)
    ramp = int(0.004 * SAMPLE_RATE)  # 4 ms fades, no clicks
    kernel = np.ones(ramp) / ramp
    return np.convolve(env, kernel, mode="same")


def sound(rng: np.random.Generator, *, kind: str | None = None, pitch: str | None = None, rhythm: str | None = None) -> Sound:
    """One second of audio at ``SAMPLE_RATE``; unspecified attributes are drawn (captions uniformly)."""
    if kind is None and pitch is None and rhythm is None:
        caption = str(rng.choice(audio_captions()))
        kind, pitch, rhythm = parse_audio(caption)
    kind = kind if kind is not None else str(rng.choice(SOUNDS))
    if kind == "sweep":
        pitch = pitch if pitch in SWEEPS else str(rng.choice(SWEEPS))
        rhythm = ""
    elif kind == "noise":
        pitch, rhythm = "", rhythm if rhythm is not None else str(rng.choice(list(RHYTHMS)))
    else:
        pitch = pitch if pitch is not None else str(rng.choice(list(PITCHES)))
        rhythm = rhythm if rhythm is not None else str(rng.choice(list(RHYTHMS)))
    n = int(AUDIO_SECONDS * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    if kind == "noise":
        x = rng.standard_normal(n) * 0.3
    elif kind == "sweep":
        f0, f1 = float(rng.uniform(180, 300)), float(rng.uniform(1200, 2000))
        if pitch == "falling":
            f0, f1 = f1, f0
        freq = f0 * (f1 / f0) ** (t / AUDIO_SECONDS)  # exponential sweep
        x = np.sin(2 * np.pi * np.cumsum(freq) / SAMPLE_RATE + float(rng.uniform(0, 2 * np.pi)))
    else:
        lo, hi = PITCHES[pitch]
        f = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        ratios = (1.0, 1.25992, 1.49831) if kind == "chord" else (1.0,)  # a major triad: root, third, fifth
        x = np.mean([np.sin(2 * np.pi * f * q * t + float(rng.uniform(0, 2 * np.pi))) for q in ratios], axis=0)
    if kind != "sweep":
        x = x * _envelope(rng, n, RHYTHMS[rhythm])
    x = x * float(rng.uniform(0.3, 0.8)) + rng.standard_normal(n) * float(rng.uniform(0.0, 0.01))
    samples = np.clip(np.rint(x * 32767), -32768, 32767).astype(np.int16)
    return Sound(samples, audio_caption(kind, pitch, rhythm), kind, pitch, rhythm)



def samples_float(s: Sound) -> np.ndarray:
    """The recording as the runtime reads a 16-bit file: ``s16 / 32768``, float32."""
    return (s.samples.astype(np.float32) / np.float32(32768)).astype(np.float32)
