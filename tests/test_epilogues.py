"""The products' epilogues: exact GELU and a residual add inside the op library's products
(every variant this machine runs, against float64), and the graph rewrite that folds a
block's ``Gelu`` and residual ``Add`` nodes into them (:mod:`uform.plugins.epilogues`)."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from uform.core.graph import RESIDUAL_SITES
from uform.plugins import e4m3
from uform.plugins.dequantize import quantize_e4m3
from uform.plugins.epilogues import fuse_epilogues
from uform.plugins.oplib import BF16_PRODUCTS, VARIANTS, OpLibrary

from oplibrary import LIBRARY, WHY_NOT, runnable


def any_variant() -> tuple[OpLibrary, str]:
    """The library and the first variant this machine runs (skips where there is none)."""
    if LIBRARY is None or not LIBRARY.runnable:
        pytest.skip(f"the op library is not usable here: {WHY_NOT}")
    return LIBRARY, sorted(LIBRARY.runnable)[0]


def gelu64(v: np.ndarray) -> np.ndarray:
    """ONNX's Gelu (approximate "none") in float64."""
    erf = np.vectorize(math.erf)
    return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))  # type: ignore[no-any-return]


@pytest.mark.parametrize("variant", VARIANTS)
def test_gelu_is_exact_to_float32_over_its_whole_range(variant: str) -> None:
    """Every BF16 value in [-16, 16], zeros of both signs, and far values: each GELU within
    3e-7 x max(1, |x|) of float64's (the left tail tends to zero, not to cancellation)."""
    lib = runnable(variant)
    values = np.arange(0, 0x10000, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    values = values[np.isfinite(values) & (np.abs(values) <= 16)]
    far = np.array([0.0, -0.0, -30.0, -1e4, 40.0, 3e38, -3e38, 1e-30, -1e-30]).astype(ml_dtypes.bfloat16).astype(np.float32)
    values = np.concatenate([values, far])  # each a BF16 value, as packed
    n = values.size
    packed, _ = lib.pack(variant, values.reshape(n, 1).astype(ml_dtypes.bfloat16), False)
    y = lib.gemm(variant, np.ones((3, 1), np.float32), packed, n, gelu=True)
    want = gelu64(values.astype(np.float64))
    bound = 3e-7 * np.maximum(1.0, np.abs(values))
    assert (np.abs(y - want) <= bound).all(), values[np.argmax(np.abs(y[0] - want) / bound)]
    assert (y[:, values.size - 9 : values.size - 7] == 0).all()  # zeros (a sum of -0 over +0 is +0)
    assert (y[:, values.size - 6] == 0).all() and (y[:, values.size - 5] == 40).all()  # the far left is 0, the far right x


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m", [1, 6, 7, 13, 17, 97])
def test_products_add_the_residual_after_the_activation(variant: str, m: int) -> None:
    """``act(scale * x W^T + bias) + residual`` at row counts around each variant's tiles,
    odd n and k, BF16 and E4M3 weights, against float64."""
    lib = runnable(variant)
    n, k = 45, 771
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16)
    bias = rng.standard_normal(n).astype(np.float32)
    residual = rng.standard_normal((m, n)).astype(np.float32)
    codes, scale = quantize_e4m3(w)
    decoded = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    xs = x.astype(ml_dtypes.bfloat16).astype(np.float64) if variant in BF16_PRODUCTS else x.astype(np.float64)
    for quantized, want_w, want_scale in ((False, w.astype(np.float64), 1.0), (True, decoded, scale.astype(np.float64))):
        packed, got_scale = lib.pack(variant, w, quantized, threads=2)
        for gelu in (False, True):
            y = lib.gemm(variant, x, packed, n, got_scale, bias, threads=2, residual=residual, gelu=gelu)
            pre = xs @ want_w.T * want_scale + bias
            want = (gelu64(pre) if gelu else pre) + residual
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_residual_of_another_shape_is_refused() -> None:
    lib, variant = any_variant()
    packed, _ = lib.pack(variant, np.ones((4, 6), ml_dtypes.bfloat16), False)
    with pytest.raises(ValueError, match=r"residual must be a C-contiguous float32 \[2, 4\]"):
        lib.gemm(variant, np.ones((2, 6), np.float32), packed, 4, residual=np.ones((2, 5), np.float32))


def product_graph(variant: int, n: int, k: int, *, activation: int | None, residual_dims: list[int] | None) -> onnx.ModelProto:
    """One ``MatMulBF16`` node: x [2, k], packed w, bias, and a residual of ``residual_dims``."""
    inputs = ["x", "w", "bias"] + (["r"] if residual_dims else [])
    attrs = {"variant": variant, "n": n} | ({"activation": activation} if activation is not None else {})
    node = helper.make_node("MatMulBF16", inputs, ["y"], domain="ai.uform", **attrs)
    declared = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k]),
        helper.make_tensor_value_info("w", TensorProto.UINT16, None),
        helper.make_tensor_value_info("bias", TensorProto.FLOAT, [n]),
    ] + ([helper.make_tensor_value_info("r", TensorProto.FLOAT, residual_dims)] if residual_dims else [])
    graph = helper.make_graph([node], "g", declared, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.uform", 1)])


def session(model: onnx.ModelProto) -> object:
    import onnxruntime as ort

    assert LIBRARY is not None
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(LIBRARY.path))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_the_op_computes_its_epilogue_and_refuses_what_does_not_fit() -> None:
    """Through ONNX Runtime: GELU then the residual, as the kernels alone; a residual whose
    shape is not the output's, and an activation the op does not know, are refused by name."""
    lib, variant = any_variant()
    n, k = 5, 6
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((n, k)) * 0.3).astype(ml_dtypes.bfloat16)
    packed, _ = lib.pack(variant, w, False)
    x, bias, r = rng.standard_normal((2, k)).astype(np.float32), rng.standard_normal(n).astype(np.float32), rng.standard_normal((2, n)).astype(np.float32)
    feed = {"x": x, "w": packed, "bias": bias}
    got = session(product_graph(VARIANTS.index(variant), n, k, activation=1, residual_dims=[2, n])).run(None, feed | {"r": r})[0]  # type: ignore[attr-defined]
    np.testing.assert_array_equal(got, lib.gemm(variant, x, packed, n, bias=bias, residual=r, gelu=True))
    wrong = session(product_graph(VARIANTS.index(variant), n, k, activation=None, residual_dims=[1, 2, n]))
    with pytest.raises(Exception, match=r"MatMulBF16: residual must have the output's shape \[\.\.\., n\]"):
        wrong.run(None, feed | {"r": r[None]})  # type: ignore[attr-defined]
    with pytest.raises(Exception, match=r"MatMulBF16: unknown activation 7 \(0: none, 1: GELU\)"):
        session(product_graph(VARIANTS.index(variant), n, k, activation=7, residual_dims=None))


