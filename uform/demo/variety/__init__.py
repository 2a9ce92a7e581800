"""Variety for training: augmented renderings, motions and sounds, and paraphrased captions.

The training recipe draws most of its items from here and the rest from the canonical
renderers of :mod:`uform.demo.generate` (which the own suite and ``write_media`` use), so
that the towers learn the shape, the motion and the sound rather than one renderer. Every
item carries its *meaning*: the canonical caption of :mod:`uform.demo.generate`
(``"a red circle"``), which is the class the contrastive losses use; its text is one of
:func:`paraphrases` of that caption.

- pictures: backgrounds from black to white, tinted, two-tone gradients or noise; the colour
  shifted in hue, saturation and value; filled shapes, outlined shapes or outlines alone,
  rotated by any angle, drawn aliased or 2x supersampled; non-square frames;
- clips: no trail; sizes 32-96 pixels, 5-30 fps, 0.5-3 s, H.264 or VP8 at random quality
  and keyframe spacing; constant, easing, late-starting or early-stopping motion, shapes
  entering or leaving the frame; a quarter of the clips move a little across the direction;
- recordings: sine, square, sawtooth, triangle or additive voices, chords of several kinds,
  white, pink, brown or band-limited noise, linear or exponential sweeps, gated, struck or
  swelling pulses at jittered rates; made at 8-48 kHz and brought to the tower's rate by the
  runtime's own resampler, -35 to -1 dBFS, silence before and after, a faint noise floor.

One module a section: :mod:`.captions` (meanings, paraphrases, jumbles), :mod:`.pictures`,
:mod:`.clips`, :mod:`.recordings`, :mod:`.questions` (training and calibration phrasings) and
:mod:`.decoder` (the byte decoder's own phase); every name is importable from here.
"""

from __future__ import annotations

from .captions import (COUNT_WORDS, DIRECTION_WORDS, PITCH_WORDS, RHYTHM_WORDS, SEPARATORS, SHAPE_WORDS, SOUND_WORDS, SWEEP_WORDS,
                       Meaning, audio_paraphrases, image_paraphrases, jumbles, meanings, paraphrases, phrase, video_paraphrases)
from .clips import CLIP_SIZES, VariedClip, clip
from .decoder import (ATTRIBUTE_WORDS, DECODER_AFTER, DECODER_ASK, DECODER_HOW_MANY, DECODER_JOINS, DECODER_LEADS, DECODER_WHICH,
                      DECODER_WRAPS, OPTION_FORMS, OPTION_JOINS, VALUE_WORDS, decoder_question)
from .pictures import picture
from .questions import (CALIBRATION_ASK, CALIBRATION_HOW_MANY, CALIBRATION_WHICH, EXTRA, TRAIN_ASK, TRAIN_HOW_MANY, TRAIN_JOINS,
                        TRAIN_LEADS, TRAIN_WHICH, all_paraphrases, question, vocabulary)
from .recordings import CHORDS, PARTIALS, RATES, varied_voice, sound  # varied_voice: tests and docs/training.md name it variety.varied_voice

__all__ = [
    # captions
    "Meaning", "meanings", "paraphrases", "image_paraphrases", "video_paraphrases", "audio_paraphrases", "jumbles", "phrase",
    "COUNT_WORDS", "SHAPE_WORDS", "DIRECTION_WORDS", "PITCH_WORDS", "RHYTHM_WORDS", "SOUND_WORDS", "SWEEP_WORDS", "SEPARATORS",
    # media
    "picture", "VariedClip", "clip", "CLIP_SIZES", "sound", "RATES", "CHORDS", "PARTIALS",
    # questions
    "question", "all_paraphrases", "vocabulary", "TRAIN_ASK", "TRAIN_WHICH", "TRAIN_HOW_MANY", "TRAIN_LEADS", "TRAIN_JOINS",
    "CALIBRATION_ASK", "CALIBRATION_WHICH", "CALIBRATION_HOW_MANY", "EXTRA",
    # the byte decoder's own phase
    "decoder_question", "VALUE_WORDS", "ATTRIBUTE_WORDS", "DECODER_ASK", "DECODER_WHICH", "DECODER_HOW_MANY", "DECODER_LEADS",
    "DECODER_JOINS", "DECODER_WRAPS", "DECODER_AFTER", "OPTION_FORMS", "OPTION_JOINS",
]  # fmt: skip
