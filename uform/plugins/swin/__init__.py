"""A Swin transformer over a one-channel "image" (CLAP's HTSAT audio stack, a log-mel
spectrogram laid out as a square): its config fields and tensors (tower), and its ONNX graph
from the image to the pooled row (stack). A helper of the modality plugins, not a plugin."""

from .stack import patch_embedding, swin_graph, swin_stack
from .tower import SWIN_FIELDS, SwinTower, read, tensors

__all__ = ["SWIN_FIELDS", "SwinTower", "patch_embedding", "read", "swin_graph", "swin_stack", "tensors"]
