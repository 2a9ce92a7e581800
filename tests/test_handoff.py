"""Values handed to the product that reads them as BF16 (:mod:`uform.plugins.oplib.handoff`):
a product's output (``MatMulBF16Handoff``, ``MatMulE4M3Handoff``) gives the same bits as its
float32 output rounded by the reader, for every variant whose products read x as BF16
(``amx-model`` on every machine); a layer norm (``LayerNormHandoff``) is float64's rounded to
BF16, the same bits on every variant; whole towers agree with the float32 hand-over; the graph
rewrite's reach; and the ops' refusals, each naming the op and the reason."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import uform
from ckpt import make_checkpoint
from media import encode_image, pattern
from oplibrary import runnable
from uform.plugins import e4m3
from uform.plugins.oplib.handoff import hand_over
from uform.plugins.oplib.library import BF16_PRODUCTS, VARIANTS, OpLibrary

K, N1, N2 = 96, 64, 40  # x's width, the handing product's n (a multiple of 32), the reader's n


def chain(lib: OpLibrary, variant: str, e4m3_weights: bool, handed: bool, activation: int = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x [m, K] -> product 1 (bias, ``activation``) -> product 2 (bias, residual r [m, N2]) -> y,
    the first handing its output to the second where ``handed``; and the weights to feed."""
    rng = np.random.default_rng(11)
    feeds: dict[str, np.ndarray] = {}
    nodes = []
    for i, (n, k) in enumerate(((N1, K), (N2, N1)), start=1):
        w = (rng.standard_normal((n, k)) * 0.2).astype(ml_dtypes.bfloat16)
        packed, scale = lib.pack(variant, w, e4m3_weights)
        feeds[f"W{i}"], feeds[f"b{i}"] = packed, (rng.standard_normal(n) * 0.1).astype(np.float32)
        inputs = ["x" if i == 1 else "h", f"W{i}"]
        if scale is not None:
            feeds[f"s{i}"] = scale
            inputs.append(f"s{i}")
        inputs.append(f"b{i}")
        if i == 2:
            inputs.append("r")
        op = ("MatMulE4M3" if e4m3_weights else "MatMulBF16") + ("Handoff" if handed and i == 1 else "")
        attrs: dict[str, int] = {"variant": VARIANTS.index(variant), "n": n, "threads": 2}
        if i == 1 and activation:
            attrs["activation"] = activation
        if i == 2 and handed:
            attrs["k"] = N1
        nodes.append(helper.make_node(op, inputs, ["h" if i == 1 else "y"], domain="ai.uform", **attrs))
    onnx_type = {np.dtype(np.uint16): TensorProto.UINT16, np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.float32): TensorProto.FLOAT}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", K]), helper.make_tensor_value_info("r", TensorProto.FLOAT, ["m", N2])]
    inputs += [helper.make_tensor_value_info(name, onnx_type[a.dtype], list(a.shape)) for name, a in feeds.items()]
    graph = helper.make_graph(nodes, "chain", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", N2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.uform", 1)]), feeds


def session(lib: OpLibrary, model: onnx.ModelProto, threads: int = 2) -> object:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(str(lib.path))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("variant", sorted(BF16_PRODUCTS))
@pytest.mark.parametrize("weights", ["bf16", "e4m3"])
def test_a_handed_output_gives_the_bits_of_the_float32_one(variant: str, weights: str) -> None:
    """fc1 (GELU) handing to fc2 (residual) answers fc2's float32 chain bit for bit, at 1 to 300
    rows (a tile's 16, partial blocks of rows, several tasks), values large and small."""
    lib = runnable(variant)
    apart, feeds = chain(lib, variant, weights == "e4m3", handed=False)
    handed, _ = chain(lib, variant, weights == "e4m3", handed=True)
    plain, fast = session(lib, apart), session(lib, handed)
    rng = np.random.default_rng(3)
    for m in (1, 13, 16, 17, 87, 300):
        x = (rng.standard_normal((m, K)) * rng.choice([0.01, 1.0, 30.0], (m, 1))).astype(np.float32)
        r = rng.standard_normal((m, N2)).astype(np.float32)
        want = plain.run(None, {"x": x, "r": r} | feeds)[0]  # type: ignore[attr-defined]
        got = fast.run(None, {"x": x, "r": r} | feeds)[0]  # type: ignore[attr-defined]
        assert got.shape == (m, N2)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (m, np.abs(got - want).max())