def lowered_nodes(nodes: list[onnx.NodeProto], outputs: list[str], residuals: list[str]) -> list[onnx.NodeProto]:
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    model = helper.make_model(graph)
    helper.set_model_props(model, {RESIDUAL_SITES: json.dumps(residuals)})
    return fuse_epilogues(model, nodes)


def product(x: str, out: str, name: str) -> onnx.NodeProto:
    return helper.make_node("MatMulE4M3", [x, f"{name}.w", f"{name}.s"], [out], name=name, domain="ai.uform", variant=0, n=4)


def test_gelu_and_residual_fold_into_the_product_that_alone_feeds_them() -> None:
    """fc1 → Gelu and fc2 → Add(stream, ·): each folded, placed where the folded node was; the
    bias's place kept empty where the product has none."""
    nodes = [
        product("h", "a", "fc1"),
        helper.make_node("Gelu", ["a"], ["g"], approximate="none"),
        product("g", "b", "fc2"),
        helper.make_node("Add", ["stream", "b"], ["out"]),
    ]
    fused = lowered_nodes(nodes, ["out"], ["out"])
    assert [(n.op_type, list(n.input), list(n.output)) for n in fused] == [
        ("MatMulE4M3", ["h", "fc1.w", "fc1.s"], ["g"]),
        ("MatMulE4M3", ["g", "fc2.w", "fc2.s", "", "stream"], ["out"]),
    ]
    assert {a.name: a.i for a in fused[0].attribute}["activation"] == 1
    assert "activation" not in {a.name for a in fused[1].attribute}


@pytest.mark.parametrize(
    "case",
    ["another reader", "graph output", "tanh gelu", "add not recorded", "add of no product"],
)
def test_what_is_not_a_products_alone_is_left_as_it_is(case: str) -> None:
    nodes = [product("h", "a", "fc1"), helper.make_node("Gelu", ["a"], ["g"], approximate="tanh" if case == "tanh gelu" else "none")]
    outputs, residuals = ["g"], []
    if case == "another reader":
        nodes.append(helper.make_node("Relu", ["a"], ["spy"]))
        outputs.append("spy")
    elif case == "graph output":
        outputs.append("a")
    elif case in ("add not recorded", "add of no product"):
        nodes = [product("h", "a", "fc1"), helper.make_node("Add", ["stream", "a" if case == "add not recorded" else "h"], ["out"])]
        outputs, residuals = ["out"], ["out"] if case == "add of no product" else []
    assert lowered_nodes(list(nodes), outputs, residuals) == nodes


def test_every_gelu_and_residual_of_every_tower_is_folded(tmp_path: Path) -> None:
    """The towers the e4m3 backend lowers keep no exact Gelu and no recorded residual Add."""
    lib, variant = any_variant()
    from ckpt import make_checkpoint
    from uform.core import runtime
    from uform.core import safetensors as st
    from uform.core.config import ModelConfig
    from uform.core.host import get_host

    path = make_checkpoint(tmp_path / "small.safetensors", "small", 2)
    container = st.parse(memoryview(path.read_bytes()))
    config = ModelConfig.from_metadata(container.metadata)
    for name, (modality, parsed, specs) in runtime.plan_towers(container, config, get_host()).items():
        graph = runtime.build_graph(name, modality, parsed, config, specs)
        residuals = json.loads({p.key: p.value for p in graph.metadata_props}.get(RESIDUAL_SITES, "[]"))
        before = collections.Counter(n.op_type for n in graph.graph.node)
        lowered = e4m3.lower(graph, {k: container.array(k) for k in specs}, True, variant, lib, 1)  # type: ignore[arg-type]
        after = collections.Counter(n.op_type for n in lowered.graph.graph.node)
        fused = [n for n in lowered.graph.graph.node if n.domain == "ai.uform" and n.op_type.startswith("MatMul")]
        assert before["Gelu"] > 0 and after["Gelu"] == 0, name
        assert len(residuals) == 2 * before["Gelu"], name  # two a block
        assert not {n.output[0] for n in lowered.graph.graph.node if n.op_type == "Add"} & set(residuals), name
        assert sum(len(n.input) == (5 if n.op_type == "MatMulE4M3" else 4) for n in fused) == len(residuals), name
        assert sum(any(a.name == "activation" for a in n.attribute) for n in fused) == before["Gelu"], name
