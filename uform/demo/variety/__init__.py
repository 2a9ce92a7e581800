"""Variety for training: augmented renderings, motions and sounds, and paraphrased captions.

The training recipe draws most of its items from here and the rest from the canonical
renderers of :mod:`uform.demo.generate` (which the own suite and ``write_media`` use), so
that the towers learn the shape, the motion and the sound rather than one renderer. Every
item carries its *meaning*: the canonical caption of :mod:`uform.demo.generate`
(``"a red circle"``), which is the class the contrastive losses use; its text is one of
:func:`.captions.paraphrases` of that caption.

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

One module a section, each name imported from the module that defines it: :mod:`.captions`
(meanings, paraphrases, jumbles), :mod:`.pictures`, :mod:`.clips`, :mod:`.recordings`,
:mod:`.questions` (training and calibration phrasings) and :mod:`.decoder` (the byte decoder's
own phase).
"""
