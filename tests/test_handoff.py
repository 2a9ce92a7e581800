"""A product's output handed to the next product as BF16 (``MatMulBF16Handoff``,
``MatMulE4M3Handoff``; :mod:`uform.plugins.oplib.handoff`): the same bits as the float32 output
rounded by the reader, for every variant whose products read x as BF16 (``amx-model`` on every
machine), in two-product graphs and whole towers; the graph rewrite's reach; and the ops'
refusals, each naming the op and the reason."""

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


def test_a_handed_output_is_bf16_in_the_readers_layout() -> None:
    """Alone, the handing op answers uint16 [m + 16, n]: on avx512-bf16 row by row, each value
    its float32 output rounded to nearest even (the padding rows are the readers' to skip)."""
    lib = runnable("avx512-bf16")
    model, feeds = chain(lib, "avx512-bf16", False, handed=False)
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
    assert np.array_equal(b[:21], h.astype(ml_dtypes.bfloat16).view(np.uint16))


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


def test_every_towers_fc1_hands_to_its_fc2(tmp_path: Path) -> None:
    """Lowered for a variant that reads x as BF16, each block's fc1 (GELU folded in) hands its
    output to fc2 and nothing else is handed; for avx512 (float32 x) nothing is."""
    lib = runnable("amx-model")
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
        for variant, want in (("amx-model", gelus), ("avx512", 0)):
            low = e4m3.lower(graph, weights, True, variant, lib, 1)  # type: ignore[arg-type]
            ops = collections.Counter(n.op_type for n in low.graph.graph.node)
            readers = [n for n in low.graph.graph.node if any(a.name == "k" for a in n.attribute)]
            assert ops["MatMulE4M3Handoff"] + ops["MatMulBF16Handoff"] == want == len(readers), (name, variant)
            assert all(any(a.name == "activation" for a in n.attribute) for n in low.graph.graph.node if n.op_type.endswith("Handoff"))
            assert not {v.name for v in low.graph.graph.value_info} & {n.input[0] for n in readers}


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
def test_towers_give_the_same_bits_handed_over(tiny: Path, quantization: uform.Scalar, variant: str) -> None:
    """Texts and pictures through both towers, handed over and not: the same bits."""
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
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


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
