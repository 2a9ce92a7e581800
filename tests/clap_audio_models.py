"""Random CLAP folders as ``save_pretrained`` writes a Hub snapshot's (no weights reach these
machines), and the audio tower of one taken into a uform file the way a converter does.

The audio geometry is laion/clap-htsat-unfused's front end (48 kHz, window 1024, hop 480,
64 mel bins from 50 to 14000 Hz, 10 s, ``rand_trunc``, ``repeatpad``; the Hub's
preprocessor_config.json, from memory) and its Swin layout (spec_size 256, patch 4, window 8,
four stages) at reduced widths and depths, so a test runs in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

AUDIO = {
    "spec_size": 256, "patch_size": 4, "patch_stride": [4, 4], "window_size": 8, "num_mel_bins": 64,
    "depths": [1, 1, 2, 1], "num_attention_heads": [1, 2, 2, 4], "patch_embeds_hidden_size": 16, "hidden_size": 128,
    "enable_fusion": False, "projection_dim": 32,
}  # fmt: skip
TEXT = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64, "projection_dim": 32}
FRONT = {
    "feature_size": 64, "sampling_rate": 48000, "hop_length": 480, "max_length_s": 10, "fft_window_size": 1024,
    "frequency_min": 50, "frequency_max": 14000, "truncation": "rand_trunc", "padding": "repeatpad",
}  # fmt: skip


def clap_folder(path: Path, seed: int = 0, **front: Any) -> Any:
    """A random ``ClapModel`` saved to ``path`` with its feature extractor (``front`` overrides
    FRONT); the BatchNorm's statistics drawn away from 0 and 1 so that folding it matters.
    Answers the model, in eval mode."""
    import torch
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel

    torch.manual_seed(seed)
    model = ClapModel(ClapConfig(text_config=TEXT, audio_config=AUDIO, projection_dim=32)).eval()
    bn = model.audio_model.audio_encoder.batch_norm
    with torch.no_grad():
        bn.running_mean.normal_(-40, 10)
        bn.running_var.uniform_(50, 400)
        bn.weight.normal_(1, 0.2)
        bn.bias.normal_(0, 0.3)
    model.save_pretrained(path)
    ClapFeatureExtractor(**{**FRONT, **front}).save_pretrained(path)
    return model


def audio_file(folder: Path, out: Path, dtype: Any = np.float32) -> Path:
    """The audio tower of the CLAP ``folder`` as a uform file at ``out`` (version 2, an audio
    tower alone): the Swin stack by hf_clap_audio, the front end by hf_clap_front, the
    projection's two layers renamed."""
    import ml_dtypes

    from uform.convert import hf_clap_audio, hf_clap_front
    from uform.convert.common import Taker
    from uform.convert.sources import read_json, weights
    from uform.convert.write import Ref
    from uform.core.checkpoint import save
    from uform.core.config import make_config

    cfg = read_json(folder / "config.json")
    source = weights(folder)
    t = Taker(source, ignore=lambda name: not name.startswith(("audio_model.", "audio_projection.")))
    where = str(folder / "config.json")
    fields = hf_clap_audio.audio_tensors(t, cfg["audio_config"], where) | hf_clap_front.front(folder, t, cfg["audio_config"], where, [])
    d = cfg["projection_dim"]
    for i, name in enumerate(("linear1", "linear2")):
        t.take(f"audio.projection.{i}.weight", f"audio_projection.{name}.weight", (d, fields["embed_dim"] << 3 if i == 0 else d), "projection")
        t.take(f"audio.projection.{i}.bias", f"audio_projection.{name}.bias", (d,), "projection")
    tensors = {}
    for name, value in t.finish().items():
        if isinstance(value, Ref):
            value = np.concatenate([source.get(p).reshape(-1) for p in value.parts]).reshape(value.shape)
        tensors[name] = np.asarray(value, np.float32).astype(dtype if dtype != "bf16" else ml_dtypes.bfloat16)
    config = make_config(d, 1, {"audio": fields}, format_version=2)
    save(out, config, tensors)
    return out
