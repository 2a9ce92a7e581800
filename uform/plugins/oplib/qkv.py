"""A block's qkv projection and its attention as one op, where that attention alone reads it.

``MatMulBF16`` (or ``MatMulE4M3``) making ``qkv`` and the ``Attention`` (or ``AttentionHandoff``)
reading it become ``QKVAttentionBF16`` (``...E4M3``, ``...Handoff``): the library's op runs the
projection and the attention a chunk of items at a time, so that a chunk's qkv goes from the
product to the attention through the caches, not through memory (a float32 ``[B·T, 3W]`` of
51 MiB a block at 64 base texts). The same bits: a product's row is the same whatever rows
beside it, and an attention task reads its own item's rows alone.

Inputs ``x, W, shape, scale (E4M3), bias?, mask?``; the attributes of both ops. A projection
with an activation or a residual, one whose output anything else reads or the graph answers,
is left as it is; so is every one for the variants whose products read x as float32 (``avx2``,
``avx512``): there the op runs (and is tested) too, but 64 base texts took 1.014x the time
through ``avx2`` in the x86-64-v3 CPUID view (Zen 5), against 0.983x through ``avx512-bf16``."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

from uform.plugins.oplib.attention import DOMAIN
from uform.plugins.oplib.library import BF16_PRODUCTS
from uform.plugins.oplib.wiring import Wiring

FUSED = {
    ("MatMulBF16", "Attention"): "QKVAttentionBF16",
    ("MatMulE4M3", "Attention"): "QKVAttentionE4M3",
    ("MatMulBF16", "AttentionHandoff"): "QKVAttentionBF16Handoff",
    ("MatMulE4M3", "AttentionHandoff"): "QKVAttentionE4M3Handoff",
}


def fuse_qkv(graph: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], variant: str) -> list[onnx.NodeProto]:
    """``nodes`` (``graph``'s, lowered, handed over) with each attention and the projection that
    alone feeds it made one op, where ``variant``'s products read x as BF16."""
    if variant not in BF16_PRODUCTS:
        return list(nodes)
    wiring = Wiring.of(graph, nodes)
    out: list[onnx.NodeProto | None] = list(nodes)
    for at, attention in enumerate(nodes):
        if attention.domain != DOMAIN or attention.op_type not in ("Attention", "AttentionHandoff") or not attention.input:
            continue
        i = wiring.maker(attention.input[0])
        if i is None:
            continue
        product = nodes[i]
        op = FUSED.get((product.op_type, attention.op_type)) if product.domain == DOMAIN else None
        attrs = {a.name: helper.get_attribute_value(a) for a in product.attribute}
        if op is None or attrs.get("activation", 0) != 0:
            continue
        e4m3 = product.op_type == "MatMulE4M3"
        bias_at = 3 if e4m3 else 2
        if len(product.input) > bias_at + 1 and product.input[bias_at + 1]:  # a residual
            continue
        bias = product.input[bias_at] if len(product.input) > bias_at else ""
        mask = attention.input[2] if len(attention.input) > 2 else ""
        inputs = [product.input[0], product.input[1], attention.input[1], *([product.input[2]] if e4m3 else []), bias, mask]
        while inputs[-1] == "":
            inputs.pop()
        heads = next(helper.get_attribute_value(a) for a in attention.attribute if a.name == "heads")
        out[at] = helper.make_node(op, inputs, list(attention.output), name=attention.name, domain=DOMAIN, **attrs, heads=heads)
        out[i] = None
    return [node for node in out if node is not None]
