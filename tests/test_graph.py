"""The graph builder's shared math: a tower that pools its class token runs its last block
for that token alone (``transformer(..., pick=class_token)``), and answers what the whole
last block answers for it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from uform.core.config import Geometry
from uform.core.graph import GraphBuilder
from uform.core.plugin import stack_tensors
from uform.core.weights import embed

G = Geometry(width=64, depth=2, heads=4, mlp_width=96)


def tower(picked: bool, masked: bool) -> onnx.ModelProto:
    """x [B, T, W] (and lengths [B] when masked) → the projected class token [B, D]."""
    b = GraphBuilder("t")
    x = b.input("x", TensorProto.FLOAT, ["batch", "tokens", G.width])
    mask = None
    if masked:
        lengths = b.input("lengths", TensorProto.INT64, ["batch"])
        mask = b.padding_mask(lengths, b.op("Slice", b.op("Shape", x), b.ints([1]), b.ints([2])))
    if picked:
        embedding = b.projected_embedding(b.transformer(x, "t", G, mask, pick=b.class_token), "t")
    else:
        embedding = b.pooled_embedding(b.transformer(x, "t", G, mask), "t")
    b.output(embedding, "embeddings", None, ["batch", 32])
    rng = np.random.default_rng(0)
    weights = {n: rng.normal(s.mean, max(s.std, 0.05), s.shape).astype(np.float32) for n, s in stack_tensors("t", G, 32).items()}
    assert set(b.weights) <= set(weights)
    return embed(b.build(), {n: weights[n] for n in b.weights}, lambda w: w)


@pytest.mark.parametrize("masked", [False, True])
def test_the_picked_last_block_answers_the_whole_blocks_class_token(masked: bool) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (3, 9, G.width)).astype(np.float32)
    feeds = {"x": x, **({"lengths": np.array([9, 4, 1], np.int64)} if masked else {})}
    full, picked = (ort.InferenceSession(tower(p, masked).SerializeToString()).run(None, feeds)[0] for p in (False, True))
    assert picked.shape == full.shape == (3, 32)
    np.testing.assert_allclose(picked, full, atol=2e-6)
    if masked:  # the padding is unseen: a row of one real token answers what that token alone does
        alone = ort.InferenceSession(tower(True, True).SerializeToString()).run(None, {"x": x[2:, :1], "lengths": np.array([1], np.int64)})[0]
        np.testing.assert_allclose(picked[2:], alone, atol=2e-6)


def test_a_picked_graph_runs_fewer_products_on_the_last_block() -> None:
    """Keys and values for every token, the rest for one: the same Gemm nodes, the last
    block's output projection and MLP on [B, W] (checked by their shapes at run time)."""
    full, picked = tower(False, False), tower(True, False)
    gemms = [[n.input[1] for n in g.graph.node if n.op_type == "Gemm"] for g in (full, picked)]
    assert gemms[0] == gemms[1]
    x = np.random.default_rng(2).normal(0, 1, (2, 5, G.width)).astype(np.float32)
    for model, rows in ((full, 10), (picked, 2)):
        probed = onnx.ModelProto()
        probed.CopyFrom(model)
        fc2 = next(n for n in probed.graph.node if n.op_type == "Gemm" and n.input[1] == "t.blocks.1.mlp.fc2.weight")
        probed.graph.output.append(onnx.helper.make_tensor_value_info(fc2.output[0], TensorProto.FLOAT, None))
        out = ort.InferenceSession(probed.SerializeToString()).run([fc2.output[0]], {"x": x})[0]
        assert out.shape == (rows, G.width)
