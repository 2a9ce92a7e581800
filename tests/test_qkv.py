"""A block's qkv projection and its attention as one op (:mod:`uform.plugins.oplib.qkv`, the
library's ``QKVAttention...`` ops, a chunk of items at a time): bit for bit the product followed
by the attention, on every variant this machine runs (``amx-model`` everywhere), in chunks that
start anywhere in x's blocks, with either mask, x handed over or not, the context handed over or
not; the rewrite's reach over whole towers; and the op's refusals."""

from __future__ import annotations

import collections
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ckpt import make_checkpoint
from oplibrary import needs_library, runnable
from test_handoff import unlaid
from uform.plugins import e4m3
from uform.plugins.oplib.library import BF16_PRODUCTS, VARIANTS, OpLibrary

HEADS, WIDTH, ITEMS, TOKENS = 2, 64, 5, 13  # 13 tokens: chunks of items start inside x's blocks of 16 rows
ALL = ["amx-model", "amx", "avx2", "avx512", "avx512-bf16"]


def model(variant: str, quantized: bool, fused: bool, x_handed: bool, handoff: bool, mask: str, items: int = 0) -> onnx.ModelProto:
    """x [m, WIDTH] (through a LayerNormHandoff first where ``x_handed``) -> the qkv projection
    (bias) -> attention (``mask``: none, padding or causal) -> out; the projection and attention
    as one op where ``fused`` (``items`` a chunk)."""
    v = VARIANTS.index(variant)
    w_type = TensorProto.UINT8 if quantized else TensorProto.UINT16
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", WIDTH]), helper.make_tensor_value_info("w", w_type, None),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, [3 * WIDTH]), helper.make_tensor_value_info("shape", TensorProto.INT64, [2])]  # fmt: skip
    if quantized:
        inputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [3 * WIDTH]))
    if mask != "none":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, None))
    nodes = []
    x = "x"
    if x_handed:
        nodes.append(helper.make_node("LayerNormHandoff", ["x", "g", "beta"], ["h"], domain="ai.uform", variant=v, epsilon=1e-5))
        inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, [WIDTH]) for name in ("g", "beta")]
        x = "h"
    product = {"variant": v, "n": 3 * WIDTH, "threads": 2} | ({"k": WIDTH} if x_handed else {})
    mask_input = ["mask"] if mask != "none" else []
    attention = "AttentionHandoff" if handoff else "Attention"
    if fused:
        op = f"QKVAttention{'E4M3' if quantized else 'BF16'}{'Handoff' if handoff else ''}"
        fused_inputs = [x, "w", "shape", *(["s"] if quantized else []), "b", *mask_input]
        nodes.append(helper.make_node(op, fused_inputs, ["out"], domain="ai.uform", heads=HEADS, items=items, **product))
    else:
        nodes.append(helper.make_node("MatMulE4M3" if quantized else "MatMulBF16", [x, "w", *(["s"] if quantized else []), "b"], ["qkv"], domain="ai.uform", **product))
        nodes.append(helper.make_node(attention, ["qkv", "shape", *mask_input], ["out"], domain="ai.uform", heads=HEADS, variant=v))
    out = helper.make_tensor_value_info("out", TensorProto.UINT16 if handoff else TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph(nodes, "qkv", inputs, [out]), opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.uform", 1)])


def run(lib: OpLibrary, proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.register_custom_ops_library(str(lib.path))
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]  # type: ignore[no-any-return]


def feeds_for(lib: OpLibrary, variant: str, quantized: bool, mask: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((3 * WIDTH, WIDTH)) * 0.2).astype(ml_dtypes.bfloat16)
    packed, scale = lib.pack(variant, w, quantized)
    feeds = {"x": rng.standard_normal((ITEMS * TOKENS, WIDTH)).astype(np.float32), "w": packed,
             "b": (rng.standard_normal(3 * WIDTH) * 0.1).astype(np.float32), "shape": np.array([ITEMS, TOKENS], np.int64),
             "g": (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32), "beta": (0.1 * rng.standard_normal(WIDTH)).astype(np.float32)}  # fmt: skip
    if scale is not None:
        feeds["s"] = scale
    if mask == "padding":  # item i keeps its first 13 - 2 i tokens
        keep = np.arange(TOKENS)[None, :] < (TOKENS - 2 * np.arange(ITEMS))[:, None]
        feeds["mask"] = np.where(keep, 0.0, -1e9).astype(np.float32).reshape(ITEMS, 1, 1, TOKENS)
    elif mask == "causal":
        feeds["mask"] = np.triu(np.full((TOKENS, TOKENS), -1e9, np.float32), 1)
    return feeds


@pytest.mark.parametrize("variant", ALL)
@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "e4m3"])
def test_the_fused_op_gives_the_bits_of_the_product_then_the_attention(variant: str, mask: str, quantized: bool) -> None:
    lib = runnable(variant)
    feeds = feeds_for(lib, variant, quantized, mask)
    bf16_x = variant in BF16_PRODUCTS
    for x_handed, handoff in ((False, False), (True, True), (True, False), (False, True)) if bf16_x else ((False, False),):
        used = {k: v for k, v in feeds.items() if x_handed or k not in ("g", "beta")}
        want = run(lib, model(variant, quantized, False, x_handed, handoff, mask), used)
        for items in (0, 1, 2, 3):  # 0: one chunk (4 MiB of qkv hold every item here)
            got = run(lib, model(variant, quantized, True, x_handed, handoff, mask, items), used)
            if handoff:  # the rows written (the padding rows are not)
                got, want_rows = unlaid(got, ITEMS * TOKENS, WIDTH, variant), unlaid(want, ITEMS * TOKENS, WIDTH, variant)
            else:
                want_rows = want
            assert got.dtype == want_rows.dtype and np.array_equal(got, want_rows), (x_handed, handoff, items)


