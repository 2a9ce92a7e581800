"""What every family's conversion shares: taking source tensors with their shapes checked,
transformer stacks renamed to uform's blocks, the image preprocessing, the output config."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uform.core.config import MAX_LABEL_SCALE

from .sources import ConvertError, Weights, preprocessor_config
from .write import Ref, Tensor

ACTIVATIONS = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL's codes, as preprocessor_config.json writes them
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


@dataclass
class Converted:
    """A family's answer: the uform config, the tensors (in the source's precision), the
    tokenizer's JSON text, and notes for the report (defaults taken, what was assumed)."""

    config: dict[str, Any]
    tensors: dict[str, Tensor]
    tokenizer: str
    notes: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


class Taker:
    """Source tensors taken by name with their shape checked against the config's; at the end
    :meth:`finish` refuses a source holding tensors no mapping took (a variant uform does not
    know would otherwise be converted wrong)."""

    def __init__(self, weights: Weights, ignore: Callable[[str], bool] = lambda name: False) -> None:
        self.weights = weights
        self.taken: set[str] = set()
        self.ignore = ignore
        self.out: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], why: str) -> np.ndarray:
        """Source tensor ``name`` of ``shape`` read now; ``why`` names the config fields the shape comes from."""
        self.check(name, shape, why)
        return self.weights.get(name)

    def check(self, name: str, shape: tuple[int, ...], why: str) -> None:
        """Source tensor ``name`` is there, of ``shape``: it is taken."""
        if name not in self.weights:
            raise ConvertError(f"{self.weights.missing(name)} (expected shape {list(shape)} from {why})")
        found = self.weights.shapes[name]
        if tuple(found) != tuple(shape):
            raise ConvertError(
                f"{self._files()}: tensor {name!r} has shape {list(found)}, but the config says {list(shape)} ({why})"
            )
        self.taken.add(name)

    def put(self, name: str, value: Tensor) -> None:
        self.out[name] = value

    def take(self, target: str, name: str, shape: tuple[int, ...], why: str, as_shape: tuple[int, ...] | None = None) -> None:
        """Output ``target`` is source tensor ``name`` (of ``shape``), read when it is written (as ``as_shape``)."""
        self.check(name, shape, why)
        self.put(target, Ref((name,), as_shape or shape))

    def stack(self, target: str, names: list[str], shape: tuple[int, ...], why: str) -> None:
        """Output ``target`` is the source tensors ``names`` (each of ``shape``) stacked along the first axis."""
        for name in names:
            self.check(name, shape, why)
        self.put(target, Ref(tuple(names), (len(names) * shape[0], *shape[1:])))

    def finish(self) -> dict[str, Tensor]:
        left = sorted(n for n in self.weights.names() if n not in self.taken and not self.ignore(n))
        if left:
            shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            raise ConvertError(f"{self._files()}: tensors this conversion does not know: {shown} (an unsupported variant of the architecture)")
        return self.out

    def _files(self) -> str:
        return ", ".join(str(p) for p in self.weights.files)


def section(cfg: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    """A nested object field (``text_config``, ``vision_cfg``): ``{}`` where absent or null."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConvertError(f"{where}: field {key!r} is {value!r}, not an object")
    return value


def integer(cfg: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    """A positive integer field (``default`` where absent); errors name the file's field."""
    value = cfg.get(key, default)
    if value is None:
        raise ConvertError(f"{where}: field {key!r} is missing")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConvertError(f"{where}: field {key!r} is {value!r}, not a positive integer")
    return value


def positive(cfg: Mapping[str, Any], key: str, where: str, default: float) -> float:
    """A positive finite number field (``default`` where absent): an epsilon, a ratio."""
    value = cfg.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise ConvertError(f"{where}: field {key!r} is {value!r}, not a positive number")
    return float(value)


def triple(value: Any, where: str, key: str, low: float) -> list[float]:
    """A list of 3 finite numbers, each above ``low`` (-inf: any): an image mean or std."""
    if not (
        isinstance(value, list) and len(value) == 3
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > low for v in value)
    ):  # fmt: skip
        bound = "" if low == -math.inf else f" above {low:g}"
        raise ConvertError(f"{where}: {key} {value!r} is not a list of 3 finite numbers{bound}")
    return [float(v) for v in value]


