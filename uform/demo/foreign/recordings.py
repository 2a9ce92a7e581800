"""The foreign suite's recordings: square, sawtooth, triangle and additive timbres, its own
chords, pink and brown noise, linear sweeps and pulse shapes, at sample rates from 8 to 48 kHz,
written as WAV or FLAC bytes."""

from __future__ import annotations

import io
import wave

import numpy as np

from .meanings import BANDS, BEATS, Item, sound_caption

__all__ = ["CHORDS", "RATES", "sound"]

RATES = (8000, 11025, 22050, 32000, 44100, 48000)


def _wave(rng: np.random.Generator, phase: np.ndarray, rate: int, top: float) -> np.ndarray:
    """One voice of a timbre from ``phase`` (cycles): square, sawtooth, triangle or additive."""
    kind = int(rng.integers(0, 4))
    fundamental = top  # the highest frequency this voice reaches
    harmonics = max(1, int((rate / 2 - 100) // max(fundamental, 1.0)))
    if kind == 3:  # additive: a few harmonics of random strength, band-limited
        out = np.zeros_like(phase)
        for k in range(1, min(harmonics, 6) + 1):
            out += float(rng.uniform(0.2, 1.0)) / k * np.sin(2 * np.pi * k * phase + float(rng.uniform(0, 6.3)))
        return np.asarray(out / np.max(np.abs(out) + 1e-9), np.float64)
    out = np.zeros_like(phase)
    for k in range(1, min(harmonics, 15) + 1):  # band-limited square / sawtooth / triangle
        if kind == 0 and k % 2 == 1:
            out += np.sin(2 * np.pi * k * phase) / k
        elif kind == 1:
            out += np.sin(2 * np.pi * k * phase) / k * (-1) ** (k + 1)
        elif kind == 2 and k % 2 == 1:
            out += np.sin(2 * np.pi * k * phase) / (k * k) * (-1) ** ((k - 1) // 2)
    return np.asarray(out / np.max(np.abs(out) + 1e-9), np.float64)


def _noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Pink or brown noise (spectrum shaped in the frequency domain)."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.maximum(np.fft.rfftfreq(n), 1.0 / n)
    spectrum = spectrum / (np.sqrt(f) if rng.random() < 0.6 else f)
    x = np.fft.irfft(spectrum, n)
    x = x - x.mean()
    return np.asarray(x / (np.max(np.abs(x)) + 1e-9), np.float64)


def _beat(rng: np.random.Generator, t: np.ndarray, rhythm: str) -> np.ndarray:
    lo, hi = BEATS[rhythm]
    if hi == 0:
        return np.ones_like(t)
    rate = float(rng.uniform(lo, hi))
    phase = (t * rate + float(rng.uniform(0, 1))) % 1.0
    shape = int(rng.integers(0, 3))
    if shape == 0:  # a gate with soft edges
        duty = float(rng.uniform(0.3, 0.6))
        edge = 0.08
        return np.clip(np.minimum(phase / edge, (duty - phase) / edge), 0, 1)
    if shape == 1:  # struck: a fast attack, an exponential decay
        return np.minimum(phase / 0.02, 1.0) * np.exp(-phase / float(rng.uniform(0.12, 0.25)))
    return (0.5 - 0.5 * np.cos(2 * np.pi * phase)) ** 2  # a smooth swell


def _wav(x: np.ndarray, rate: int, eight_bit: bool) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setframerate(rate)
        if eight_bit:
            w.setsampwidth(1)
            w.writeframes(np.clip(np.rint(x * 127 + 128), 0, 255).astype(np.uint8).tobytes())
        else:
            w.setsampwidth(2)
            w.writeframes(np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2").tobytes())
    return out.getvalue()


def _flac(x: np.ndarray, rate: int) -> bytes:
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=rate, layout="mono")
        stream.format = "s16"
        frame = av.AudioFrame.from_ndarray(np.clip(np.rint(x * 32767), -32768, 32767).astype(np.int16)[None, :], format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


CHORDS = ((1.0, 1.2, 1.5), (1.0, 1.122, 1.5), (1.0, 1.335, 1.5), (1.0, 1.26, 1.5, 1.888), (1.0, 1.5, 2.0), (1.0, 1.189, 1.498, 1.782))


def sound(rng: np.random.Generator) -> Item:
    kinds = ["tone"] * 9 + ["chord"] * 9 + ["noise"] * 3 + ["rising", "falling"]
    kind = kinds[int(rng.integers(0, len(kinds)))]
    pitch = str(rng.choice(list(BANDS))) if kind in ("tone", "chord") else ""
    rhythm = str(rng.choice(list(BEATS))) if kind in ("tone", "chord", "noise") else ""
    rate = int(rng.choice(RATES))
    lead = float(rng.uniform(0.0, 0.15))
    body = float(rng.uniform(0.85, 2.6))
    tail = float(rng.uniform(0.0, 0.4))
    n = int(body * rate)
    t = np.arange(n) / rate
    if kind in ("tone", "chord"):
        lo, hi = BANDS[pitch]
        root = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        ratios = (1.0,) if kind == "tone" else CHORDS[int(rng.integers(0, len(CHORDS)))]
        vibrato = 1 + float(rng.uniform(0, 0.006)) * np.sin(2 * np.pi * float(rng.uniform(4, 6)) * t)
        x = sum(_wave(rng, np.cumsum(root * q * vibrato) / rate, rate, root * q) for q in ratios) / len(ratios)
        x = x * _beat(rng, t, rhythm)
    elif kind == "noise":
        x = _noise(rng, n) * _beat(rng, t, rhythm)
    else:
        a, b = float(rng.uniform(180, 380)), float(rng.uniform(1300, 2600))
        lo_f, hi_f = (a, b) if kind == "rising" else (b, a)
        linear = rng.random() < 0.5
        freq = lo_f + (hi_f - lo_f) * t / body if linear else lo_f * (hi_f / lo_f) ** (t / body)
        x = _wave(rng, np.cumsum(freq) / rate, rate, max(lo_f, hi_f))
    fade = min(n // 4, int(0.01 * rate))
    x[:fade] *= np.linspace(0, 1, fade)
    x[n - fade :] *= np.linspace(1, 0, fade)
    peak = 10 ** (float(rng.uniform(-30, -1)) / 20)
    x = x / (np.max(np.abs(x)) + 1e-9) * peak
    whole = np.concatenate([np.zeros(int(lead * rate)), x, np.zeros(int(tail * rate))])
    if rng.random() < 0.3:  # a faint room: pink noise 30-45 dB under the sound
        whole = whole + _noise(rng, len(whole)) * peak * 10 ** (float(rng.uniform(-45, -30)) / 20)
    how = int(rng.integers(0, 3))
    data = _flac(whole, rate) if how == 0 else _wav(whole, rate, eight_bit=how == 2 and peak > 0.1)
    return Item(data, sound_caption(rng, kind, pitch, rhythm), (kind, pitch, rhythm))
