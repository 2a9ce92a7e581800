"""Fusing a tower graph's attentions into the op library's ``ai.uform.Attention``.

The graph builder records where each attention is (:data:`uform.core.graph.ATTENTION_SITES`
in the model's metadata): its fused qkv projection, the ``[batch, tokens]`` shape, the
additive mask and the context it makes. Everything that lies between the projection and
the context — reshapes, transposes, the scaled scores, the mask, the softmax, the product
with the values — becomes one node. A site whose intermediate values are read elsewhere,
or whose heads are not a multiple of 16 wide, is left as it is. The op runs the kernel of the
node's ``variant`` (AVX2's or AVX-512's in float32; ``avx512-bf16``: AVX-512's float32 scores
with the values as BF16 products; ``amx``: BF16 tile products with float32 sums and softmax,
docs/op-library.md); the e4m3 backend fuses for every variant in
:data:`uform.plugins.e4m3.FUSED_ATTENTION` (``benchmarks/attention.py`` times each against
ONNX Runtime's unfused ops).
"""

from __future__ import annotations

import json

import onnx
from onnx import helper

from uform.core.graph import ATTENTION_SITES

DOMAIN = "ai.uform"


def fuse_attention(graph: onnx.ModelProto, variant: int) -> onnx.ModelProto:
    """A copy of ``graph`` with every recorded attention as one ``ai.uform.Attention`` node
    running ``variant``'s kernel (an index into :data:`uform.plugins.oplib.library.VARIANTS`)."""
    props = {p.key: p.value for p in graph.metadata_props}
    sites = json.loads(props.get(ATTENTION_SITES, "[]"))
    nodes = list(graph.graph.node)
    producer = {out: i for i, node in enumerate(nodes) for out in node.output}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(i)
    outputs = {o.name for o in graph.graph.output}
    dropped: set[int] = set()
    fused: dict[int, onnx.NodeProto] = {}
    for site in sites:
        context = site["context"]
        if site["head_dim"] % 16 or context not in producer:
            continue
        # what lies between: made from the projection and making the context (the walk back
        # stops at the projection, the walk forward stays within what the walk back found)
        region = _after(site["qkv"], nodes, readers, _before(context, nodes, producer, site["qkv"]))
        made = {out for i in region for out in nodes[i].output} - {context}
        if made & outputs or any(j not in region for name in made for j in readers.get(name, [])):
            continue
        inputs = [site["qkv"], site["shape"]] + ([site["mask"]] if site["mask"] else [])
        end = producer[context]
        dropped |= region - {end}
        fused[end] = helper.make_node("Attention", inputs, [context], name=f"{context}:attention", domain=DOMAIN, heads=site["heads"], variant=variant)
    out = onnx.ModelProto()
    out.CopyFrom(graph)
    del out.graph.node[:]
    out.graph.node.extend(fused.get(i, node) for i, node in enumerate(nodes) if i not in dropped)
    return out


def _after(value: str, nodes: list[onnx.NodeProto], readers: dict[str, list[int]], within: set[int]) -> set[int]:
    """The nodes of ``within`` that read ``value``, directly or through others of them."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        for i in readers.get(stack.pop(), []):
            if i in within and i not in seen:
                seen.add(i)
                stack.extend(nodes[i].output)
    return seen


def _before(value: str, nodes: list[onnx.NodeProto], producer: dict[str, int], stop: str) -> set[int]:
    """The nodes ``value`` is made from, directly or through others, not looking past ``stop``."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        at = stack.pop()
        i = producer.get(at) if at != stop else None
        if i is not None and i not in seen:
            seen.add(i)
            stack.extend(nodes[i].input)
    return seen
