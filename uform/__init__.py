"""uform: one multimodal encoder checkpoint, every modality, on ONNX Runtime.

Heavy modules (onnxruntime, av, torch) are imported by the plugins that need them, when
they need them, never by ``import uform``.
"""

from .core.arena import Arena, Encoded, RowsTape
from .core.errors import (
    ArenaBusyError,
    ArenaError,
    CancelledError,
    CheckpointError,
    InputError,
    PluginConflictError,
    PluginError,
    StaleArenaError,
    UformError,
    UnsupportedError,
)
from .core.executor import Deferred, DeferredOn, Executor, On
from .core.hookspecs import hookimpl
from .core.stats import EncodeStats
from .core.types import CPUClass, GPUClass, ModelDescription, Outputs, Scalar
from .model import Model, default_checkpoint
from .plugins.text import TextEncodeStats, TextItemStats
from .verbs import Served

__version__ = "4.0.0rc1"

# Stats types of the built-in media plugins, imported only when asked for.
_LAZY = {
    "ImageEncodeStats": "uform.plugins.image",
    "VideoEncodeStats": "uform.plugins.video",
    "AudioEncodeStats": "uform.plugins.audio",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'uform' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "Arena", "ArenaBusyError", "ArenaError", "CPUClass", "CancelledError", "CheckpointError",
    "Deferred", "DeferredOn", "EncodeStats", "Encoded", "Executor", "GPUClass", "InputError",
    "Model", "ModelDescription", "On", "Outputs", "PluginConflictError", "PluginError",
    "RowsTape", "Scalar", "Served", "StaleArenaError", "TextEncodeStats", "TextItemStats", "UformError", "UnsupportedError",
    "default_checkpoint", "hookimpl",
]  # fmt: skip
