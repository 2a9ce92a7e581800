"""What an artifact may make loading run without ``trust_remote_code=True``: a model zoo's
registered builder, called with plain architecture arguments, and nothing that fetches or loads.

An artifact's ``config.json`` names a ``source`` and its ``source_kwargs``; loading imports the
one and calls it with the other. A name is trusted only when it is one of the builders a zoo
registers publicly (``torchvision.models.list_models()`` / ``get_model_builder``), found under a
public module path, never an underscored helper; its keyword arguments only when each is a
plain architecture argument (:data:`ARCHITECTURE_KWARGS`, a JSON value) or a weights argument
set to ``null``. A builder whose weights argument downloads by default must be told ``null``.
"""

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from fastermodels._errors import UntrustedSourceError

# Model zoos whose registered builders an artifact may name without trust_remote_code=True.
TRUSTED_SOURCES: tuple[str, ...] = ("torchvision.models",)
# Keyword arguments that only shape a zoo builder's architecture: none of them names a file, a
# URL or a download, so a JSON value of any of them is passed on as it is.
ARCHITECTURE_KWARGS: frozenset[str] = frozenset({
    "num_classes", "aux_loss", "aux_logits", "transform_input", "init_weights", "num_keypoints",
    "trainable_backbone_layers", "quantize", "zero_init_residual", "groups", "width_per_group",
    "replace_stride_with_dilation", "dropout", "attention_dropout", "stochastic_depth_prob",
    "width_mult", "round_nearest", "last_channel", "memory_efficient", "growth_rate",
    "block_config", "num_init_features", "bn_size", "drop_rate", "version", "image_size",
    "patch_size", "num_layers", "num_heads", "hidden_dim", "mlp_dim", "representation_size",
    "depths", "embed_dim", "window_size", "mlp_ratio", "stem_channels", "partition_size",
    "min_size", "max_size", "image_mean", "image_std", "box_score_thresh", "box_nms_thresh",
    "box_detections_per_img", "score_thresh", "nms_thresh", "detections_per_img",
    "topk_candidates",
})
# Weights arguments: a builder downloads (and torch.loads) what they name, so only null passes.
WEIGHTS_KWARGS: tuple[str, ...] = ("weights", "weights_backbone")
_HINT = ("pass trust_remote_code=True to load() or FasterModel.from_pretrained() if you trust "
         "this artifact and what it would run")


@functools.lru_cache(maxsize=1)
def zoo_builders() -> dict[str, Callable[..., Any]]:
    """Every public dotted path of a builder ``torchvision.models`` registers → that builder.

    A builder is reachable as ``<its module>.<name>`` and from each public ``torchvision.models``
    package that holds it (``torchvision.models.resnet18``, ``torchvision.models.resnet.resnet18``,
    ``torchvision.models.quantization.resnet18``). Empty when torchvision is not installed.
    """
    try:
        import torchvision.models as zoo
    except ImportError:
        return {}
    registered = {id(zoo.get_model_builder(name)): zoo.get_model_builder(name) for name in zoo.list_models()}
    packages = [zoo] + [m for m in vars(zoo).values() if inspect.ismodule(m)]
    paths: dict[str, Callable[..., Any]] = {}
    for builder in registered.values():
        if not any(part.startswith("_") for part in builder.__module__.split(".")):
            paths[f"{builder.__module__}.{builder.__name__}"] = builder
    for package in packages:
        if any(part.startswith("_") for part in package.__name__.split(".")):
            continue
        for attr, value in vars(package).items():
            if not attr.startswith("_") and id(value) in registered:
                paths[f"{package.__name__}.{attr}"] = value
    return paths


def _plain(value: Any) -> bool:
    """A JSON scalar, or a list of them (nested): what an architecture argument may hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, list) and all(_plain(v) for v in value)


def _refuse(where: str, what: str) -> UntrustedSourceError:
    return UntrustedSourceError(f"{where}: config.json {what}: {_HINT}")


def check_source(source: Any, source_kwargs: Any = None, trust_remote_code: bool = False,
                 where: str = "the artifact") -> None:
    """Refuse, before anything is imported or called, an artifact's ``source`` and
    ``source_kwargs`` unless they name a registered zoo builder called with plain architecture
    arguments (module docstring); ``trust_remote_code=True`` lifts every check, as in transformers.
    """
    if trust_remote_code:
        return
    builders = zoo_builders()
    builder = builders.get(source) if isinstance(source, str) else None
    if builder is None:
        private = isinstance(source, str) and any(p.startswith("_") for p in source.split("."))
        why = ("a private (underscored) name" if private else
               f"not a model builder the zoo registers ({', '.join(TRUSTED_SOURCES)}: list_models())")
        raise _refuse(where, f"names the source {source!r}, {why}; fastermodels imports and calls "
                             "only registered zoo builders by default, since loading would import and "
                             "run that module's code")
    source_kwargs = {} if source_kwargs is None else source_kwargs
    if not isinstance(source_kwargs, Mapping):
        raise _refuse(where, f"holds source_kwargs of type {type(source_kwargs).__name__}, not an object")
    for key, value in source_kwargs.items():
        if key in WEIGHTS_KWARGS:
            if value is not None:
                raise _refuse(where, f"calls {source!r} with {key}={value!r} in its source_kwargs, which "
                                     "would download and load weights from outside the artifact (its "
                                     "model.safetensors holds the weights); set it to null")
        elif key not in ARCHITECTURE_KWARGS:
            raise _refuse(where, f"calls {source!r} with {key!r} in its source_kwargs, not one of the "
                                 "plain architecture arguments fastermodels passes by default "
                                 "(fastermodels.ARCHITECTURE_KWARGS); an argument outside them could "
                                 "fetch, load or run something")
        elif not _plain(value):
            raise _refuse(where, f"calls {source!r} with {key}={value!r}, not a JSON scalar or list")
    for name, param in inspect.signature(builder).parameters.items():
        if name in WEIGHTS_KWARGS and param.default is not None and name not in source_kwargs:
            raise _refuse(where, f"calls {source!r}, whose {name} defaults to {param.default!r}: it "
                                 f"would download those weights; set \"{name}\": null in source_kwargs")
