"""Varied recordings: sine, square, sawtooth, triangle or additive voices, chords of several
kinds, white, pink, brown or band-limited noise, linear or exponential sweeps, gated, struck or
swelling pulses at jittered rates; made at 8-48 kHz and brought to the tower's rate by the
runtime's own resampler, -35 to -1 dBFS, silence before and after, a faint noise floor."""

from __future__ import annotations

import numpy as np

from .. import generate as g
from .captions import Meaning

RATES = (8000, 11025, 16000, 16000, 22050, 24000, 44100, 48000)
CHORDS = ((1.0, 1.26, 1.498), (1.0, 1.189, 1.498), (1.0, 1.335, 1.498), (1.0, 1.122, 1.498), (1.0, 1.498, 2.0),
          (1.0, 1.26, 1.498, 1.782), (1.0, 1.26, 1.498, 2.0))  # fmt: skip


PARTIALS = 12  # the most partials a harmonic voice has, as the recipe made its recordings until 2026-12-04


def varied_voice(rng: np.random.Generator, cycles: np.ndarray, top: float, rate: int, partials: int = PARTIALS) -> np.ndarray:
    """A periodic voice of ``cycles`` (phase in cycles): sine, or harmonics below Nyquist.

    A harmonic voice has at most ``partials`` partials. At :data:`PARTIALS` (12) every such voice
    has 12, or fewer where Nyquist comes first. With more, each draws how many it has, from 4 up
    to ``partials`` and to the band the tower hears (under 0.45 × the lower of ``rate`` and the
    tower's 16 kHz): bright and dull voices alike, so that a low tone's upper partials are no
    sign of a chord (12 alone taught that partials past the twelfth come from a chord's upper
    voices only: a low sawtooth of 15 or more was heard as a chord)."""
    kind = int(rng.choice([0, 0, 1, 2, 3, 4]))
    if kind == 0:
        return np.asarray(np.sin(2 * np.pi * cycles), np.float64)
    limit = max(1, int((rate * 0.45) // max(top, 1.0)))
    if partials != PARTIALS:
        heard = max(1, int((min(rate, g.SAMPLE_RATE) * 0.45) // max(top, 1.0)))
        most = min(limit, heard, partials)
        limit = int(rng.integers(min(4, most), most + 1))
    x = np.zeros_like(cycles)
    for k in range(1, min(limit, partials) + 1):
        if kind == 1 and k % 2:  # square
            x += np.sin(2 * np.pi * k * cycles) / k
        elif kind == 2:  # sawtooth
            x += np.sin(2 * np.pi * k * cycles) / k
        elif kind == 3 and k % 2:  # triangle
            x += np.sin(2 * np.pi * k * cycles) * (-1) ** (k // 2) / (k * k)
        elif kind == 4:  # random harmonic weights, decaying
            x += float(rng.uniform(0, 1)) * 0.7 ** (k - 1) * np.sin(2 * np.pi * k * cycles + float(rng.uniform(0, 6.28)))
    return np.asarray(x / (np.abs(x).max() + 1e-9), np.float64)


def _coloured_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    kind = int(rng.integers(0, 4))
    x = rng.standard_normal(n)
    if kind:
        spec = np.fft.rfft(x)
        f = np.maximum(np.fft.rfftfreq(n), 1.0 / n)
        if kind == 1:
            spec /= np.sqrt(f)  # pink
        elif kind == 2:
            spec /= f  # brown
        else:  # a band
            lo = float(rng.uniform(0.01, 0.15))
            spec *= (f > lo) & (f < lo * float(rng.uniform(2, 6)))
        x = np.fft.irfft(spec, n)
    return np.asarray(x / (np.abs(x).max() + 1e-9), np.float64)


def _pulses(rng: np.random.Generator, t: np.ndarray, rhythm: str) -> np.ndarray:
    if rhythm == "steady":
        return np.ones_like(t)
    rate = float(rng.uniform(1.4, 2.8) if rhythm == "slowly pulsing" else rng.uniform(4.5, 8.5))
    phase = (t * rate + float(rng.uniform(0, 1))) % 1.0
    kind = int(rng.integers(0, 3))
    if kind == 0:  # gated
        duty = float(rng.uniform(0.25, 0.7))
        env = (phase < duty).astype(np.float64)
        ramp = max(1, int(len(t) / (t[-1] + 1e-9) * 0.005))
        return np.convolve(env, np.ones(ramp) / ramp, mode="same")
    if kind == 1:  # struck
        return np.minimum(phase / 0.015, 1.0) * np.exp(-phase / float(rng.uniform(0.08, 0.3)))
    return np.asarray(np.sin(np.pi * phase) ** float(rng.uniform(1, 3)), np.float64)  # swelling


def sound(rng: np.random.Generator, window: int = g.SAMPLE_RATE, partials: int = PARTIALS) -> tuple[np.ndarray, Meaning]:
    """A varied recording as the tower's window (float32, ``window`` samples at the tower's rate),
    brought there by the runtime's resampler, and its meaning; its voices have at most
    ``partials`` partials (:func:`varied_voice`)."""
    from uform.plugins.media import audio as recordings

    caption = str(rng.choice(g.audio_captions()))
    kind, pitch, rhythm = g.parse_audio(caption)
    rate = int(rng.choice(RATES))
    lead = float(rng.uniform(0, 0.25)) if rng.random() < 0.6 else 0.0
    body = float(rng.uniform(0.6, 1.6))
    n = int(body * rate)
    t = np.arange(n) / rate
    if kind in ("tone", "chord"):
        lo, hi = g.PITCHES[pitch]
        root = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        ratios = (1.0,) if kind == "tone" else CHORDS[int(rng.integers(0, len(CHORDS)))]
        x = sum(varied_voice(rng, root * q * t + float(rng.uniform(0, 1)), root * q, rate, partials) for q in ratios) / len(ratios)
        x = x * _pulses(rng, t, rhythm)
    elif kind == "noise":
        x = _coloured_noise(rng, n) * _pulses(rng, t, rhythm)
    else:
        f0, f1 = float(rng.uniform(130, 450)), float(rng.uniform(1000, 3000))
        if pitch == "falling":
            f0, f1 = f1, f0
        freq = f0 + (f1 - f0) * t / body if rng.random() < 0.5 else f0 * (f1 / f0) ** (t / body)
        x = varied_voice(rng, np.cumsum(freq) / rate, max(f0, f1), rate, partials)
    fade = max(1, min(n // 5, int(rate * float(rng.uniform(0.003, 0.03)))))
    x[:fade] *= np.linspace(0, 1, fade)
    x[-fade:] *= np.linspace(1, 0, fade)
    level = 10 ** (float(rng.uniform(-35, -1)) / 20)
    x = x / (np.abs(x).max() + 1e-9) * level
    x = np.concatenate([np.zeros(int(lead * rate)), x, np.zeros(int(rate * float(rng.uniform(0, 0.3))))])
    if rng.random() < 0.4:
        x = x + _coloured_noise(rng, len(x)) * level * 10 ** (float(rng.uniform(-50, -25)) / 20)
    x16 = np.clip(np.rint(x * 32767), -32768, 32767) / 32768  # 16-bit, as files mostly are
    made = recordings.resample(0, x16.astype(np.float32), rate, g.SAMPLE_RATE, window).samples
    return np.asarray(made, np.float32), Meaning("audio", caption, (kind, pitch, rhythm))
