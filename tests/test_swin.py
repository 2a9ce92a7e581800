"""The Swin stack (uform/plugins/swin, uform/convert/hf_clap_audio.py) against transformers'
``ClapAudioEncoder`` from the image on: random CLAP audio encoders saved with
``save_pretrained``, converted by the key map, run as uform's ONNX graph, and compared with the
encoder's ``pooler_output`` (its forward, with ``bn0`` and ``reshape_mel2img`` left out: the
front end's, tested with it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from uform.convert.common import Taker
from uform.convert.hf_clap_audio import audio_tensors
from uform.convert.sources import ConvertError, weights
from uform.convert.write import Ref
from uform.core.errors import CheckpointError
from uform.core.graph import GraphBuilder
from uform.plugins import swin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# laion/clap-htsat-unfused's audio geometry (spec_size 256, patch 4, window 8, width 96 doubling
# over 4 stages to 768) with depths [2, 2, 6, 2] cut to [2, 2, 2, 2]
HTSAT: dict[str, Any] = {"spec_size": 256, "depths": [2, 2, 2, 2], "hidden_size": 768}
# windows that do not tile the stages (20 and 10 tokens a side, window 6: zero padding, and a
# shift of 3 with its mask), two channels, no patch LayerNorm, no qkv bias
PADDED: dict[str, Any] = {
    "spec_size": 40, "patch_size": 2, "patch_stride": [2, 2], "window_size": 6, "patch_embeds_hidden_size": 8,
    "depths": [2, 2], "num_attention_heads": [2, 4], "hidden_size": 16, "mlp_ratio": 2.5, "patch_embed_input_channels": 2,
    "enable_patch_layer_norm": False, "qkv_bias": False, "layer_norm_eps": 1e-6, "num_mel_bins": 20,
}  # fmt: skip


def encoder(tmp_path: Path, audio: dict[str, Any], seed: int = 0) -> tuple[Any, Path]:
    """A random ``ClapModel`` of ``audio``'s audio geometry saved to ``tmp_path``, and its audio
    encoder reading the image: ``bn0`` and ``reshape_mel2img`` made identities."""
    torch.manual_seed(seed)
    text = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 64}
    model = transformers.ClapModel(transformers.ClapConfig(audio_config=audio, text_config=text, projection_dim=16)).eval()
    with torch.no_grad():  # a table of zeros (transformers' init) would leave the bias's gather untested
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name or name.endswith("norm.weight") or "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.5)
    model.save_pretrained(tmp_path)
    enc = model.audio_model.audio_encoder
    enc.batch_norm = torch.nn.Identity()
    enc.reshape_mel2img = lambda x: x
    return enc, tmp_path


def converted(folder: Path, audio: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray], Taker]:
    """The key map's fields and tensors (Refs read) for the saved model in ``folder``."""
    w = weights(folder)
    t = Taker(w, ignore=lambda n: not n.startswith("audio_model.audio_encoder.") or ".batch_norm." in n)
    fields = audio_tensors(t, transformers.ClapConfig.from_pretrained(folder).audio_config.to_dict(), str(folder / "config.json"))
    out = {}
    for name, value in t.finish().items():
        if isinstance(value, Ref):
            value = np.concatenate([np.asarray(w.get(p), np.float32).reshape(-1) for p in value.parts]).reshape(value.shape)
        out[name] = np.asarray(value, np.float32)
    return fields, out, t


def run_uform(fields: dict[str, Any], tensors: dict[str, np.ndarray], image: np.ndarray) -> np.ndarray:
    t = swin.read(fields, "towers.audio")
    assert set(swin.tensors(t, "audio")) == set(tensors)
    assert all(spec.shape == tensors[name].shape for name, spec in swin.tensors(t, "audio").items())
    b = GraphBuilder("audio")
    x = b.input("image", TensorProto.FLOAT, ["batch", t.channels, t.image_size, t.image_size])
    b.output(swin.swin_graph(b, x, t, "audio"), "pooled", None, ["batch", t.width])
    model = b.build()
    model.graph.initializer.extend(numpy_helper.from_array(tensors[n], n) for n in b.weights)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"image": image})[0]  # type: ignore[no-any-return]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("audio", [HTSAT, PADDED], ids=["htsat", "padded"])
