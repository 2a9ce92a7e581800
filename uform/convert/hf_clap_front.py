"""CLAP's audio front end (transformers' ``ClapFeatureExtractor`` and the audio encoder's
``batch_norm``) as the fields and tensors of a uform audio tower with ``front: "clap"``
(docs/checkpoint.md, "Audio tower"; :mod:`uform.plugins.melfront.clap` runs it).

``preprocessor_config.json`` gives the front end: 48 kHz, ``fft_window_size`` 1024, hop 480,
``feature_size`` 64 mel bins between ``frequency_min`` and ``frequency_max`` (laion's
checkpoints: 50 and 14000 Hz), ``max_length_s`` 10 and ``padding``. An unfused model takes
``truncation: "rand_trunc"`` (its Slaney mel bank), a fused one (``enable_fusion``) ``"fusion"``
(the HTK bank and four mel channels, :mod:`.hf_clap_fusion`); the other is refused by name. Where
transformers crops a long recording at a random place, uform takes its first
``max_length_s`` seconds. ``top_db`` changes nothing in transformers (the extractor never
passes it on) and is not written. The BatchNorm over mel bins (eval mode, ``eps`` 1e-5, as
transformers builds ``BatchNorm2d``) is folded into ``audio.mel_norm.scale`` and ``.shift``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import hf_clap_fusion
from .common import Taker, integer
from .sources import ConvertError, preprocessor_config

SOURCE = "audio_model.audio_encoder.batch_norm"
BATCH_NORM_EPS = 1e-5  # torch's BatchNorm2d default; ClapAudioEncoder passes none
PADDINGS = ("repeatpad", "repeat", "pad")


def _number(cfg: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = cfg.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value) or value < 0:
        raise ConvertError(f"{where}: field {key!r} is {value!r}, not a number of Hz")
    return float(value)


def front(directory: Path, t: Taker, audio_cfg: Mapping[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    """The front end's fields of the audio tower, the folded BatchNorm put into ``t``;
    ``audio_cfg`` is config.json's ``audio_config`` (``where`` names config.json)."""
    where_cfg = where + " audio_config"
    found = preprocessor_config(directory, "feature_extractor")
    if found is None:
        raise ConvertError(
            f"{directory}: no preprocessor_config.json (nor a processor_config.json with a feature_extractor); CLAP's feature extractor "
            "settings (frequency_min, truncation) differ between checkpoints and its defaults do not fit an unfused model: copy the file "
            "from the model's repository, or save the model's ClapProcessor (or ClapFeatureExtractor) into this folder"
        )
    cfg, where = found  # errors name this file from here on
    kind = cfg.get("feature_extractor_type", "ClapFeatureExtractor")
    if kind != "ClapFeatureExtractor":
        raise ConvertError(f"{where}: feature_extractor_type {kind!r} is not supported; supported: 'ClapFeatureExtractor'")
    truncation = cfg.get("truncation", "fusion")
    fused = hf_clap_fusion.fused(audio_cfg)
    if fused and truncation != "fusion":
        raise ConvertError(f"{where}: truncation {truncation!r} is not supported for a fused model ({where_cfg} enable_fusion true); supported: 'fusion'")
    if not fused and truncation != "rand_trunc":
        raise ConvertError(
            f"{where}: truncation {truncation!r} is not supported; supported: 'rand_trunc' (an unfused CLAP's; 'fusion' feeds "
            "four mel channels that only a fused model, enable_fusion true, takes: transformers' get_audio_features of this model "
            "fails on them too). ClapFeatureExtractor() saves 'fusion' by default: set truncation to 'rand_trunc' in the file, "
            "as laion/clap-htsat-unfused's is"
        )
    padding = cfg.get("padding", "repeatpad")
    if padding not in PADDINGS:
        raise ConvertError(f"{where}: padding {padding!r} is not supported; supported: {', '.join(map(repr, PADDINGS))}")
    if cfg.get("padding_value", 0.0) != 0.0:
        raise ConvertError(f"{where}: padding_value {cfg.get('padding_value')!r} is not supported; supported: 0.0 (silence)")
    rate = integer(cfg, "sampling_rate", where, 48000)
    seconds = cfg.get("max_length_s", 10)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0 or float(seconds * rate) != int(seconds * rate):
        raise ConvertError(f"{where}: max_length_s {seconds!r} is not a positive number of seconds making whole samples at {rate} Hz")
    n_mels = integer(cfg, "feature_size", where, 64)
    if n_mels != integer(audio_cfg, "num_mel_bins", where_cfg, 64):
        raise ConvertError(f"{where}: feature_size {n_mels} differs from {where_cfg}'s num_mel_bins {audio_cfg.get('num_mel_bins', 64)}")
    if "top_db" in cfg and cfg["top_db"] is not None:
        notes.append(f"preprocessor_config.json top_db {cfg['top_db']!r} left out: ClapFeatureExtractor never applies it")
    why = f"{where_cfg}.num_mel_bins"
    mean, var, weight, bias = (t.get(f"{SOURCE}.{k}", (n_mels,), why).astype(np.float64) for k in ("running_mean", "running_var", "weight", "bias"))
    if f"{SOURCE}.num_batches_tracked" in t.weights:
        t.check(f"{SOURCE}.num_batches_tracked", (), "BatchNorm2d's counter, unused in eval mode")
    scale = weight / np.sqrt(var + BATCH_NORM_EPS)
    t.put("audio.mel_norm.scale", scale.astype(np.float32))
    t.put("audio.mel_norm.shift", (bias - mean * scale).astype(np.float32))
    fields = {
        "front": "clap", "sample_rate": rate, "samples": int(seconds * rate), "n_fft": integer(cfg, "fft_window_size", where, 1024),
        "hop": integer(cfg, "hop_length", where, 480), "n_mels": n_mels, "f_min": _number(cfg, "frequency_min", where, 0.0),
        "f_max": _number(cfg, "frequency_max", where, 14000.0), "padding": padding, "projection": "mlp",
    }  # fmt: skip
    if fused:
        fields["max_samples"] = hf_clap_fusion.WINDOWS * fields["samples"]
        notes.append(
            f"fused: recordings are read to {hf_clap_fusion.WINDOWS} windows ({hf_clap_fusion.WINDOWS * seconds:g} s), and a longer "
            "one's crops are the middle of each third (transformers draws them at random)"
        )
    return fields
