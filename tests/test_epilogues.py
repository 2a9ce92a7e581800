"""The products' epilogues: GELU (exact and tanh's), quick GELU and a residual add inside the
op library's products (every variant this machine runs, against float64), and the graph
rewrite that folds a block's activation and residual ``Add`` nodes into them
(:mod:`uform.plugins.oplib.epilogues`)."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from uform.core.graph import RESIDUAL_SITES
from uform.plugins import e4m3
from uform.plugins.sessions.dequantize import quantize_e4m3
from uform.plugins.oplib.epilogues import fuse_epilogues
from uform.plugins.oplib.library import BF16_PRODUCTS, VARIANTS, OpLibrary

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


def gelu_tanh64(v: np.ndarray) -> np.ndarray:
    """ONNX's Gelu (approximate "tanh") in float64."""
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))  # type: ignore[no-any-return]


def quick_gelu64(v: np.ndarray) -> np.ndarray:
    """x * sigmoid(1.702 x), the factor as the graph's float32 holds it, in float64."""
    return v * 0.5 * (1.0 + np.tanh(float(np.float32(1.702)) * v / 2))  # type: ignore[no-any-return]


ACTIVATIONS = {0: lambda v: v, 1: gelu64, 2: gelu_tanh64, 3: quick_gelu64}


def bf16_range() -> np.ndarray:
    """Every BF16 value in [-16, 16], zeros of both signs, and far values (the last 9)."""
    values = np.arange(0, 0x10000, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    values = values[np.isfinite(values) & (np.abs(values) <= 16)]
    far = np.array([0.0, -0.0, -30.0, -1e4, 40.0, 3e38, -3e38, 1e-30, -1e-30]).astype(ml_dtypes.bfloat16).astype(np.float32)
    return np.concatenate([values, far])  # each a BF16 value, as packed


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("activation", [2, 3], ids=["tanh", "quick"])
def test_tanh_and_quick_gelu_are_exact_to_float32_over_their_whole_range(variant: str, activation: int) -> None:
    """The bounds exact GELU keeps (below), for tanh GELU and quick GELU: each value within
    3e-7 x max(1, |x|) of float64's; the far left exactly 0, the far right exactly x."""
    lib = runnable(variant)
    values = bf16_range()
    n = values.size
    packed, _ = lib.pack(variant, values.reshape(n, 1).astype(ml_dtypes.bfloat16), False)
    y = lib.gemm(variant, np.ones((3, 1), np.float32), packed, n, activation=activation)
    want = ACTIVATIONS[activation](values.astype(np.float64))
    bound = 3e-7 * np.maximum(1.0, np.abs(values))
    assert (np.abs(y - want) <= bound).all(), values[np.argmax(np.abs(y[0] - want) / bound)]
    assert (y[:, n - 9 : n - 7] == 0).all() and (y[:, n - 6] == 0).all() and (y[:, n - 3] == 0).all()  # zeros, -1e4, -3e38
    assert (y[:, n - 5] == 40).all() and (y[:, n - 4] == values[n - 4]).all()  # 40 and 3e38: x


def test_an_activation_the_kernels_do_not_know_is_refused() -> None:
    lib, variant = any_variant()
    packed, _ = lib.pack(variant, np.ones((4, 6), ml_dtypes.bfloat16), False)
    with pytest.raises(ValueError, match=r"^activation must be 0 \(none\), 1 \(GELU\), 2 \(tanh GELU\) or 3 \(quick GELU\), not 4$"):
        lib.gemm(variant, np.ones((2, 6), np.float32), packed, 4, activation=4)


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
        for activation, act in ACTIVATIONS.items():
            y = lib.gemm(variant, x, packed, n, got_scale, bias, threads=2, residual=residual, activation=activation)
            want = act(xs @ want_w.T * want_scale + bias) + residual
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"activation {activation}")


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
    with pytest.raises(Exception, match=r"MatMulBF16: unknown activation 7 \(0: none, 1: GELU, 2: tanh GELU, 3: quick GELU\)"):
        session(product_graph(VARIANTS.index(variant), n, k, activation=7, residual_dims=None))


def lowered_nodes(
    nodes: list[onnx.NodeProto], outputs: list[str], residuals: list[str], constants: dict[str, np.ndarray] | None = None
) -> list[onnx.NodeProto]:
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in (constants or {}).items()]
    graph = helper.make_graph(nodes, "g", [], outs, inits)
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


def test_tanh_gelu_folds_as_activation_2() -> None:
    nodes = [product("h", "a", "fc1"), helper.make_node("Gelu", ["a"], ["g"], approximate="tanh"), product("g", "b", "fc2")]
    fused = lowered_nodes(nodes, ["b"], [])
    assert [(n.op_type, list(n.input), list(n.output)) for n in fused] == [
        ("MatMulE4M3", ["h", "fc1.w", "fc1.s"], ["g"]),
        ("MatMulE4M3", ["g", "fc2.w", "fc2.s"], ["b"]),
    ]
    assert {a.name: a.i for a in fused[0].attribute}["activation"] == 2


FACTOR = {"c": np.float32(1.702)}


