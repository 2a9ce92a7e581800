"""Transformers' ``Siglip2Model`` (SigLIP 2 NaFlex, ``model_type: "siglip2"``) as a uform file.

Everything is :mod:`hf_siglip`'s but the image tower's patches and positions: the patch
embedding is a Linear ``[W, P·P·3]`` over patches flattened in (row, column, channel) order,
stored as uform's ``image.patch.weight`` in (channel, row, column) order; the position table
``[num_patches, W]`` is a ``G0 x G0`` grid, resized to each picture's grid when it is encoded.
The tower is ``resize: "naflex"`` with ``max_patches`` from ``preprocessor_config.json``
(``max_num_patches``) and ``image_size`` ``G0·P``, the position grid's side in pixels
(docs/checkpoint.md, "Image tower"; docs/models-naflex.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from . import hf_siglip
from .common import RESAMPLE, Converted, Taker, Vision, integer, triple
from .sources import ConvertError, Weights, preprocessor_config

MAX_PATCHES = 256  # transformers' Siglip2ImageProcessor default max_num_patches


def convert(directory: Path, cfg: dict[str, Any], weights: Weights, source: dict[str, str], frames: int) -> Converted:
    return hf_siglip.convert(directory, cfg, weights, source, frames, grid_embeddings)


def grid_embeddings(directory: Path, t: Taker, v: Vision, vision_cfg: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    where = str(directory / "config.json") + " vision_config"
    why = "config.json vision_config"
    vw, patch = v.width, v.patch
    count = integer(vision_cfg, "num_patches", where, 256)
    g0 = math.isqrt(count)
    if g0 * g0 != count:
        raise ConvertError(f"{where}: num_patches {count} is not a square (the position table is a G0 x G0 grid)")
    linear = t.get("vision_model.embeddings.patch_embedding.weight", (vw, patch * patch * 3), why + ".hidden_size, patch_size")
    permuted = np.ascontiguousarray(np.asarray(linear).reshape(vw, patch, patch, 3).transpose(0, 3, 1, 2).reshape(vw, 3 * patch * patch))
    t.put("image.patch.weight", permuted)
    t.take("image.patch.bias", "vision_model.embeddings.patch_embedding.bias", (vw,), why + ".hidden_size")
    t.take("image.pos.weight", "vision_model.embeddings.position_embedding.weight", (count, vw), why + ".num_patches, hidden_size")
    return {"image_size": g0 * patch, "patch_size": patch, "resize": "naflex"} | _preprocessing(directory, patch, notes)


def _preprocessing(directory: Path, patch: int, notes: list[str]) -> dict[str, Any]:
    """``preprocessor_config.json``'s resample, mean, std and ``max_num_patches`` (Siglip2ImageProcessor's defaults where absent)."""
    found = preprocessor_config(directory, "image_processor")
    defaults = {"interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3, "max_patches": MAX_PATCHES}
    if found is None:
        notes.append(f"no preprocessor_config.json: Siglip2ImageProcessor's defaults (max_num_patches {MAX_PATCHES}, bilinear, mean and std 0.5)")
        return defaults
    cfg, where = found
    resample = cfg.get("resample", 2)
    if resample not in RESAMPLE:
        raise ConvertError(f"{where}: resample {resample!r} is not supported; supported: 2 (bilinear), 3 (bicubic)")
    for key, expected in (("do_resize", True), ("do_rescale", True)):
        if cfg.get(key, expected) is not expected:
            raise ConvertError(f"{where}: {key} {cfg.get(key)!r} is not supported; supported: true (each picture resized to its grid, levels scaled by 1/255)")
    if abs(float(cfg.get("rescale_factor", 1 / 255)) - 1 / 255) > 1e-9:
        raise ConvertError(f"{where}: rescale_factor {cfg.get('rescale_factor')!r} is not supported; supported: 1/255")
    if cfg.get("patch_size", patch) != patch:
        raise ConvertError(f"{where}: patch_size {cfg.get('patch_size')!r} differs from config.json's vision_config.patch_size {patch}")
    normalise = cfg.get("do_normalize", True)
    mean = triple(cfg.get("image_mean", defaults["mean"]), where, "image_mean", -math.inf) if normalise else [0.0] * 3
    std = triple(cfg.get("image_std", defaults["std"]), where, "image_std", 0.0) if normalise else [1.0] * 3
    return {"interpolation": RESAMPLE[resample], "mean": mean, "std": std, "max_patches": integer(cfg, "max_num_patches", where, MAX_PATCHES)}
