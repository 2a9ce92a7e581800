"""Rebuild specs: import a factory, read the shape-carrying leaves off a model, rebuild them."""

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from fastermodels._errors import SpecError

LAYER_TYPES: dict[str, type[nn.Module]] = {
    "Conv2d": nn.Conv2d,
    "Linear": nn.Linear,
    "BatchNorm1d": nn.BatchNorm1d,
    "BatchNorm2d": nn.BatchNorm2d,
}
_BN_ARGS = ("num_features", "eps", "momentum", "affine", "track_running_stats")
_ARGS: dict[str, tuple[str, ...]] = {
    "Conv2d": ("in_channels", "out_channels", "kernel_size", "stride", "padding",
               "dilation", "groups", "padding_mode"),
    "Linear": ("in_features", "out_features"),
    "BatchNorm1d": _BN_ARGS,
    "BatchNorm2d": _BN_ARGS,
}
_EXAMPLE = "a dotted path names a module then a factory in it, e.g. 'torchvision.models.resnet18'"


def resolve(source: str) -> Callable[..., nn.Module]:
    """Import the model factory ``source`` points to; ImportError says what a dotted path looks like."""
    module_name, _, attr = str(source).rpartition(".")
    if not module_name or not attr:
        raise ImportError(f"cannot resolve source {source!r}: {_EXAMPLE}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"cannot resolve source {source!r} ({e}): {_EXAMPLE}") from e
    if not callable(factory):
        raise ImportError(f"source {source!r} is not callable: {_EXAMPLE}")
    return factory  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    """JSON-native value: torch keeps sizes as tuples."""
    return list(value) if isinstance(value, tuple) else value


def spec_from(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Rebuild spec: the constructor arguments of every Conv2d, Linear and BatchNorm leaf.

    Only modules of exactly those types are recorded (``type(m) is nn.Conv2d``): a subclass
    might not rebuild from these arguments. Keys are the modules' dotted names.
    """
    spec: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        kind = type(module).__name__
        if LAYER_TYPES.get(kind) is not type(module):
            continue
        entry = {"type": kind, **{a: _plain(getattr(module, a)) for a in _ARGS[kind]}}
        if kind in ("Conv2d", "Linear"):
            entry["bias"] = module.bias is not None
        spec[name] = entry
    return spec


def _build(name: str, entry: Any) -> nn.Module:
    """A fresh module from one spec entry: ``type`` and the arguments :func:`spec_from` records."""
    if not isinstance(entry, Mapping):
        raise SpecError(f"module {name!r}: its spec entry is a {type(entry).__name__}, not an object "
                        "of constructor arguments")
    kwargs = dict(entry)
    kind = kwargs.pop("type", None)
    if not isinstance(kind, str) or kind not in LAYER_TYPES:
        raise SpecError(f"module {name!r}: type {kind!r} is not one of {', '.join(LAYER_TYPES)}")
    recorded = _ARGS[kind] + (("bias",) if kind in ("Conv2d", "Linear") else ())
    extra = [k for k in kwargs if k not in recorded]
    if extra:
        raise SpecError(f"module {name!r}: {', '.join(map(repr, extra))} is not among the arguments "
                        f"a spec records for {kind} ({', '.join(recorded)})")
    try:
        return LAYER_TYPES[kind](**kwargs)
    except (TypeError, ValueError, RuntimeError) as e:
        raise SpecError(f"module {name!r}: cannot build {kind} from {kwargs}: {e}") from e


def rebuild(net: nn.Module, modules: Any) -> nn.Module:
    """Replace each leaf the spec names by a freshly built module of its recorded arguments.

    Returns ``net`` (or the rebuilt root, for a spec entry named ``''``).
    """
    if not isinstance(modules, Mapping):
        raise SpecError(f"modules is a {type(modules).__name__}, not an object of module name → "
                        "constructor arguments (spec_from)")
    for name, entry in modules.items():
        fresh = _build(name, entry)
        if name == "":
            net = fresh
            continue
        parent, _, child = name.rpartition(".")
        try:
            host = net.get_submodule(parent)
            host.get_submodule(child)
        except AttributeError as e:
            raise SpecError(f"module {name!r} is not in the source model: check `modules` "
                            "against the source factory and its source_kwargs") from e
        setattr(host, child, fresh)
    return net
