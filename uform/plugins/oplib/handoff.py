"""Handing a value to the product that reads it as BF16, rounded once where it is made.

Where the kernels read x rounded to BF16 (``avx512-bf16``, ``amx``, ``amx-model``), a value one
product alone reads as its x is made already rounded, in the layout that product's kernels take
x in, and the product, told the width by its ``k`` attribute, takes it as it is:

- a product's output (a block's fc1, its GELU folded in, read by fc2) becomes
  ``MatMulBF16Handoff`` or ``MatMulE4M3Handoff``;
- a ``LayerNormalization`` over the last axis (each block's two, read by the qkv projection and
  by fc1) becomes ``LayerNormHandoff``, the library's layer norm;
- an ``Attention`` (read by the output projection) becomes ``AttentionHandoff``.

Before, the maker wrote float32, and the product read it, rounded it to BF16 into a buffer of
its own and read that. A handed product gives the same bits (both round to nearest even, once);
the library's layer norm sums in its own order, within a float32 rounding or two of ONNX
Runtime's before the values are rounded to BF16.

Only widths that are a multiple of 32 are handed over; a value anything else reads, or that
the graph answers, is left as it is."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx
from onnx import helper

from uform.plugins.oplib.attention import DOMAIN
from uform.plugins.oplib.epilogues import PRODUCTS
from uform.plugins.oplib.library import BF16_PRODUCTS, VARIANTS
from uform.plugins.oplib.wiring import Wiring

HANDOFF = {"MatMulBF16": "MatMulBF16Handoff", "MatMulE4M3": "MatMulE4M3Handoff"}
WIDTH = 32  # a handed output's width is a multiple of this (a tile's depth)


def hand_over(
    graph: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], variant: str, shape: Callable[[str], tuple[int, ...] | None] = lambda name: None
) -> tuple[list[onnx.NodeProto], set[str]]:  # fmt: skip
    """``nodes`` (``graph``'s, lowered, epilogues folded) with every product, layer norm and
    attention whose output a product alone reads as its x made the handing op, and that reader
    given ``k``; and the names of the values now handed over as BF16 (their float32
    declarations, if ``graph`` has any, no longer hold). ``shape(name)``: a weight's shape (a
    layer norm's scale, a product's matrix), None where unknown. Unchanged for variants that
    read x as float32."""
    out = list(nodes)
    if variant not in BF16_PRODUCTS:
        return out, set()
    wiring = Wiring.of(graph, out)
    handed: set[str] = set()
    for at, node in enumerate(out):
        if not _product(node) or not node.input:
            continue
        x = node.input[0]
        i = wiring.maker(x)
        if i is None or x in node.input[1:]:
            continue
        source = out[i]
        if _product(source):
            n = _attribute(source, "n")
            handing = _copy(source, op_type=HANDOFF[source.op_type])
        elif _layer_norm(source):
            n = _dimension(shape(source.input[1]), 0)
            epsilon = next((helper.get_attribute_value(a) for a in source.attribute if a.name == "epsilon"), 1e-5)
            handing = helper.make_node(
                "LayerNormHandoff", list(source.input), list(source.output), name=source.name, domain=DOMAIN,
                variant=VARIANTS.index(variant), epsilon=float(epsilon),
            )  # fmt: skip
        elif source.domain == DOMAIN and source.op_type == "Attention":
            n = _dimension(shape(node.input[1]), 1)  # the context's width: the reader's k
            handing = _copy(source, op_type="AttentionHandoff")
        else:
            continue
        if n is None or n % WIDTH:
            continue
        out[i] = handing
        out[at] = _copy(node, k=n)
        handed.add(x)
    return out, handed


def _product(node: onnx.NodeProto) -> bool:
    return node.domain == DOMAIN and node.op_type in PRODUCTS


def _layer_norm(node: onnx.NodeProto) -> bool:
    """ONNX's LayerNormalization over the last axis with a scale and a bias, making Y alone."""
    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), -1)
    return node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx") and axis == -1 and len(node.input) == 3 and len(node.output) == 1


def _dimension(shape: tuple[int, ...] | None, axis: int) -> int | None:
    return shape[axis] if shape is not None and len(shape) > axis else None


def _attribute(node: onnx.NodeProto, name: str) -> int | None:
    for a in node.attribute:
        if a.name == name:
            return int(helper.get_attribute_value(a))
    return None


def _copy(node: onnx.NodeProto, op_type: str | None = None, **extra: int) -> onnx.NodeProto:
    """``node`` as another op type, or with ``extra`` attributes."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute} | extra
    return helper.make_node(op_type or node.op_type, list(node.input), list(node.output), name=node.name, domain=node.domain, **attrs)