def quick_nodes(x_first: bool = True, factor_first: bool = False) -> list[onnx.NodeProto]:
    """fc1 -> Mul(a, Sigmoid(Mul(a, c))) -> fc2, as the graph builder writes quick GELU."""
    inner = ["c", "a"] if factor_first else ["a", "c"]
    return [
        product("h", "a", "fc1"),
        helper.make_node("Mul", inner, ["a_scaled"]),
        helper.make_node("Sigmoid", ["a_scaled"], ["gate"]),
        helper.make_node("Mul", ["a", "gate"] if x_first else ["gate", "a"], ["g"]),
        product("g", "b", "fc2"),
    ]


@pytest.mark.parametrize("x_first", [True, False])
@pytest.mark.parametrize("factor_first", [False, True])
def test_quick_gelu_folds_as_activation_3(x_first: bool, factor_first: bool) -> None:
    """Mul(x, Sigmoid(Mul(x, 1.702))) over fc1's output, either operand order of either Mul:
    three nodes gone, fc1 making the outer Mul's output with activation 3."""
    fused = lowered_nodes(quick_nodes(x_first, factor_first), ["b"], [], FACTOR)
    assert [(n.op_type, list(n.input), list(n.output)) for n in fused] == [
        ("MatMulE4M3", ["h", "fc1.w", "fc1.s"], ["g"]),
        ("MatMulE4M3", ["g", "fc2.w", "fc2.s"], ["b"]),
    ]
    assert {a.name: a.i for a in fused[0].attribute}["activation"] == 3


@pytest.mark.parametrize("case", ["factor 1.7", "factor float64", "factor of two values", "x read thrice", "gate read twice", "gate answered"])
def test_what_is_not_quick_gelu_over_a_product_alone_is_left_as_it_is(case: str) -> None:
    nodes, outputs = quick_nodes(), ["b"]
    constants: dict[str, np.ndarray] = {
        "factor 1.7": {"c": np.float32(1.7)},
        "factor float64": {"c": np.float64(1.702)},
        "factor of two values": {"c": np.array([1.702, 1.702], np.float32)},
    }.get(case, FACTOR)
    if case == "x read thrice":
        nodes.append(helper.make_node("Relu", ["a"], ["spy"]))
        outputs.append("spy")
    elif case == "gate read twice":
        nodes.append(helper.make_node("Relu", ["gate"], ["spy"]))
        outputs.append("spy")
    elif case == "gate answered":
        outputs.append("gate")
    assert lowered_nodes(list(nodes), outputs, [], constants) == nodes


@pytest.mark.parametrize(
    "case",
    ["another reader", "graph output", "gelu of another approximation", "add not recorded", "add of no product"],
)
def test_what_is_not_a_products_alone_is_left_as_it_is(case: str) -> None:
    approximate = "sigmoid" if case == "gelu of another approximation" else "none"
    nodes = [product("h", "a", "fc1"), helper.make_node("Gelu", ["a"], ["g"], approximate=approximate)]
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
        assert sum(len(n.input) == (5 if n.op_type.startswith("MatMulE4M3") else 4) for n in fused) == len(residuals), name
        assert sum(any(a.name == "activation" for a in n.attribute) for n in fused) == before["Gelu"], name


@pytest.mark.parametrize("pattern", ["gelu", "gelu_tanh", "quick_gelu"])
def test_a_lowered_graph_runs_each_activation_inside_its_product(monkeypatch: pytest.MonkeyPatch, pattern: str) -> None:
    """A graph of ``Gemm`` (over a checkpoint matrix) then each activation as the graph builder
    writes it, lowered for this machine's first variant: its product takes the activation
    (no node of it is left) and answers what ONNX Runtime's own nodes answer after the same
    product (lowered with the fusion off), within float32's rounding."""
    import onnxruntime as ort

    lib, variant = any_variant()
    n, k = 48, 64
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((n, k)) * 0.3).astype(ml_dtypes.bfloat16)
    nodes = [helper.make_node("Gemm", ["x", "W"], ["a"], transB=1)]
    constants = []
    if pattern == "quick_gelu":
        constants.append(numpy_helper.from_array(np.asarray(1.702, np.float32), "c"))
        nodes += [helper.make_node("Mul", ["a", "c"], ["s"]), helper.make_node("Sigmoid", ["s"], ["gate"]), helper.make_node("Mul", ["a", "gate"], ["y"])]
    else:
        nodes.append(helper.make_node("Gelu", ["a"], ["y"], approximate="tanh" if pattern == "gelu_tanh" else "none"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, k])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, n])], constants
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    x = rng.standard_normal((5, k)).astype(np.float32) * 2

    def run(fuse: bool) -> tuple[np.ndarray, list[onnx.NodeProto]]:
        monkeypatch.setattr(e4m3, "FUSE_EPILOGUES", fuse)
        low = e4m3.lower(model, {"W": w}, False, variant, lib, 1)
        options = ort.SessionOptions()
        options.register_custom_ops_library(str(lib.path))
        sess = ort.InferenceSession(low.graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return sess.run(None, {"x": x} | low.fed)[0], list(low.graph.graph.node)

    (fused, fused_nodes), (apart, apart_nodes) = run(True), run(False)
    assert [nd.op_type for nd in fused_nodes] == ["MatMulBF16"] and len(apart_nodes) == len(nodes)
    assert {a.name: a.i for a in fused_nodes[0].attribute}["activation"] == {"gelu": 1, "gelu_tanh": 2, "quick_gelu": 3}[pattern]
    np.testing.assert_allclose(fused, apart, rtol=2e-6, atol=2e-6)