@pytest.mark.parametrize("variant", sorted(BF16_PRODUCTS))
def test_a_handed_output_is_bf16_in_the_readers_layout(variant: str) -> None:
    """Alone, the handing op answers uint16 [m + 16, n]: in the reader's layout (rows on
    avx512-bf16, blocks of 16 rows on the tiles), each value its float32 output rounded to
    nearest even (the padding rows are the readers' to skip)."""
    lib = runnable(variant)
    model, feeds = chain(lib, variant, False, handed=False)
    feeds = {k: v for k, v in feeds.items() if k.endswith("1")}
    inputs = [i for i in model.graph.input if i.name == "x" or i.name in feeds]

    def alone(op: str, out_type: int) -> object:
        node = onnx.NodeProto()
        node.CopyFrom(model.graph.node[0])
        node.op_type = op
        graph = helper.make_graph([node], "one", inputs, [helper.make_tensor_value_info("h", out_type, None)])
        return session(lib, helper.make_model(graph, opset_imports=list(model.opset_import)))

    x = np.random.default_rng(4).standard_normal((21, K)).astype(np.float32)
    h = alone("MatMulBF16", TensorProto.FLOAT).run(None, {"x": x} | feeds)[0]  # type: ignore[attr-defined]
    b = alone("MatMulBF16Handoff", TensorProto.UINT16).run(None, {"x": x} | feeds)[0]  # type: ignore[attr-defined]
    assert b.dtype == np.uint16 and b.shape == (21 + 16, N1)
    assert np.array_equal(unlaid(b, 21, N1, variant), h.astype(ml_dtypes.bfloat16).view(np.uint16))


