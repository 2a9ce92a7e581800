"""Building tower graphs with ``onnx``: the op helpers and the transformer every tower shares.

A tower graph's weights are named exactly like the checkpoint's tensors and are declared
here without data; the backend binds their data (see ``weights.py``). Small constants
(shapes, scales) are embedded. Activations are 2-D ``[batch * tokens, width]`` between
blocks so that every linear layer is one ``Gemm`` with ``transB=1`` over the checkpoint's
``[out, in]`` matrices.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .config import LAYER_NORM_EPS, Geometry, Head

OPSET = 21
NEG_INF = -1e9
QUICK_GELU = 1.702  # quick GELU: x * sigmoid(1.702 x)
# metadata key: a JSON list of the graph's attentions, each the names of its fused qkv
# projection, the [batch, tokens] shape, the additive mask ("" for none) and the context
# ([batch * tokens, width]) with the head count and width. The graph itself stays standard ONNX; a
# backend may replace what lies between qkv and context with one op of its own.
ATTENTION_SITES = "uform.attention_sites"
# metadata key: a JSON list of the outputs of the graph's residual adds, each ``Add(x, f(x))``
# of two values of one shape (a block's stream and what a sublayer adds to it): a backend
# may add x inside the product that makes f(x).
RESIDUAL_SITES = "uform.residual_sites"
Dim = int | str | None


class GraphBuilder:
    """Accumulates nodes, inputs, outputs, embedded constants and weight references."""

    def __init__(self, name: str, float_type: int = TensorProto.FLOAT) -> None:
        self.name = name
        self.float_type = float_type
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.constants: list[onnx.TensorProto] = []
        self.weights: dict[str, None] = {}  # ordered set of referenced checkpoint tensors
        # where attention(): the value names a backend needs to run an attention as one op
        self.attention_sites: list[dict[str, Any]] = []
        # where residual(): the outputs of adds whose two inputs have one shape
        self.residual_sites: list[str] = []
        self._count = 0

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def input(self, name: str, elem_type: int, dims: Sequence[Dim]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(dims)))
        return name

    def output(self, value: str, name: str, elem_type: int | None, dims: Sequence[Dim]) -> str:
        self.nodes.append(helper.make_node("Identity", [value], [name], name=f"{name}_out"))
        self.outputs.append(helper.make_tensor_value_info(name, elem_type or self.float_type, list(dims)))
        return name

    def weight(self, name: str) -> str:
        self.weights[name] = None
        return name

    def const(self, value: Any, hint: str = "const", dtype: Any = None) -> str:
        array = np.asarray(value, dtype=dtype)
        name = self._fresh(hint)
        self.constants.append(numpy_helper.from_array(array, name))
        return name

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(values, dtype=np.int64), "shape")

    def scalar(self, value: float) -> str:
        """A float constant in the graph's float type."""
        name = self.const(np.asarray(value, dtype=np.float32), "scalar")
        if self.float_type == TensorProto.FLOAT:
            return name
        return self.op("Cast", name, to=self.float_type)  # type: ignore[no-any-return]

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: Any) -> Any:
        names = [self._fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0], **attrs))
        return names[0] if outputs == 1 else names

    # -- layers --------------------------------------------------------------------------

    def linear(self, x: str, prefix: str, bias: bool = True) -> str:
        """``x @ W.T + b`` for a 2-D ``x`` and a checkpoint matrix ``W`` of shape [out, in]."""
        args = [x, self.weight(f"{prefix}.weight")]
        if bias:
            args.append(self.weight(f"{prefix}.bias"))
        return self.op("Gemm", *args, transB=1)  # type: ignore[no-any-return]

    def residual(self, x: str, update: str) -> str:
        """``x + update`` for two values of one shape (a residual site)."""
        out: str = self.op("Add", x, update)
        self.residual_sites.append(out)
        return out

    def layer_norm(self, x: str, prefix: str, eps: float = LAYER_NORM_EPS) -> str:
        w, b = self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias")
        return self.op("LayerNormalization", x, w, b, axis=-1, epsilon=eps)  # type: ignore[no-any-return]

    def gelu(self, x: str) -> str:
        """Exact GELU, ``0.5 x (1 + erf(x / sqrt 2))``: the standard ``Gelu`` op (opset 20)."""
        return self.op("Gelu", x, approximate="none")  # type: ignore[no-any-return]

    def activate(self, x: str, activation: str) -> str:
        """The MLP's activation, in the exact patterns a backend's epilogue fusion looks for:
        ``gelu`` ``Gelu(approximate="none")``, ``gelu_tanh`` ``Gelu(approximate="tanh")``,
        ``quick_gelu`` ``Mul(x, Sigmoid(Mul(x, 1.702)))`` (a float32 scalar constant)."""
        if activation == "gelu":
            return self.gelu(x)
        if activation == "gelu_tanh":
            return self.op("Gelu", x, approximate="tanh")  # type: ignore[no-any-return]
        if activation == "quick_gelu":
            return self.op("Mul", x, self.op("Sigmoid", self.op("Mul", x, self.scalar(QUICK_GELU))))  # type: ignore[no-any-return]
        raise ValueError(f"unknown activation {activation!r}")

    def mlp(self, x: str, prefix: str, g: Geometry) -> str:
        """``fc2(act(fc1(x)))``."""
        return self.linear(self.activate(self.linear(x, f"{prefix}.fc1"), g.activation), f"{prefix}.fc2")

    def l2_normalize(self, x: str) -> str:
        """Rows divided by their L2 norm (floored at 1e-12)."""
        norm = self.op("ReduceL2", x, self.ints([-1]), keepdims=1)
        return self.op("Div", x, self.op("Max", norm, self.scalar(1e-12)))  # type: ignore[no-any-return]

    def padding_mask(self, lengths: str, tokens: str) -> str:
        """Additive mask [B, 1, 1, T]: 0 where ``position < lengths[b]``, -1e9 elsewhere."""
        positions = self.op("Range", self.const(np.int64(0)), tokens, self.const(np.int64(1)))
        valid = self.op("Less", self.op("Unsqueeze", positions, self.ints([0])), self.op("Unsqueeze", lengths, self.ints([1])))
        invalid = self.op("Cast", self.op("Not", valid), to=self.float_type)
        return self.op("Unsqueeze", self.op("Mul", invalid, self.scalar(NEG_INF)), self.ints([1, 2]))  # type: ignore[no-any-return]

    def causal_mask(self, tokens: str) -> str:
        """Additive mask [T, T]: -1e9 above the diagonal, so a token sees itself and earlier ones."""
        square = self.op("Concat", tokens, tokens, axis=0)
        ones = self.op("ConstantOfShape", square, value=numpy_helper.from_array(np.ones(1, np.float32)))
        upper = self.op("Trilu", ones, self.const(np.int64(1)), upper=1)
        return self.op("Mul", self.op("Cast", upper, to=self.float_type), self.scalar(NEG_INF))  # type: ignore[no-any-return]

    def attention(self, x: str, prefix: str, g: Geometry, bt: str, mask: str | None) -> str:
        return self.linear(self.attention_context(x, prefix, g, bt, mask), f"{prefix}.out")

    def attention_context(self, x: str, prefix: str, g: Geometry, bt: str, mask: str | None) -> str:
        """Every token's attention context before the output projection: [B*T, W] (an attention site)."""
        projected = self.linear(x, f"{prefix}.qkv")
        split_shape = self.op("Concat", bt, self.ints([3, g.heads, g.head_dim]), axis=0)
        qkv = self.op("Transpose", self.op("Reshape", projected, split_shape), perm=[2, 0, 3, 1, 4])
        q, k, v = (self.op("Squeeze", part, self.ints([0])) for part in self.op("Split", qkv, axis=0, outputs=3))
        q = self.op("Mul", q, self.scalar(1 / np.sqrt(g.head_dim)))
        scores = self.op("MatMul", q, self.op("Transpose", k, perm=[0, 1, 3, 2]))
        if mask is not None:
            scores = self.op("Add", scores, mask)
        context = self.op("MatMul", self.op("Softmax", scores, axis=-1), v)
        context = self.op("Reshape", self.op("Transpose", context, perm=[0, 2, 1, 3]), self.ints([-1, g.width]))
        self.attention_sites.append({"qkv": projected, "shape": bt, "mask": mask or "", "context": context, "heads": g.heads, "head_dim": g.head_dim})
        return context  # type: ignore[no-any-return]

    def block(self, x: str, prefix: str, g: Geometry, bt: str, mask: str | None) -> str:
        """Pre-norm block: ``x + attn(ln1(x))`` then ``x + fc2(gelu(fc1(ln2(x))))``; post-norm
        (``g.norm`` ``post``): ``ln1(x + attn(x))`` then ``ln2(x + fc2(gelu(fc1(x))))``."""
        eps = g.layer_norm_eps
        if g.norm == "post":
            x = self.layer_norm(self.residual(x, self.attention(x, f"{prefix}.attn", g, bt, mask)), f"{prefix}.ln1", eps)
            return self.layer_norm(self.residual(x, self.mlp(x, f"{prefix}.mlp", g)), f"{prefix}.ln2", eps)
        x = self.residual(x, self.attention(self.layer_norm(x, f"{prefix}.ln1", eps), f"{prefix}.attn", g, bt, mask))
        return self.residual(x, self.mlp(self.layer_norm(x, f"{prefix}.ln2", eps), f"{prefix}.mlp", g))

    def end_of_stack(self, h: str, prefix: str, g: Geometry) -> str:
        """``prefix.ln_final`` of the stack's output ``h``; a post-norm stack's ends in its last block."""
        return self.layer_norm(h, f"{prefix}.ln_final", g.layer_norm_eps) if g.norm == "pre" else h

    def transformer(self, x: str, prefix: str, g: Geometry, mask: str | None = None, pick: Callable[[str], str] | None = None) -> str:
        """Run ``prefix.blocks.*`` then ``prefix.ln_final`` over ``x`` [B, T, W]; answer [B, T, W].

        With ``pick`` (e.g. :meth:`class_token`), answer [B, W]: the token ``pick`` takes from
        each row, its last block run for that token alone (:meth:`picked_block`)."""
        shape = self.op("Shape", x)
        bt = self.op("Slice", shape, self.ints([0]), self.ints([2]))
        h = self.op("Reshape", x, self.ints([-1, g.width]))
        for i in range(g.depth - (pick is not None)):
            h = self.block(h, f"{prefix}.blocks.{i}", g, bt, mask)
        if pick is not None:
            return self.end_of_stack(self.picked_block(h, f"{prefix}.blocks.{g.depth - 1}", g, shape, pick, mask), prefix, g)
        return self.op("Reshape", self.end_of_stack(h, prefix, g), shape)  # type: ignore[no-any-return]

    def picked_block(self, h: str, prefix: str, g: Geometry, shape: str, pick: Callable[[str], str], mask: str | None) -> str:
        """Block ``prefix`` for one token of each row: ``h`` [B*T, W] → [B, W].

        ``pick`` takes the token from a [B, T, C] value ([B, C]); ``shape`` is [B, T, W]; ``mask``
        the block's additive mask. The attention runs as in every block (an attention site,
        its context the same bits whatever the batch); the output projection and the MLP run
        for the picked token alone: ``block``'s math for one token of T, without three
        quarters of a block's products."""
        bt = self.op("Slice", shape, self.ints([0]), self.ints([2]))
        eps = g.layer_norm_eps
        post = g.norm == "post"
        context = self.attention_context(h if post else self.layer_norm(h, f"{prefix}.ln1", eps), f"{prefix}.attn", g, bt, mask)
        mine = pick(self.op("Reshape", h, shape))
        mine = self.residual(mine, self.linear(pick(self.op("Reshape", context, shape)), f"{prefix}.attn.out"))
        if post:
            mine = self.layer_norm(mine, f"{prefix}.ln1", eps)
            return self.layer_norm(self.residual(mine, self.mlp(mine, f"{prefix}.mlp", g)), f"{prefix}.ln2", eps)
        return self.residual(mine, self.mlp(self.layer_norm(mine, f"{prefix}.ln2", eps), f"{prefix}.mlp", g))

    def class_token(self, x: str) -> str:
        """The first (class) token of each row of ``x`` [B, T, C]: [B, C] (a ``pick``)."""
        return self.op("Gather", x, self.const(np.int64(0)), axis=1)  # type: ignore[no-any-return]

    def pooled_embedding(self, hidden: str, prefix: str) -> str:
        """The first (class) token of ``hidden`` [B, T, W], projected and L2-normalised: [B, D]."""
        return self.projected_embedding(self.class_token(hidden), prefix)

    def token_at(self, indices: str) -> Callable[[str], str]:
        """A ``pick`` taking token ``indices[b]`` (int64 [B]) of each row ``b``."""
        at = self.op("Unsqueeze", indices, self.ints([1]))
        return lambda x: self.op("GatherND", x, at, batch_dims=1)

    def last_position(self, x: str) -> str:
        """The last token of each row of ``x`` [B, T, C]: [B, C] (a ``pick``)."""
        return self.op("Gather", x, self.const(np.int64(-1)), axis=1)  # type: ignore[no-any-return]

    def projected_embedding(self, pooled: str, prefix: str, projection: str = "linear") -> str:
        """``pooled`` [B, W] (e.g. ``transformer(..., pick=class_token)``) projected (``linear``: no
        bias; ``linear_bias``; ``mlp``: ``Linear(ReLU(Linear(x; projection.0)); projection.1)``,
        both with bias; ``none``: as it is) and L2-normalised: [B, D]."""
        if projection == "mlp":
            hidden = self.op("Relu", self.linear(pooled, f"{prefix}.projection.0"))
            pooled = self.linear(hidden, f"{prefix}.projection.1")
        elif projection != "none":
            pooled = self.linear(pooled, f"{prefix}.projection", bias=projection == "linear_bias")
        return self.l2_normalize(pooled)

    def stack_input(self, x: str, prefix: str, g: Geometry, head: Head) -> str:
        """``x`` [B, T, W] as the first block reads it: through ``prefix.ln_pre`` when the head has one."""
        return self.layer_norm(x, f"{prefix}.ln_pre", g.layer_norm_eps) if head.ln_pre else x

    def attention_pool(self, hidden: str, prefix: str, g: Geometry) -> str:
        """SigLIP's attention pooling head over ``hidden`` [B, T, W] (the stack's output): [B, W].

        ``o = MHA(query = prefix.pool.probe, keys = values = hidden)`` with the heads of the
        stack, its q, k, v the rows of ``prefix.pool.attn.qkv`` and its output projection
        ``prefix.pool.attn.out``; then ``o + MLP(LayerNorm(o))`` (``prefix.pool.ln``, ``prefix.pool.mlp``)."""
        p, w, hd = f"{prefix}.pool", g.width, g.head_dim
        weight, bias = self.weight(f"{p}.attn.qkv.weight"), self.weight(f"{p}.attn.qkv.bias")
        q_w, kv_w = (self.op("Slice", weight, self.ints([a]), self.ints([b])) for a, b in ((0, w), (w, 3 * w)))
        q_b, kv_b = (self.op("Slice", bias, self.ints([a]), self.ints([b])) for a, b in ((0, w), (w, 3 * w)))
        probe = self.op("Reshape", self.weight(f"{p}.probe"), self.ints([1, w]))
        q = self.op("Mul", self.op("Gemm", probe, q_w, q_b, transB=1), self.scalar(1 / np.sqrt(hd)))
        q = self.op("Transpose", self.op("Reshape", q, self.ints([1, 1, g.heads, hd])), perm=[0, 2, 1, 3])  # [1, H, 1, hd]
        shape = self.op("Shape", hidden)
        bt = self.op("Slice", shape, self.ints([0]), self.ints([2]))
        kv = self.op("Gemm", self.op("Reshape", hidden, self.ints([-1, w])), kv_w, kv_b, transB=1)  # [B*T, 2W]
        kv = self.op("Transpose", self.op("Reshape", kv, self.op("Concat", bt, self.ints([2, g.heads, hd]), axis=0)), perm=[2, 0, 3, 1, 4])
        k, v = (self.op("Squeeze", part, self.ints([0])) for part in self.op("Split", kv, axis=0, outputs=2))
        scores = self.op("MatMul", q, self.op("Transpose", k, perm=[0, 1, 3, 2]))  # [B, H, 1, T]
        context = self.op("MatMul", self.op("Softmax", scores, axis=-1), v)  # [B, H, 1, hd]
        o = self.linear(self.op("Reshape", context, self.ints([-1, w])), f"{p}.attn.out")
        return self.residual(o, self.mlp(self.layer_norm(o, f"{p}.ln", g.layer_norm_eps), f"{p}.mlp", g))

    def prepend_class_token(self, x: str, prefix: str) -> str:
        """``[cls + pos[0], x...]`` along tokens, for ``x`` [B, T, W] already holding pos[1:]."""
        first = self.op("Add", self.weight(f"{prefix}.cls"), self.op("Gather", self.weight(f"{prefix}.pos.weight"), self.const(np.int64(0))))
        batch = self.op("Slice", self.op("Shape", x), self.ints([0]), self.ints([1]))
        tile_shape = self.op("Concat", batch, self.ints([1, 1]), axis=0)
        first = self.op("Tile", self.op("Reshape", first, self.ints([1, 1, -1])), tile_shape)
        return self.op("Concat", first, x, axis=1)  # type: ignore[no-any-return]

    def build(self) -> onnx.ModelProto:
        """The model, with weights declared as initializers still to be bound by a backend."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.constants)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="uform")
        model.ir_version = 10
        props = {ATTENTION_SITES: self.attention_sites, RESIDUAL_SITES: self.residual_sites}
        if any(props.values()):
            helper.set_model_props(model, {key: json.dumps(sites) for key, sites in props.items() if sites})
        return model

