"""Folding what follows a product into the op library's matrix product (its epilogue).

In a lowered tower, a block's ``fc1`` feeds an exact ``Gelu``, and its attention's output
projection and ``fc2`` feed the residual adds the graph builder records
(:data:`uform.core.graph.RESIDUAL_SITES`). Each of those becomes part of the ``ai.uform``
product that feeds it: ``activation=1`` for the GELU, the add's other input as the product's
``residual`` (its last input). The product then writes ``act(x W^T + b) + residual`` once,
from registers, on the thread that summed it, and ONNX Runtime runs two nodes and two passes
over memory fewer a block. A product whose output anything else reads, or that the graph
answers, is left as it is; so is a ``Gelu`` of another approximation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import onnx
from onnx import helper

from uform.core.graph import RESIDUAL_SITES
from uform.plugins.attention import DOMAIN

PRODUCTS = ("MatMulBF16", "MatMulE4M3")
GELU = 1  # the ops' `activation` attribute: 0 (or absent) none, 1 exact GELU


def fuse_epilogues(graph: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` (``graph``'s, after lowering) with each exact ``Gelu`` and each recorded
    residual ``Add`` folded into the product that alone feeds it."""
    props = {p.key: p.value for p in graph.metadata_props}
    residuals = set(json.loads(props.get(RESIDUAL_SITES, "[]")))
    answered = {o.name for o in graph.graph.output}
    out: list[onnx.NodeProto | None] = list(nodes)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output}
    readers: dict[str, int] = {}
    for node in nodes:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1

    def product_alone(value: str) -> tuple[int, onnx.NodeProto] | None:
        """The product making ``value`` and its place, when one node alone reads ``value``."""
        i = producer.get(value)
        if i is None or readers.get(value) != 1 or value in answered:
            return None
        node = out[i]
        return (i, node) if node is not None and node.domain == DOMAIN and node.op_type in PRODUCTS else None

    def fold(at: int, found: tuple[int, onnx.NodeProto], inputs: list[str], **extra: int) -> None:
        """The product ``found`` moved to ``at`` (the folded node's place), making its output."""
        i, product = found
        output = nodes[at].output[0]
        out[at] = _product(product, inputs, output, **extra)
        out[i] = None
        producer[output] = at

    for at, node in enumerate(nodes):
        if node.op_type == "Gelu" and node.domain in ("", "ai.onnx") and _approximation(node) == "none":
            found = product_alone(node.input[0])
            if found is not None and not _has(found[1], "activation"):
                fold(at, found, list(found[1].input), activation=GELU)
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