def named(graph_nodes: list[onnx.NodeProto], outputs: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(graph_nodes, "g", [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    return helper.make_model(graph)


def product(x: str, out: str, n: int, op: str = "MatMulBF16", extra: tuple[str, ...] = ()) -> onnx.NodeProto:
    return helper.make_node(op, [x, f"W{out}", *extra], [out], domain="ai.uform", variant=5, n=n)


@pytest.mark.parametrize(
    "case", ["handed", "e4m3", "chain", "answered", "two readers", "read as residual", "odd width", "float variant", "not a product"]
)
def test_hand_over_reaches_a_product_that_one_product_alone_reads(case: str) -> None:
    """What the rewrite hands over, and what it leaves: an output the graph answers, one read
    twice (or as a residual), a width not a multiple of 32, float32 variants, other readers."""
    variant, outputs = "amx-model", ["y"]
    op = "MatMulE4M3" if case == "e4m3" else "MatMulBF16"
    nodes = [product("x", "h", 64 if case != "odd width" else 48, op), product("h", "y", 40, op)]
    want = {"h"}
    if case == "chain":
        nodes = [product("x", "a", 64), product("a", "h", 96), product("h", "y", 40)]
        want = {"a", "h"}
    elif case == "answered":
        outputs, want = ["y", "h"], set()
    elif case == "two readers":
        nodes.append(helper.make_node("Relu", ["h"], ["z"]))
        outputs, want = ["y", "z"], set()
    elif case == "read as residual":
        nodes[1] = product("h", "y", 64, extra=("", "h"))
        want = set()
    elif case in ("odd width", "float variant"):
        want = set()
        variant = "avx512" if case == "float variant" else variant
    elif case == "not a product":
        nodes[1] = helper.make_node("Relu", ["h"], ["y"])
        want = set()
    out, handed = hand_over(named(nodes, outputs), nodes, variant)
    assert handed == want
    for before, after in zip(nodes, out):
        attrs = {a.name: helper.get_attribute_value(a) for a in after.attribute}
        assert after.op_type == before.op_type + ("Handoff" if after.output[0] in want else "")
        assert attrs.get("k") == ({"a": 64, "h": 64 if case != "chain" else 96}.get(after.input[0]) if after.input[0] in want else None)
        assert list(after.input) == list(before.input) and list(after.output) == list(before.output)


def test_every_towers_layer_norms_attention_and_fc1_hand_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lowered for a variant that reads x as BF16, each block's fc1 (GELU folded in) hands its
    output to fc2, its attention its context to the output projection, and its two layer norms
    theirs to the qkv projection and fc1; for avx2 (float32 x) nothing is. (The qkv projection
    and attention left two ops: tests/test_qkv.py makes them one.)"""
    lib = runnable("amx-model")
    monkeypatch.setattr(e4m3, "FUSE_QKV", False)
    from uform.core import runtime
    from uform.core import safetensors as st
    from uform.core.config import ModelConfig
    from uform.core.host import get_host

    path = make_checkpoint(tmp_path / "small.safetensors", "small", 2)
    container = st.parse(memoryview(path.read_bytes()))
    config = ModelConfig.from_metadata(container.metadata)
    for name, (modality, parsed, specs) in runtime.plan_towers(container, config, get_host()).items():
        graph = runtime.build_graph(name, modality, parsed, config, specs)
        gelus = sum(n.op_type == "Gelu" for n in graph.graph.node)
        weights = {k: container.array(k) for k in specs}
        for variant, blocks in (("amx-model", gelus), ("avx2", 0)):  # avx2: float32 x, and runnable wherever amx-model is
            low = e4m3.lower(graph, weights, True, variant, lib, 1)  # type: ignore[arg-type]
            ops = collections.Counter(n.op_type for n in low.graph.graph.node)
            readers = [n for n in low.graph.graph.node if any(a.name == "k" for a in n.attribute)]
            handing = [n for n in low.graph.graph.node if n.op_type.endswith("Handoff")]
            assert ops["MatMulE4M3Handoff"] + ops["MatMulBF16Handoff"] == blocks, (name, variant)
            assert ops["LayerNormHandoff"] >= 2 * blocks and len(readers) == len(handing), (name, variant)  # and a final norm before a projection
            # every attention hands its context over, but a last block's that a pick of rows reads first
            assert ops["AttentionHandoff"] + ops["Attention"] == gelus and ops["AttentionHandoff"] >= blocks - 1, (name, variant)
            assert ops["LayerNormalization"] + ops["LayerNormHandoff"] == sum(n.op_type == "LayerNormalization" for n in graph.graph.node)
            assert sorted(n.input[0] for n in readers) == sorted(n.output[0] for n in handing)
            assert all(any(a.name == "activation" for a in n.attribute) for n in low.graph.graph.node if n.op_type.startswith("MatMul") and n.op_type.endswith("Handoff"))
            assert not {v.name for v in low.graph.graph.value_info} & {n.input[0] for n in readers}


def unlaid(out: np.ndarray, m: int, d: int, variant: str) -> np.ndarray:
    """Rows [0, m) of a handed value ([m + 16, d] uint16) as [m, d], from the variant's layout:
    amx's blocks of 16 rows ([d / 32][16][32] each), avx512-bf16's rows."""
    if variant == "avx512-bf16":
        return out[:m]
    rows, cols = np.meshgrid(np.arange(m), np.arange(d), indexing="ij")
    at = ((rows >> 4) * (d >> 5) + (cols >> 5)) * 512 + (rows & 15) * 32 + (cols & 31)
    return out.reshape(-1)[at]  # type: ignore[no-any-return]


def layer_norm_session(lib: OpLibrary, variant: str, d: int, epsilon: float) -> object:
    node = helper.make_node("LayerNormHandoff", ["x", "s", "b"], ["y"], domain="ai.uform", variant=VARIANTS.index(variant), epsilon=epsilon)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in (("x", ["m", d]), ("s", ["d"]), ("b", ["d"]))]
    graph = helper.make_graph([node], "ln", inputs, [helper.make_tensor_value_info("y", TensorProto.UINT16, None)])
    return session(lib, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.uform", 1)]))


@pytest.mark.parametrize("variant", sorted(BF16_PRODUCTS))
def test_a_handed_layer_norm_is_float64s_rounded_to_bf16(variant: str) -> None:
    """Rows of 96 values, spread small and large, about zero and offset, at 1 to 40 rows: each within
    BF16's half step (and a float32 rounding) of float64's layer norm, in the reader's layout;
    and the same bits as amx-model's (the plain build of the normalization)."""
    lib = runnable(variant)
    d, epsilon = 96, 1e-6
    rng = np.random.default_rng(8)
    s = rng.standard_normal(d).astype(np.float32)
    b = (rng.standard_normal(d) * 0.1).astype(np.float32)
    mine, model = layer_norm_session(lib, variant, d, epsilon), layer_norm_session(lib, "amx-model", d, epsilon)
    for m in (1, 13, 16, 17, 40):
        x = (rng.standard_normal((m, d)) * rng.choice([0.1, 1.0, 50.0], (m, 1)) + rng.choice([0.0, 3.0], (m, 1))).astype(np.float32)
        out = mine.run(None, {"x": x, "s": s, "b": b})[0]  # type: ignore[attr-defined]
        assert out.dtype == np.uint16 and out.shape == (m + 16, d)
        got = unlaid(out, m, d, variant)
        x64 = x.astype(np.float64)
        want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + epsilon) * s + b
        values = got.view(ml_dtypes.bfloat16).astype(np.float64)
        assert (np.abs(values - want) <= 2.0**-8 * np.abs(want) + 1e-6).all(), m
        plain = unlaid(model.run(None, {"x": x, "s": s, "b": b})[0], m, d, "amx-model")  # type: ignore[attr-defined]
        assert np.array_equal(got, plain), m


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("handoff") / "tiny.safetensors", "tiny", 5, ["text", "image"])


def loads(checkpoint: Path, quantization: uform.Scalar, variant: str | None) -> Iterator[uform.Model]:
    """The checkpoint loaded without and with the hand-over (``variant``'s kernels, or this machine's)."""
    with pytest.MonkeyPatch.context() as patch:
        if variant is not None:
            patch.setattr(e4m3, "variant_of", lambda cpu_class: variant)
        for hand in (False, True):
            patch.setattr(e4m3, "HAND_OVER", hand)
            with uform.Executor(2) as ex, uform.Model.load_ram(checkpoint, quantization=quantization, executor=ex) as model:
                yield model


@pytest.mark.parametrize("quantization", [uform.Scalar.BF16, uform.Scalar.E4M3], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("variant", ["amx-model", "this machine's"])
def test_towers_handed_over_answer_as_before(tiny: Path, quantization: uform.Scalar, variant: str) -> None:
    """Texts and pictures through both towers, handed over and not: within a float32 rounding
    or two of each other (the layer norms sum in their own order), most values the same bits."""
    if variant == "amx-model":
        runnable("amx-model")
    pictures = [encode_image(pattern(24 + 5 * i, 30 + 3 * i, i), "PNG") for i in range(3)]
    texts = ["", "a", "handed over, once", "x" * 70]
    results = []
    for model in loads(tiny, quantization, variant if variant == "amx-model" else None):
        if variant != "amx-model" and not any(f"{v} kernels" in model.compute for v in BF16_PRODUCTS):
            pytest.skip(f"this machine's kernels read x as float32 ({model.compute}): nothing is handed over")
        text = model.text_encode(texts, uform.Arena()).embeddings
        image = model.image_encode(pictures, uform.Arena()).embeddings
        results.append((np.array(text), np.array(image)))
    for a, b in zip(*results):
        cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert cosine.min() > 0.99999 and np.abs(a - b).max() < 1e-2, (cosine.min(), np.abs(a - b).max())


@pytest.mark.parametrize(
    "case, message",
    [
        ("float variant", "y is handed over as BF16 only by variants whose products read x as BF16, with n a multiple of 32 (avx2, n = 64)"),
        ("odd width", "y is handed over as BF16 only by variants whose products read x as BF16, with n a multiple of 32 (amx-model, n = 40)"),
        ("no k", "x handed over as BF16 needs the attribute k (a multiple of 32)"),
        ("wrong k", "x handed over as BF16 must be [m + 16, k] with k = 32"),
        ("float32 residual of another shape", "residual must have the output's shape [..., n]"),
    ],
)
def test_the_handoff_ops_refuse_what_they_cannot_take(case: str, message: str) -> None:
    """Each refusal names the op and the reason, at session creation or at run."""
    lib = runnable("amx-model")
    variant = "avx2" if case == "float variant" else "amx-model"
    runnable(variant)
    model, feeds = chain(lib, variant, False, handed=True)
    first, second = model.graph.node
    if case == "odd width":
        first.op_type = "MatMulBF16"
        second.op_type = "MatMulBF16Handoff"  # n = 40 for the second
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT16
    for node, name in ((second, "k"),) if case in ("no k", "wrong k") else ():
        keep = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(keep + ([helper.make_attribute("k", 32)] if case == "wrong k" else []))
    x = np.ones((5, K), np.float32)
    r = np.ones((5 if case != "float32 residual of another shape" else 6, N2), np.float32)
    with pytest.raises(Exception) as raised:  # ONNX Runtime's own error types, by the status the op answers
        session(lib, model).run(None, {"x": x, "r": r} | feeds)  # type: ignore[attr-defined]
    assert message in str(raised.value)
    assert ("ai.uform.MatMulBF16" in str(raised.value)) or case == "float variant"


@pytest.mark.parametrize("case", ["handed", "odd width", "unknown width", "two readers", "not the last axis"])
def test_hand_over_reaches_a_layer_norm_that_one_product_alone_reads(case: str) -> None:
    """A layer norm over the last axis, its scale's width known and a multiple of 32, read by
    one product as x: the library's LayerNormHandoff (the same inputs, epsilon kept); else left."""
    ln = helper.make_node("LayerNormalization", ["x", "s", "b"], ["h"], axis=1 if case == "not the last axis" else -1, epsilon=1e-6)
    nodes = [ln, product("h", "y", 40)]
    outputs = ["y"]
    if case == "two readers":
        nodes.append(helper.make_node("Relu", ["h"], ["z"]))
        outputs.append("z")
    widths = {"s": 48 if case == "odd width" else 64}
    out, handed = hand_over(named(nodes, outputs), nodes, "amx-model", lambda name: None if case == "unknown width" or name not in widths else (widths[name],))
    if case != "handed":
        assert handed == set() and out == nodes
        return
    assert handed == {"h"}
    assert out[0].op_type == "LayerNormHandoff" and out[0].domain == "ai.uform" and list(out[0].input) == ["x", "s", "b"]
    attrs = {a.name: helper.get_attribute_value(a) for a in out[0].attribute}
    assert attrs["variant"] == VARIANTS.index("amx-model") and attrs["epsilon"] == pytest.approx(1e-6)
    assert {a.name: helper.get_attribute_value(a) for a in out[1].attribute}["k"] == 64


@pytest.mark.parametrize(
    "case, message",
    [
        ("float variant", "a layer norm is handed over as BF16 only to variants whose products read x as BF16, not avx2"),
        ("odd width", "x must be [..., d] with d a multiple of 32"),
        ("short scale", "scale and bias must be [d]"),
    ],
)
def test_the_layer_norm_op_refuses_what_it_cannot_take(case: str, message: str) -> None:
    lib = runnable("amx-model")
    variant = "avx2" if case == "float variant" else "amx-model"
    runnable(variant)
    d = 48 if case == "odd width" else 64
    with pytest.raises(Exception) as raised:  # ONNX Runtime's own error types, by the status the op answers
        sess = layer_norm_session(lib, variant, d, 1e-5)
        scale = np.ones(d - 1 if case == "short scale" else d, np.float32)
        sess.run(None, {"x": np.ones((3, d), np.float32), "s": scale, "b": scale})  # type: ignore[attr-defined]
    assert "ai.uform.LayerNormHandoff" in str(raised.value) and message in str(raised.value)


def attention_session(lib: OpLibrary, variant: str, op: str, heads: int, width: int) -> object:
    node = helper.make_node(op, ["qkv", "shape"], ["out"], domain="ai.uform", heads=heads, variant=VARIANTS.index(variant))
    inputs = [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["m", 3 * width]), helper.make_tensor_value_info("shape", TensorProto.INT64, [2])]
    out_type = TensorProto.UINT16 if op.endswith("Handoff") else TensorProto.FLOAT
    graph = helper.make_graph([node], "attention", inputs, [helper.make_tensor_value_info("out", out_type, None)])
    return session(lib, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.uform", 1)]))


@pytest.mark.parametrize("variant", sorted(BF16_PRODUCTS))
def test_a_handed_attention_is_its_context_rounded_to_bf16(variant: str) -> None:
    """AttentionHandoff answers uint16 [B * T + 16, W]: Attention's float32 context rounded to
    nearest even, in the reader's layout, bit for bit (3 items of 21 tokens, 2 heads of 32)."""
    lib = runnable(variant)
    heads, width, items, tokens = 2, 64, 3, 21
    qkv = np.random.default_rng(9).standard_normal((items * tokens, 3 * width)).astype(np.float32)
    feeds = {"qkv": qkv, "shape": np.array([items, tokens], np.int64)}
    context = attention_session(lib, variant, "Attention", heads, width).run(None, feeds)[0]  # type: ignore[attr-defined]
    handed = attention_session(lib, variant, "AttentionHandoff", heads, width).run(None, feeds)[0]  # type: ignore[attr-defined]
    assert handed.dtype == np.uint16 and handed.shape == (items * tokens + 16, width)
    assert np.array_equal(unlaid(handed, items * tokens, width, variant), context.astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize(
    "variant, width, message",
    [
        ("avx512", 64, "the context is handed over as BF16 only to variants whose products read x as BF16, not avx512"),
        ("amx-model", 48, "the context is handed over as BF16 only where its width is a multiple of 32"),
    ],
)
def test_the_attention_handoff_refuses_what_it_cannot_take(variant: str, width: int, message: str) -> None:
    lib = runnable(variant)
    with pytest.raises(Exception) as raised:  # ONNX Runtime's own error types, by the status the op answers
        sess = attention_session(lib, variant, "AttentionHandoff", 3 if width == 48 else 2, width)
        sess.run(None, {"qkv": np.ones((4, 3 * width), np.float32), "shape": np.array([1, 4], np.int64)})  # type: ignore[attr-defined]
    assert "ai.uform.AttentionHandoff" in str(raised.value) and message in str(raised.value)
