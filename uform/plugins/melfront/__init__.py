"""The audio towers' front ends as graph pieces, a helper of the audio plugin (not a plugin):
power.py (frames gathered from the window and their power spectrum, both front ends'),
clap.py (CLAP's log-mel "image" and its tower: that front end, the Swin stack, the MLP projection)."""
