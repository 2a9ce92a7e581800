"""The audio towers' front ends, a helper of the audio plugin (not a plugin): power.py (frames
gathered from the window, their power spectrum, and a log taken element by element: both graph
front ends'), clap.py (CLAP's log-mel "image" in the graph and its tower: that front end, the
Swin stack, the MLP projection), fusion.py (a fused CLAP's four log-mel channels made on the host
from the whole recording, and its tower's graph)."""
