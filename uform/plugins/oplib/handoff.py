"""Handing a product's output to the next product as BF16, rounded once where it is made.

Where the kernels read x rounded to BF16 (``avx512-bf16``, ``amx``, ``amx-model``), a product
whose output one other product alone reads as its x (a block's fc1, its GELU folded in, and fc2)
becomes ``MatMulBF16Handoff`` or ``MatMulE4M3Handoff``: it writes its output rounded to BF16 in
the layout the reading product's kernels take x in, and the reader, told the width by its ``k``
attribute, takes it as it is. Before, the first wrote float32, and the second read it, rounded it
to BF16 into a buffer of its own and read that: at 5,568 rows (64 texts) about a tenth of an
fc2's time on avx512-bf16. The bits are the same: both round to nearest even, once.

Only widths that are a multiple of 32 are handed over (every variant's padded width then is the
width itself); a product whose output anything else reads, or that the graph answers, is left
as it is."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

from uform.plugins.oplib.attention import DOMAIN
from uform.plugins.oplib.epilogues import PRODUCTS
from uform.plugins.oplib.library import BF16_PRODUCTS

HANDOFF = {"MatMulBF16": "MatMulBF16Handoff", "MatMulE4M3": "MatMulE4M3Handoff"}
WIDTH = 32  # a handed output's width is a multiple of this (a tile's depth)


def hand_over(graph: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], variant: str) -> tuple[list[onnx.NodeProto], set[str]]:
    """``nodes`` (``graph``'s, lowered, epilogues folded) with every product whose output
    another product alone reads as its x made the handing op, and that reader given ``k``;
    and the names of the values now handed over as BF16 (their float32 declarations, if
    ``graph`` has any, no longer hold). Unchanged for variants that read x as float32."""
    out = list(nodes)
    if variant not in BF16_PRODUCTS:
        return out, set()
    answered = {o.name for o in graph.graph.output}
    producer = {name: i for i, node in enumerate(out) for name in node.output}
    readers: dict[str, int] = {}
    for node in out:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    handed: set[str] = set()
    for at, node in enumerate(out):
        if not _product(node) or not node.input:
            continue
        x = node.input[0]
        i = producer.get(x)
        if i is None or readers.get(x) != 1 or x in answered or x in node.input[1:]:
            continue
        source = out[i]
        n = _attribute(source, "n")
        if not _product(source) or n is None or n % WIDTH:
            continue
        out[i] = _copy(source, op_type=HANDOFF[source.op_type])
        out[at] = _copy(node, k=n)
        handed.add(x)
    return out, handed


def _product(node: onnx.NodeProto) -> bool:
    return node.domain == DOMAIN and node.op_type in PRODUCTS


def _attribute(node: onnx.NodeProto, name: str) -> int | None:
    for a in node.attribute:
        if a.name == name:
            return int(helper.get_attribute_value(a))
    return None


def _copy(node: onnx.NodeProto, op_type: str | None = None, **extra: int) -> onnx.NodeProto:
    """``node`` as another op type, or with ``extra`` attributes."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute} | extra
    return helper.make_node(op_type or node.op_type, list(node.input), list(node.output), name=node.name, domain=node.domain, **attrs)
