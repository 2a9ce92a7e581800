"""PNG files written by hand for the streamed PNG reader's tests: every colour type and bit
depth, palettes and tRNS, each row's filter chosen (0-4), the image data split over IDAT
chunks, and damage of each kind."""

from __future__ import annotations

import struct
import zlib

import numpy as np

CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
KINDS = [  # (colour type, bit depth): every pair the PNG specification allows
    (0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (2, 8), (2, 16), (3, 1), (3, 2), (3, 4), (3, 8), (4, 8), (4, 16), (6, 8), (6, 16),
]  # fmt: skip


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pack_rows(samples: np.ndarray, depth: int) -> np.ndarray:
    """``[h, w, c]`` samples (below 2**depth) as ``[h, stride]`` bytes."""
    h = samples.shape[0]
    flat = samples.reshape(h, -1)
    if depth == 16:
        return flat.astype(">u2").view(np.uint8).reshape(h, -1)
    if depth == 8:
        return flat.astype(np.uint8)
    per = 8 // depth
    width = flat.shape[1]
    padded = np.zeros((h, -(-width // per) * per), np.uint8)
    padded[:, :width] = flat
    groups = padded.reshape(h, -1, per).astype(np.uint16)
    shifts = np.arange(8 - depth, -1, -depth)
    return (groups << shifts).sum(axis=2).astype(np.uint8)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def filter_rows(rows: np.ndarray, bpp: int, kinds: list[int]) -> bytes:
    """Each row filtered with its kind (the PNG specification's encoder side, plain Python)."""
    out = bytearray()
    prior = [0] * rows.shape[1]
    for row, kind in zip(rows.tolist(), kinds):
        line = []
        for i, x in enumerate(row):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prior[i], prior[i - bpp] if i >= bpp else 0
            pred = [0, a, b, (a + b) // 2, _paeth(a, b, c)][kind]
            line.append((x - pred) % 256)
        out += bytes([kind]) + bytes(line)
        prior = row
    return bytes(out)


def png(
    samples: np.ndarray, colour: int, depth: int, *, palette: bytes = b"", trns: bytes | None = None, seed: int = 0,
    pieces: int = 3, interlace: int = 0, extra: list[bytes] | None = None, data: bytes | None = None,
) -> bytes:  # fmt: skip
    """A PNG of ``[h, w, channels]`` samples; each row's filter drawn from 0-4; the image data in ``pieces`` IDAT chunks."""
    h, w = samples.shape[:2]
    rows = pack_rows(samples, depth)
    bpp = max(1, CHANNELS[colour] * depth // 8)
    kinds = [int(k) for k in np.random.default_rng(seed).integers(0, 5, h)]
    body = zlib.compress(filter_rows(rows, bpp, kinds), 6) if data is None else data
    cut = [len(body) * i // pieces for i in range(pieces + 1)]
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, interlace))
    if palette:
        out += chunk(b"PLTE", palette)
    if trns is not None:
        out += chunk(b"tRNS", trns)
    for extra_chunk in extra or []:
        out += extra_chunk
    out += b"".join(chunk(b"IDAT", body[a:b]) for a, b in zip(cut, cut[1:]))
    return out + chunk(b"IEND", b"")


def picture(colour: int, depth: int, h: int, w: int, seed: int) -> dict[str, bytes]:
    """Files of one kind: smooth and noisy samples, with and without tRNS (one case each that matches)."""
    rng = np.random.default_rng(seed)
    top = 1 << depth
    smooth = (np.add.outer(np.arange(h) * 3, np.arange(w) * 5)[..., None] + np.arange(CHANNELS[colour]) * 40) % top
    noise = rng.integers(0, top, (h, w, CHANNELS[colour]))
    samples = np.where((np.arange(w) % 4 < 2)[None, :, None], noise, smooth).astype(np.int64)
    files = {}
    if colour == 3:
        entries = min(top, 200)
        samples %= entries
        palette = rng.integers(0, 256, (entries, 3), dtype=np.uint8).tobytes()
        files["P"] = png(samples, colour, depth, palette=palette, seed=seed)
        alphas = rng.integers(0, 256, max(1, entries // 2), dtype=np.uint8).tobytes()
        files["P+tRNS"] = png(samples, colour, depth, palette=palette, trns=alphas, seed=seed)
        one = bytearray(b"\xff" * entries)
        one[int(samples[0, 0, 0])] = 0
        files["P+tRNS one"] = png(samples, colour, depth, palette=palette, trns=bytes(one), seed=seed)
        files["P short palette"] = png(samples, colour, depth, palette=palette[: 3 * max(1, entries // 3)], seed=seed)
        return files
    files["plain"] = png(samples, colour, depth, seed=seed)
    if colour == 0:
        files["tRNS"] = png(samples, colour, depth, trns=struct.pack(">H", int(samples[0, 0, 0])), seed=seed)
        files["tRNS none"] = png(samples, colour, depth, trns=struct.pack(">H", top - 1 if top > 2 else 0), seed=seed)
    if colour == 2:
        files["tRNS"] = png(samples, colour, depth, trns=struct.pack(">3H", *(int(v) for v in samples[0, 0])), seed=seed)
    return files


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]  # x0, y0, dx, dy


def interlaced(samples: np.ndarray, colour: int, depth: int) -> bytes:
    """An Adam7-interlaced PNG of the samples (every pass's rows unfiltered)."""
    h, w = samples.shape[:2]
    body = b""
    for x0, y0, dx, dy in ADAM7:
        part = samples[y0::dy, x0::dx]
        if part.size:
            body += b"".join(b"\x00" + row.tobytes() for row in pack_rows(part, depth))
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 1))
    return out + chunk(b"IDAT", zlib.compress(body)) + chunk(b"IEND", b"")