def activation(name: Any, where: str) -> str:
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ConvertError(f"{where}: hidden_act {name!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def qkv(t: Taker, target: str, q: str, k: str, v: str, width: int, why: str) -> None:
    """The attention's q, k, v projections (``q``, ``k``, ``v``: name prefixes) stacked as uform's ``{target}.qkv``."""
    t.stack(f"{target}.qkv.weight", [f"{p}.weight" for p in (q, k, v)], (width, width), why)
    t.stack(f"{target}.qkv.bias", [f"{p}.bias" for p in (q, k, v)], (width,), why)


def hf_stack(t: Taker, source: str, target: str, width: int, depth: int, mlp: int, why: str) -> None:
    """Transformers' encoder layers ``{source}.encoder.layers.i`` (CLIP, SigLIP) as ``{target}.blocks.i``."""
    for i in range(depth):
        s, d = f"{source}.encoder.layers.{i}", f"{target}.blocks.{i}"
        qkv(t, f"{d}.attn", f"{s}.self_attn.q_proj", f"{s}.self_attn.k_proj", f"{s}.self_attn.v_proj", width, why)
        pairs = [("self_attn.out_proj", "attn.out", (width, width)), ("mlp.fc1", "mlp.fc1", (mlp, width)), ("mlp.fc2", "mlp.fc2", (width, mlp))]
        for a, b, shape in pairs:
            t.take(f"{d}.{b}.weight", f"{s}.{a}.weight", shape, why)
            t.take(f"{d}.{b}.bias", f"{s}.{a}.bias", (shape[0],), why)
        for a, b in (("layer_norm1", "ln1"), ("layer_norm2", "ln2")):
            norm(t, f"{d}.{b}", f"{s}.{a}", width, why)


def norm(t: Taker, target: str, source: str, width: int, why: str) -> None:
    t.take(f"{target}.weight", f"{source}.weight", (width,), why)
    t.take(f"{target}.bias", f"{source}.bias", (width,), why)


@dataclass(frozen=True)
class Text:
    """A Hugging Face ``text_config``'s geometry: width, depth, heads, MLP width, vocabulary, context."""

    width: int
    depth: int
    heads: int
    mlp: int
    vocab: int
    context: int


def text_geometry(cfg: Mapping[str, Any], where: str, defaults: Text) -> Text:
    """``cfg`` (a ``text_config``) read with transformers' defaults for the family (``defaults``)."""
    at = where + " text_config"
    return Text(
        integer(cfg, "hidden_size", at, defaults.width), integer(cfg, "num_hidden_layers", at, defaults.depth),
        integer(cfg, "num_attention_heads", at, defaults.heads), integer(cfg, "intermediate_size", at, defaults.mlp),
        integer(cfg, "vocab_size", at, defaults.vocab), integer(cfg, "max_position_embeddings", at, defaults.context),
    )  # fmt: skip


@dataclass(frozen=True)
class Vision:
    """A Hugging Face ``vision_config``'s geometry: width, depth, heads, MLP width, image and patch size."""

    width: int
    depth: int
    heads: int
    mlp: int
    size: int
    patch: int

    @property
    def grid(self) -> int:
        return self.size // self.patch


def vision(cfg: Mapping[str, Any], where: str, patch: int) -> Vision:
    """``cfg`` (a ``vision_config``) read with transformers' defaults (``patch``: the family's); refused
    by name where uform cannot take it (not RGB, an image smaller than a patch)."""
    at = where + " vision_config"
    v = Vision(
        integer(cfg, "hidden_size", at, 768), integer(cfg, "num_hidden_layers", at, 12),
        integer(cfg, "num_attention_heads", at, 12), integer(cfg, "intermediate_size", at, 3072),
        integer(cfg, "image_size", at, 224), integer(cfg, "patch_size", at, patch),
    )  # fmt: skip
    if integer(cfg, "num_channels", at, 3) != 3:
        raise ConvertError(f"{where}: vision_config.num_channels {cfg.get('num_channels')} is not supported (uform's images are RGB)")
    if v.size < v.patch:
        raise ConvertError(f"{where}: vision_config.image_size {v.size} is smaller than one patch (patch_size {v.patch})")
    return v


def patch_fields(v: Vision) -> dict[str, str]:
    """The image tower's ``patch_remainder``: transformers' patch convolution (stride ``P``, no
    padding) leaves the last ``S % P`` rows and columns of the picture out (SigLIP
    so400m-patch14-384: 27 patches of 14 cover 378 of 384), and so does uform's ``drop``."""
    return {"patch_remainder": "drop"} if v.size % v.patch else {}


def geometry(width: int, depth: int, heads: int, mlp: int, where: str) -> dict[str, int]:
    if heads < 1 or width % heads:
        raise ConvertError(f"{where}: num_attention_heads {heads} does not divide hidden_size {width}")
    return {"width": width, "depth": depth, "heads": heads, "mlp_width": mlp}


def preprocessing(directory: Path, family: str, image_size: int, notes: list[str]) -> dict[str, Any]:
    """The image tower's preprocessing fields from ``preprocessor_config.json`` (CLIP: the
    shorter side to ``size.shortest_edge`` and a central crop; SigLIP: a square resize), or
    the family's defaults, said in ``notes``, where the file is absent."""
    found = preprocessor_config(directory, "image_processor")
    square = family != "clip"
    defaults: dict[str, Any] = {"mean": CLIP_MEAN, "std": CLIP_STD} if not square else {"mean": [0.5] * 3, "std": [0.5] * 3}
    if found is None:
        notes.append(f"no preprocessor_config.json: the {family} defaults (size {image_size}, bicubic, mean {defaults['mean']}, std {defaults['std']})")
        fit = {"resize": "square"} if square else {"resize": "shorter_side_crop", "resize_rounding": "floor"}
        return fit | {"interpolation": "bicubic", **defaults}
    cfg, where = found
    resample = cfg.get("resample", 3)
    if resample not in RESAMPLE:
        raise ConvertError(f"{where}: resample {resample!r} is not supported; supported: 2 (bilinear), 3 (bicubic)")
    if cfg.get("do_rescale", True) is not True:  # transformers then normalises levels 0-255, where uform scales them by 1/255 first
        raise ConvertError(f"{where}: do_rescale {cfg.get('do_rescale')!r} is not supported; supported: true (levels scaled by 1/255 before the mean and std)")
    if abs(positive(cfg, "rescale_factor", where, 1 / 255) - 1 / 255) > 1e-9:
        raise ConvertError(f"{where}: rescale_factor {cfg.get('rescale_factor')!r} is not supported; supported: 1/255")
    if not cfg.get("do_resize", True):
        raise ConvertError(f"{where}: do_resize false is not supported (uform resizes every image to the tower's size)")
    mean, std = (cfg.get("image_mean", defaults["mean"]), cfg.get("image_std", defaults["std"])) if cfg.get("do_normalize", True) else ([0.0] * 3, [1.0] * 3)
    size = cfg.get("size")
    out: dict[str, Any] = {"interpolation": RESAMPLE[resample], "mean": triple(mean, where, "image_mean", -math.inf), "std": triple(std, where, "image_std", 0.0)}
    if square:
        height, width = _hw(size, where, "size")
        if (height, width) != (image_size, image_size) or cfg.get("do_center_crop"):
            raise ConvertError(f"{where}: size {size!r} (center crop {cfg.get('do_center_crop')}) is not a square resize to the tower's image_size {image_size}")
        return out | {"resize": "square"}
    shortest = size.get("shortest_edge") if isinstance(size, dict) else size
    crop = _hw(cfg.get("crop_size", image_size), where, "crop_size") if cfg.get("do_center_crop", True) else None
    if shortest != image_size or crop != (image_size, image_size):
        raise ConvertError(
            f"{where}: size {size!r} and crop_size {cfg.get('crop_size')!r} are not supported: uform resizes the shorter side "
            f"to the tower's image_size {image_size} and crops the central {image_size}x{image_size}"
        )
    return out | {"resize": "shorter_side_crop", "resize_rounding": "floor"}  # transformers: int(S * long / short)


def _hw(value: Any, where: str, key: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    if isinstance(value, dict) and isinstance(value.get("height"), int) and isinstance(value.get("width"), int):
        return value["height"], value["width"]
    raise ConvertError(f"{where}: {key} {value!r} is not a size (an integer, or height and width)")


def scalar(t: Taker, name: str, why: str) -> float:
    """A one-value source tensor (``logit_scale``, ``logit_bias``) as a float."""
    if name not in t.weights:
        raise ConvertError(f"{t.weights.missing(name)} ({why})")
    shape = t.weights.shapes[name]
    if int(np.prod(shape)) != 1:
        raise ConvertError(f"{t._files()}: tensor {name!r} has shape {list(shape)}, expected one value ({why})")
    t.taken.add(name)
    value = float(np.asarray(t.weights.get(name), np.float32).reshape(-1)[0])
    if not math.isfinite(value):
        raise ConvertError(f"{t._files()}: tensor {name!r} holds {value} ({why})")
    return value


def logit_scale(t: Taker, name: str = "logit_scale") -> float:
    """The labels' scale: exp of the source's ``name`` tensor (a uform config holds at most 1e6)."""
    value = scalar(t, name, "the model's logit scale")
    if value > math.log(MAX_LABEL_SCALE):
        raise ConvertError(f"{t._files()}: tensor {name!r} holds {value:g}, whose exp (the labels' scale) is past {MAX_LABEL_SCALE:g}")
    return math.exp(value)


def config(dimensions: int, context: int, towers: dict[str, Any], source: dict[str, str], labels: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": "uform",
        "format_version": 2,
        "dimensions": dimensions,
        "context": context,
        "towers": towers,
        "choice_temperatures": [1.0],
        "source": source,
        "labels": labels,
    }
