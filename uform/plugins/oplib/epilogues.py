"""Folding what follows a product into the op library's matrix product (its epilogue).

In a lowered tower, a block's ``fc1`` feeds its activation, and its attention's output
projection and ``fc2`` feed the residual adds the graph builder records
(:data:`uform.core.graph.RESIDUAL_SITES`). Each of those becomes part of the ``ai.uform``
product that feeds it: the product's ``activation`` attribute for ONNX's ``Gelu``
(approximate "none": 1, "tanh": 2) and for quick GELU as the graph builder writes it,
``Mul(x, Sigmoid(Mul(x, c)))`` with ``c`` a float32 scalar initializer equal to 1.702 (3), and
the add's other input as the product's ``residual`` (its last input). The product then writes
``act(x W^T + b) + residual`` once, from registers, on the thread that summed it, and ONNX
Runtime runs two to four nodes and as many passes over memory fewer a block. A product whose
output anything else reads, or that the graph answers, is left as it is; so is any other pattern."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from uform.core.graph import RESIDUAL_SITES
from uform.plugins.oplib.attention import DOMAIN
from uform.plugins.oplib.wiring import Wiring

PRODUCTS = ("MatMulBF16", "MatMulE4M3")
GELU, GELU_TANH, QUICK_GELU = 1, 2, 3  # the ops' `activation` attribute (0 or absent: none)
GELUS = {"none": GELU, "tanh": GELU_TANH}  # Gelu's `approximate` attribute -> activation
QUICK = np.float32(1.702)  # quick GELU's factor, as the graph holds it


def fuse_epilogues(graph: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` (``graph``'s, after lowering) with each ``Gelu`` (exact or tanh), each quick
    GELU and each recorded residual ``Add`` folded into the product that alone feeds it."""
    props = {p.key: p.value for p in graph.metadata_props}
    residuals = set(json.loads(props.get(RESIDUAL_SITES, "[]")))
    wiring = Wiring.of(graph, nodes)
    out: list[onnx.NodeProto | None] = list(nodes)
    quick_factors = {t.name for t in graph.graph.initializer if _is_quick_factor(t)}

    def product_alone(value: str, reads: int = 1) -> tuple[int, onnx.NodeProto] | None:
        """The product making ``value`` and its place, when ``reads`` nodes alone read ``value``."""
        i = wiring.maker(value, reads)
        if i is None:
            return None
        node = out[i]
        return (i, node) if node is not None and node.domain == DOMAIN and node.op_type in PRODUCTS else None

    def alone(value: str, op_type: str) -> onnx.NodeProto | None:
        """The ``op_type`` node making ``value``, when one node alone reads it (not yet folded)."""
        i = wiring.maker(value)
        if i is None or out[i] is None:
            return None
        node = out[i]
        return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None

    def quick_gelu(node: onnx.NodeProto) -> tuple[tuple[int, onnx.NodeProto], list[int]] | None:
        """For ``Mul(x, Sigmoid(Mul(x, 1.702)))`` (either operand order) over a product's x read
        by the two Muls alone: the product and the places of the Sigmoid and the inner Mul."""
        if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            return None
        for x, gate in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            sigmoid = alone(gate, "Sigmoid")
            inner = alone(sigmoid.input[0], "Mul") if sigmoid is not None else None
            if sigmoid is None or inner is None or len(inner.input) != 2:
                continue
            a, b = inner.input
            if not (a == x and b in quick_factors or b == x and a in quick_factors):
                continue
            found = product_alone(x, reads=2)
            if found is not None and not _has(found[1], "activation"):
                return found, [wiring.producer[gate], wiring.producer[sigmoid.input[0]]]
        return None

    def fold(at: int, found: tuple[int, onnx.NodeProto], inputs: list[str], **extra: int) -> None:
        """The product ``found`` moved to ``at`` (the folded node's place), making its output."""
        i, product = found
        output = nodes[at].output[0]
        out[at] = _product(product, inputs, output, **extra)
        out[i] = None
        wiring.producer[output] = at

    for at, node in enumerate(nodes):
        if node.op_type == "Gelu" and node.domain in ("", "ai.onnx") and _approximation(node) in GELUS:
            found = product_alone(node.input[0])
            if found is not None and not _has(found[1], "activation"):
                fold(at, found, list(found[1].input), activation=GELUS[_approximation(node)])
        elif (quick := quick_gelu(node)) is not None:
            found, gone = quick
            for i in gone:
                out[i] = None
            fold(at, found, list(found[1].input), activation=QUICK_GELU)
        elif node.op_type == "Add" and node.output[0] in residuals:
            for mine, other in ((0, 1), (1, 0)):
                found = product_alone(node.input[mine])
                if found is None or _residual_of(found[1]) is not None:
                    continue
                inputs = list(found[1].input)
                inputs += [""] * (_bias_at(found[1]) + 1 - len(inputs))  # the bias's place held, empty, when there is none
                fold(at, found, [*inputs, node.input[other]])
                break
    return [node for node in out if node is not None]


def _approximation(node: onnx.NodeProto) -> str:
    for a in node.attribute:
        if a.name == "approximate":
            return helper.get_attribute_value(a).decode()  # type: ignore[no-any-return]
    return "none"


def _is_quick_factor(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` is a float32 scalar (or one value) equal to 1.702 as float32."""
    if tensor.data_type != onnx.TensorProto.FLOAT or int(np.prod(tensor.dims)) != 1 or len(tensor.dims) > 1:
        return False
    return bool(numpy_helper.to_array(tensor).reshape(()) == QUICK)


def _has(node: onnx.NodeProto, attribute: str) -> bool:
    return any(a.name == attribute and helper.get_attribute_value(a) for a in node.attribute)


def _bias_at(product: onnx.NodeProto) -> int:
    return 3 if product.op_type == "MatMulE4M3" else 2


def _residual_of(product: onnx.NodeProto) -> str | None:
    at = _bias_at(product) + 1
    return product.input[at] if len(product.input) > at and product.input[at] else None


def _product(node: onnx.NodeProto, inputs: list[str], output: str, **extra: int) -> onnx.NodeProto:
    """A copy of the product ``node`` with ``inputs``, one ``output`` and ``extra`` attributes."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute} | extra
    return helper.make_node(node.op_type, inputs, [output], name=node.name, domain=node.domain, **attrs)