def test_the_stack_equals_transformers_clap_audio_encoder(tmp_path: Path, audio: dict[str, Any]) -> None:
    enc, folder = encoder(tmp_path, audio)
    fields, tensors, _ = converted(folder, audio)
    size, channels = audio["spec_size"], audio.get("patch_embed_input_channels", 1)
    image = np.random.default_rng(1).standard_normal((3, channels, size, size)).astype(np.float32)
    image[2] = image[0] * 0.5 + 1.0  # a third row near the first: each must still be nearest its own
    with torch.no_grad():
        want = enc(torch.from_numpy(image)).pooler_output.numpy()
    got = run_uform(fields, tensors, image)
    assert got.shape == want.shape == (3, audio["hidden_size"])
    print(f"min cosine {cosines(got, want).min():.8f}, max abs {np.abs(got - want).max():.2e} of {np.abs(want).max():.2e}")
    assert cosines(got, want).min() >= 0.99999
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert (np.argmax(got @ want.T / np.linalg.norm(got, axis=1)[:, None], axis=1) == np.arange(3)).all()


def test_the_key_map_names_the_fields_and_every_tensor(tmp_path: Path) -> None:
    _, folder = encoder(tmp_path, PADDED)
    fields, tensors, t = converted(folder, PADDED)
    assert fields == {
        "image_size": 40, "channels": 2, "patch_size": 2, "embed_dim": 8, "depths": [2, 2], "heads": [2, 4], "window_size": 6,
        "mlp_ratio": 2.5, "patch_norm": False, "activation": "gelu", "layer_norm_eps": 1e-6,
    }  # fmt: skip
    assert not tensors["audio.stages.0.blocks.1.attn.qkv.bias"].any()  # qkv_bias false: zeros
    assert tensors["audio.patch.weight"].shape == (8, 2 * 2 * 2)
    assert "audio_model.audio_encoder.layers.1.blocks.1.attention.self.relative_position_index" in t.taken


