"""The training's inputs, as the runtime makes them: pictures and clips decoded once through the
image and video plugins' own decoding into pools, recordings made, captions phrased and
questions drawn, each part from a seeded stream of its own (:class:`Inputs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from uform.core.config import ModelConfig
from uform.demo import generate as g
from uform.demo.variety.captions import meanings, phrase
from uform.demo.variety.clips import clip as varied_clip
from uform.demo.variety.pictures import picture as varied_picture
from uform.demo.variety.questions import question as varied_question
from uform.demo.variety.recordings import PARTIALS, sound as varied_sound
from uform.demo.evaluate import TRAINING_STREAM
from uform.demo.media import image_bytes, video_bytes
from uform.plugins import video as video_plugin
from uform.plugins.media.video import sample as sample_clip
from uform.plugins.media.image import decode as decode_picture
from uform.plugins.media.files import Source

# what a flip, a transpose or playing a clip backwards does to its direction
_FLIP_X = {"left": "right", "right": "left", "up": "up", "down": "down"}
_FLIP_Y = {"left": "left", "right": "right", "up": "down", "down": "up"}
_TRANSPOSE = {"left": "up", "up": "left", "right": "down", "down": "right"}
_REVERSE = {"left": "right", "right": "left", "up": "down", "down": "up"}


PARTS = ("image", "video", "audio", "captions", "questions")  # Inputs' parts, each drawn from a stream of its own


class Inputs:
    """Batches of preprocessed media and their meanings, drawn from seeded generators (one a part).

    Pictures and clips come from pools decoded once through the runtime, half of each pool
    from the canonical renderers of :mod:`uform.demo.generate` and half from
    :mod:`uform.demo.variety`; a batch takes a given share from the canonical half, and each
    item is flipped or transposed at random (and a varied clip played backwards), its label
    following (a clip's direction turns with it). A share ``canonical`` of the recordings is made
    afresh by the canonical renderer, the rest drawn from a pool of varied ones. Every
    item's label is its meaning (its canonical caption's index among the modality's meanings).

    Each part draws from a stream of its own (:data:`PARTS`: ``[TRAINING_STREAM, seed, i]``), its
    pool and its batches alike, so a change to one part (a larger picture batch, a pool of
    another size) leaves what every other part draws as it was."""

    def __init__(self, config: ModelConfig, seed: int, video_pool: int, log: Callable[[str], None], *, audio_pool: int = 0,
                 image_pool: int = 0, canonical: float = 0.3, jumbled: float = 0.35, questions_seed: int | None = None,
                 partials: int = PARTIALS) -> None:  # fmt: skip
        self.image_size = int(config.towers["image"]["image_size"])
        self.window = int(config.towers["audio"]["samples"])
        self.video_tower = video_plugin.read(config.towers["video"], config)
        self.canonical, self.jumbled = canonical, jumbled
        self.meanings = {m: meanings(m) for m in ("image", "video", "audio")}
        self.index = {m: {x.caption: i for i, x in enumerate(ms)} for m, ms in self.meanings.items()}
        video = self.meanings["video"]
        where = {x.attributes: i for i, x in enumerate(video)}
        self.turn = {name: np.array([where[(x.attributes[0], x.attributes[1], table[x.attributes[2]])] for x in video])
                     for name, table in (("x", _FLIP_X), ("y", _FLIP_Y), ("t", _TRANSPOSE), ("r", _REVERSE))}  # fmt: skip
        self.rngs = {part: np.random.default_rng([TRAINING_STREAM, seed, i]) for i, part in enumerate(PARTS, 1)}
        if questions_seed is not None:  # the decoder's questions from a draw of their own (Settings.decoder_seed)
            self.rngs["questions"] = np.random.default_rng([TRAINING_STREAM, questions_seed, PARTS.index("questions") + 1])
        started = time.perf_counter()
        pictures = [self._picture(i % 2 == 0) for i in range(max(image_pool, 2))]
        self.pictures = np.stack([p for p, _ in pictures])
        self.picture_labels = np.array([label for _, label in pictures], np.int64)
        log(f"decoded {len(pictures)} training pictures through the image plugin in {time.perf_counter() - started:.0f} s")
        started = time.perf_counter()
        clips = [self._clip(i) for i in range(max(video_pool, 2))]
        self.clip_frames = np.stack([c[0] for c in clips])
        self.clip_labels = np.array([c[1] for c in clips], np.int64)
        log(f"decoded {len(clips)} training clips through the video plugin in {time.perf_counter() - started:.0f} s")
        started = time.perf_counter()
        made = [varied_sound(self.rngs["audio"], self.window, partials) for _ in range(audio_pool)]
        self.sound_windows = np.stack([w for w, _ in made]) if made else np.zeros((0, self.window), np.float32)
        self.sound_labels = np.array([self.index["audio"][m.caption] for _, m in made], np.int64)
        log(f"made {audio_pool} varied training recordings in {time.perf_counter() - started:.0f} s")

    def _picture(self, canonical: bool) -> tuple[np.ndarray, int]:
        rng = self.rngs["image"]
        if canonical:
            p = g.picture(rng, int(rng.choice([32, 32, 48, 64, 128])))
            pixels, caption, quality = p.pixels, p.caption, 95
        else:
            pixels, m = varied_picture(rng, int(rng.choice([32, 40, 48, 64, 96, 128])))
            caption, quality = m.caption, int(rng.integers(60, 96))
        data = image_bytes(pixels, "jpeg", quality=quality) if rng.random() < 0.3 else image_bytes(pixels, "png")
        return decode_picture(Source(0, None, data=data), self.image_size)[0], self.index["image"][caption]

    def _clip(self, i: int) -> tuple[np.ndarray, int]:
        rng = self.rngs["video"]
        fmt = "mp4" if i % 4 < 2 else "webm"
        if i % 2 == 0:  # the even clips are canonical, the odd ones varied
            c = g.clip(rng, int(rng.choice([32, 64])))
            data, caption = video_bytes(c.frames, fmt), c.caption
        else:
            vc = varied_clip(rng)
            crf = int(rng.integers(14, 32)) if fmt == "mp4" else int(rng.integers(4, 30))
            gop = int(rng.choice([1, 3, 8, 30, 250]))
            data, caption = video_bytes(vc.frames, fmt, fps=vc.fps, gop=gop, crf=crf), vc.meaning.caption
        frames, _ = sample_clip(Source(0, None, data=data), self.video_tower.frames, self.video_tower.pixels.image_size)
        return frames, self.index["video"][caption]

    @staticmethod
    def _pick(rng: np.random.Generator, count: int, n: int, canonical: float) -> np.ndarray:
        """``n`` pool indices, a share ``canonical`` of them even (canonical), the rest odd (varied)."""
        half = max(count // 2, 1)
        odd = rng.random(n) >= canonical
        return np.minimum(2 * rng.integers(0, half, n) + odd, count - 1)

    def images(self, n: int, canonical: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rngs["image"]
        pick = self._pick(rng, len(self.picture_labels), n, canonical)
        out = self.pictures[pick].copy()
        for i, (flip_x, flip_y, transpose) in enumerate(rng.random((n, 3)) < 0.5):
            x = out[i][:, ::-1] if flip_x else out[i]
            x = x[::-1] if flip_y else x
            out[i] = x.transpose(1, 0, 2) if transpose else x
        return out, self.picture_labels[pick]

    def videos(self, n: int, canonical: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rngs["video"]
        pick = self._pick(rng, len(self.clip_labels), n, canonical)
        out, labels = self.clip_frames[pick].copy(), self.clip_labels[pick].copy()
        for i, (flip_x, flip_y, transpose, reverse) in enumerate(rng.random((n, 4)) < 0.5):
            reverse = reverse and pick[i] % 2 == 1  # a varied clip backwards is a clip; a canonical one would lead with its trail
            x = out[i][:, :, ::-1] if flip_x else out[i]
            x = x[:, ::-1] if flip_y else x
            x = x.transpose(0, 2, 1, 3) if transpose else x
            out[i] = x[::-1] if reverse else x
            for name, done in (("x", flip_x), ("y", flip_y), ("t", transpose), ("r", reverse)):
                labels[i] = self.turn[name][labels[i]] if done else labels[i]
        return out, labels

    def sounds(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rngs["audio"]
        fresh = int((rng.random(n) < self.canonical).sum()) if len(self.sound_labels) else n
        made = [g.sound(rng) for _ in range(fresh)]
        windows = [g.samples_float(s) for s in made]
        labels = [self.index["audio"][s.caption] for s in made]
        pick = rng.integers(0, len(self.sound_labels), n - fresh) if n > fresh else np.zeros(0, np.int64)
        data = np.concatenate([np.stack(windows) if windows else np.zeros((0, self.window), np.float32), self.sound_windows[pick]])
        return data, np.concatenate([np.array(labels, np.int64), self.sound_labels[pick]])

    def captions(self, modality: str) -> list[str]:
        """One phrasing of every meaning of ``modality`` (canonical, a paraphrase or a jumble), in meaning order."""
        return [phrase(self.rngs["captions"], m, canonical=0.3, jumbled=self.jumbled) for m in self.meanings[modality]]

    def questions(self, n: int) -> list[g.Question]:
        rng = self.rngs["questions"]
        return [g.question(rng) if rng.random() < 0.2 else varied_question(rng, jumbled=self.jumbled) for _ in range(n)]