@needs_library
@pytest.mark.parametrize(
    "attribute, value, message",
    [("activation", 1, "the qkv projection takes no activation"), ("items", -1, "items must be 0 or more")],
)
def test_the_fused_op_refuses_what_it_cannot_take(attribute: str, value: int, message: str) -> None:
    lib = runnable("amx-model")
    proto = model("amx-model", False, True, False, False, "none")
    node = proto.graph.node[0]
    keep = [a for a in node.attribute if a.name != attribute]
    del node.attribute[:]
    node.attribute.extend([*keep, helper.make_attribute(attribute, value)])
    with pytest.raises(Exception) as raised:  # ONNX Runtime's own error types, by the status the op answers
        run(lib, proto, feeds_for(lib, "amx-model", False, "none"))
    assert "ai.uform.QKVAttentionBF16" in str(raised.value) and message in str(raised.value)


@needs_library
@pytest.mark.parametrize("variant", ["amx-model", "avx2"])
def test_every_towers_attention_takes_its_qkv_projection_in(variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lowered for a variant that reads x as BF16, every attention site of every tower is one op
    with its projection (none left reading a float32 qkv); for one that reads float32 (avx2),
    and with ``e4m3.FUSE_QKV`` off, none is."""
    from uform.core import runtime
    from uform.core import safetensors as st
    from uform.core.config import ModelConfig
    from uform.core.host import get_host

    lib = runnable(variant)
    path = make_checkpoint(tmp_path / "small.safetensors", "small", 2)
    container = st.parse(memoryview(path.read_bytes()))
    config = ModelConfig.from_metadata(container.metadata)
    for name, (modality, parsed, specs) in runtime.plan_towers(container, config, get_host()).items():
        graph = runtime.build_graph(name, modality, parsed, config, specs)
        weights = {k: container.array(k) for k in specs}
        for fuse in (True, False):
            monkeypatch.setattr(e4m3, "FUSE_QKV", fuse)
            ops = collections.Counter(n.op_type for n in e4m3.lower(graph, weights, True, variant, lib, 1).graph.graph.node)  # type: ignore[arg-type]
            fused = sum(count for op, count in ops.items() if op.startswith("QKVAttention"))
            plain = ops["Attention"] + ops["AttentionHandoff"]
            together = fuse and variant in BF16_PRODUCTS
            assert (fused, plain) == ((plain + fused, 0) if together else (0, plain)) and plain + fused > 0, (name, fuse, ops)