def test_window_order_is_transformers_partition_of_the_padded_rolled_grid() -> None:
    from transformers.models.clap.modeling_clap import window_partition, window_reverse

    for res, w, shift in [(8, 4, 2), (20, 6, 3), (10, 6, 0), (7, 7, 0)]:
        padded = -(-res // w) * w
        grid = torch.zeros(1, padded, padded, 1)
        grid[0, :res, :res, 0] = torch.arange(res * res, dtype=torch.float32).reshape(res, res) + 1  # 0: padding
        rolled = torch.roll(grid, shifts=(-shift, -shift), dims=(1, 2))
        want = window_partition(rolled, w).reshape(-1).long() - 1
        gather, back = swin.stack.window_order(res, w, shift)
        assert np.array_equal(np.where(gather == res * res, -1, gather), want.numpy())
        places = window_reverse(torch.arange(len(gather), dtype=torch.float32).reshape(-1, w, w, 1), w, padded, padded)
        reverse = torch.roll(places, shifts=(shift, shift), dims=(1, 2))
        assert np.array_equal(reverse[0, :res, :res, 0].reshape(-1).long().numpy(), back)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"enable_fusion": "yes"}, "audio_config: field 'enable_fusion' is 'yes', not true or false"),
        ({"patch_stride": [2, 4]}, "audio_config: patch_size [4, 4] with patch_stride [2, 4] is not supported"),
        ({"hidden_size": 512}, "audio_config: hidden_size 512 is not the last stage's width, patch_embeds_hidden_size 96 x 2^3 = 768"),
        ({"num_attention_heads": [4, 8]}, "num_attention_heads [4, 8] does not give one head count to each of the 4 stages"),
    ],
)
def test_a_variant_the_stack_cannot_run_is_refused_by_name(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    cfg = transformers.ClapAudioConfig().to_dict() | change
    with pytest.raises(ConvertError, match=re.escape(message)):
        audio_tensors(Taker(weights_stub()), cfg, "clap/config.json")


def weights_stub() -> Any:
    from uform.convert.sources import Weights

    return Weights(files=[Path("clap/model.safetensors")])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"window_size": 16, "image_size": 64}, "towers.audio.window_size: 16 is more than the 8 tokens a side of stage 1 (a window must fit in every stage)"),
        ({"heads": [4, 8, 16]}, "towers.audio.heads: 3 values for the 4 stages of depths [2, 2, 2, 2]"),
        ({"heads": [4, 8, 16, 5]}, "towers.audio.heads: 5 heads do not divide stage 3's width 768"),
        ({"patch_size": 3}, "towers.audio.patch_size: 3 does not divide image_size 256"),
        ({"image_size": 200, "window_size": 5}, "towers.audio.patch_size: the 50 patches a side do not halve 3 times"),
        ({"depths": []}, "towers.audio.depths: expected a list of 1 to 8 integers"),
        (
            {"image_size": 4096, "patch_size": 1, "window_size": 1, "depths": [4], "heads": [1], "embed_dim": 1},
            "towers.audio.image_size: 4096 (patch_size 1, window_size 1, depths [4], heads [1]) would make 33554437 values of "
            "window orders, masks and position biases, over 16777216",
        ),
    ],
)
def test_a_config_the_stack_cannot_run_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    fields = {"image_size": 256, "channels": 1, "patch_size": 4, "embed_dim": 96, "depths": [2, 2, 2, 2], "heads": [4, 8, 16, 32], "window_size": 8, "mlp_ratio": 4.0}
    assert swin.read(fields, "towers.audio").width == 768
    with pytest.raises(CheckpointError, match=re.escape(message)):
        swin.read(fields | change, "towers.audio")


def test_a_stages_window_constants_are_made_once_for_its_blocks() -> None:
    """The HTSAT stack's graph holds one window order a stage and shift (7: stages 0-2 unshifted
    and shifted, stage 3 one window, never shifted), not one a block (12), and one shift mask a
    shifted stage (3); a config whose constants would pass the bound is refused before (above)."""
    fields = {"image_size": 256, "channels": 1, "patch_size": 4, "embed_dim": 96, "depths": [2, 2, 6, 2], "heads": [4, 8, 16, 32], "window_size": 8, "mlp_ratio": 4.0}
    t = swin.read(fields, "towers.audio")
    b = GraphBuilder("audio")
    b.output(swin.swin_graph(b, b.input("image", TensorProto.FLOAT, ["batch", 1, 256, 256]), t, "audio"), "pooled", None, ["batch", 768])
    names = [c.name.rsplit("_", 1)[0] for c in b.build().graph.initializer]
    assert (names.count("swin_windows"), names.count("swin_tokens"), names.count("swin_mask"), names.count("swin_relative")) == (7, 7, 3, 1)
    assert t.graph_values == 1123456


def test_an_images_row_does_not_depend_on_the_images_beside_it(tmp_path: Path) -> None:
    """uform serve joins requests into one call: each row must be the bits of its image alone."""
    _, folder = encoder(tmp_path, HTSAT)
    fields, tensors, _ = converted(folder, HTSAT)
    image = np.random.default_rng(2).standard_normal((3, 1, 256, 256)).astype(np.float32)
    together = run_uform(fields, tensors, image)
    for i in range(3):
        alone = run_uform(fields, tensors, image[i : i + 1])[0]
        assert np.array_equal(alone, together[i]), (i, np.abs(alone - together[i]).max())
