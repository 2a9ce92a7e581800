"""The Swin stack as ONNX: an image ``[B, C, S, S]`` to the pooled row ``[B, width]``.

Tokens stay 2-D ``[B · tokens, width]`` between blocks, so every linear layer is one ``Gemm``
over the checkpoint's ``[out, in]`` matrix (as in :mod:`uform.core.graph`). A block's windows
are one ``Gather`` of its tokens by a constant index (the cyclic shift, the zero padding to
whole windows and the partition into windows in one permutation; one constant a stage and
shift, shared by its blocks), and one ``Gather`` puts the
attention's context back in token order before the output projection, which is per token and
so may run after it: the projection then feeds the residual add directly (a residual site a
backend may fold). The attentions are plain ONNX (no attention site: their scores carry the
relative position bias and the shift mask, which a backend's fused attention does not take).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from uform.core.graph import GraphBuilder

from .tower import SwinTower

MERGE_EPS = 1e-5  # the patch, merge and final LayerNorms' (transformers' nn.LayerNorm default)
MASKED = -100.0  # what transformers' Swin adds to the scores of token pairs a shifted window joins across the image's edge


def window_order(resolution: int, window: int, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """``(gather, back)``: the tokens of a ``resolution²`` grid (row-major) in window order, and
    where each token lands in it. Window order is transformers' ``window_partition`` of the grid
    zero-padded to whole windows and rolled by ``-shift`` on both axes: windows row-major, tokens
    row-major within each. ``gather[k]`` is the token at place ``k``, or ``resolution²`` for
    padding (a zero row); ``back[j]`` is the place of token ``j`` (the reverse roll and crop)."""
    padded = -(-resolution // window) * window
    r = np.arange(padded)
    side = padded // window
    place_of = (r // window)[:, None] * side * window * window + (r // window)[None, :] * window * window  # window's first place
    place_of = place_of + (r % window)[:, None] * window + (r % window)[None, :]  # [row', col'] → place
    source = (r + shift) % padded  # row' of the rolled grid holds row (row' + shift) % padded
    rows, cols = source[:, None], source[None, :]
    token = np.where((rows < resolution) & (cols < resolution), rows * resolution + cols, resolution * resolution)
    gather = np.empty(padded * padded, np.int64)
    gather[place_of.reshape(-1)] = token.reshape(-1)
    home = (np.arange(resolution) - shift) % padded  # token row j sits at row' (j - shift) % padded
    back = place_of[home[:, None], home[None, :]].reshape(-1).astype(np.int64)
    return gather, back


def shift_mask(resolution: int, window: int, shift: int) -> np.ndarray:
    """Transformers' ``get_attn_mask`` for a shifted block: float32 ``[windows, w², w²]``, 0 where
    two tokens of a window came from one region of the padded grid (3 along each axis: before
    ``padded − window``, before ``padded − shift``, the rest), :data:`MASKED` elsewhere."""
    padded = -(-resolution // window) * window
    r = np.arange(padded)
    region = (r >= padded - window).astype(np.int64) + (r >= padded - shift)
    label = region[:, None] * 3 + region[None, :]
    side = padded // window
    windows = label.reshape(side, window, side, window).transpose(0, 2, 1, 3).reshape(-1, window * window)
    mask: np.ndarray = np.where(windows[:, None, :] != windows[:, :, None], MASKED, 0.0).astype(np.float32)
    return mask


def relative_index(window: int) -> np.ndarray:
    """Transformers' ``relative_position_index``: int64 ``[w², w²]``, row of the bias table for each pair of a window's tokens."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij")).reshape(2, -1)
    rel = coords[:, :, None] - coords[:, None, :] + (window - 1)
    index: np.ndarray = (rel[0] * (2 * window - 1) + rel[1]).astype(np.int64)
    return index


class Windows:
    """The graph's constants of each stage's windows, made once and shared by its blocks: the
    token orders (:func:`window_order`) and the shift mask by ``(resolution, shift)``, the
    relative position index of the window."""

    def __init__(self, b: GraphBuilder, window: int) -> None:
        self.b, self.window = b, window
        self.orders: dict[tuple[int, int], tuple[str, str, int]] = {}
        self.masks: dict[tuple[int, int], tuple[str, int]] = {}
        self.relative = b.const(relative_index(window).reshape(-1), "swin_relative")

    def order(self, resolution: int, shift: int) -> tuple[str, str, int]:
        """``(gather, back, places)``: the two index constants and the places of window order."""
        if (resolution, shift) not in self.orders:
            gather, back = window_order(resolution, self.window, shift)
            self.orders[resolution, shift] = (self.b.const(gather, "swin_windows"), self.b.const(back, "swin_tokens"), len(gather))
        return self.orders[resolution, shift]

    def mask(self, resolution: int, shift: int) -> tuple[str, int]:
        """The shift mask as ``[windows, 1, w², w²]``, and its count of windows."""
        if (resolution, shift) not in self.masks:
            mask = shift_mask(resolution, self.window, shift)
            self.masks[resolution, shift] = (self.b.const(mask[:, None], "swin_mask"), len(mask))
        return self.masks[resolution, shift]


def _attention(b: GraphBuilder, x: str, p: str, t: SwinTower, stage: int, shift: int, shared: Windows) -> str:
    """Windowed attention over ``x`` [B · L, C] (after ``ln1``): the context in token order, projected: [B · L, C]."""
    c, heads, w, res = t.dim(stage), t.heads[stage], t.window_size, t.resolution(stage)
    hd, n = c // heads, w * w
    gather, back, places = shared.order(res, shift)
    tokens = b.op("Reshape", x, b.ints([-1, res * res, c]))
    if places > res * res:  # padding: a zero row after the tokens
        tokens = b.op("Pad", tokens, b.ints([0, 0, 0, 0, 1, 0]))
    windows = b.op("Reshape", b.op("Gather", tokens, gather, axis=1), b.ints([-1, c]))
    qkv = b.op("Reshape", b.linear(windows, f"{p}.qkv"), b.ints([-1, n, 3, heads, hd]))
    q, k, v = (b.op("Squeeze", part, b.ints([0])) for part in b.op("Split", b.op("Transpose", qkv, perm=[2, 0, 3, 1, 4]), axis=0, num_outputs=3, outputs=3))
    scores = b.op("Div", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2])), b.scalar(float(np.sqrt(hd))))  # [B·nW, H, n, n]
    bias = b.op("Gather", b.weight(f"{p}.bias_table"), shared.relative)  # [n·n, H]
    bias = b.op("Transpose", b.op("Reshape", bias, b.ints([n, n, heads])), perm=[2, 0, 1])  # [H, n, n]
    if shift:
        mask, count = shared.mask(res, shift)  # [nW, 1, n, n]
        added = b.op("Add", b.op("Unsqueeze", bias, b.ints([0])), mask)  # [nW, H, n, n]
        scores = b.op("Reshape", b.op("Add", b.op("Reshape", scores, b.ints([-1, count, heads, n, n])), added), b.ints([-1, heads, n, n]))
    else:
        scores = b.op("Add", scores, bias)
    context = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)  # [B·nW, H, n, hd]
    context = b.op("Reshape", b.op("Transpose", context, perm=[0, 2, 1, 3]), b.ints([-1, places, c]))
    context = b.op("Reshape", b.op("Gather", context, back, axis=1), b.ints([-1, c]))
    return b.linear(context, f"{p}.out")


def _block(b: GraphBuilder, h: str, p: str, t: SwinTower, stage: int, shift: int, shared: Windows) -> str:
    """``h + attn(ln1(h))``, then ``h + fc2(act(fc1(ln2(h))))``: [B · L, C]."""
    eps = t.layer_norm_eps
    h = b.residual(h, _attention(b, b.layer_norm(h, f"{p}.ln1", eps), f"{p}.attn", t, stage, shift, shared))
    hidden = b.activate(b.linear(b.layer_norm(h, f"{p}.ln2", eps), f"{p}.mlp.fc1"), t.activation)
    return b.residual(h, b.linear(hidden, f"{p}.mlp.fc2"))


def _merge(b: GraphBuilder, h: str, p: str, t: SwinTower, stage: int) -> str:
    """Each 2×2 tokens as one: their 4C values in transformers' order (rows 0, 1 of column 0,
    then of column 1), ``norm``, ``reduction`` (no bias): [B · L / 4, 2C]."""
    c, half = t.dim(stage), t.resolution(stage) // 2
    x = b.op("Reshape", h, b.ints([-1, half, 2, half, 2, c]))  # [B, row, dr, col, dc, C]
    x = b.op("Reshape", b.op("Transpose", x, perm=[0, 1, 3, 4, 2, 5]), b.ints([-1, 4 * c]))
    return b.linear(b.layer_norm(x, f"{p}.norm", MERGE_EPS), f"{p}.reduction", bias=False)


def swin_graph(b: GraphBuilder, image: str, t: SwinTower, prefix: str) -> str:
    """The stack of ``t`` (tensors under ``prefix``) over ``image`` [B, channels, S, S] in the
    graph's float type: the pooled row [B, t.width], the mean of the last stage's tokens after
    ``prefix.ln_final`` (transformers' ``ClapAudioEncoder`` ``pooler_output``)."""
    return swin_stack(b, patch_embedding(b, image, t, prefix), t, prefix)


def patch_embedding(b: GraphBuilder, image: str, t: SwinTower, prefix: str) -> str:
    """The patches of ``image`` [B, channels, S, S] through ``prefix.patch``: [B · grid², embed_dim]."""
    c, ps, g = t.channels, t.patch_size, t.grid
    patches = b.op("Reshape", image, b.ints([-1, c, g, ps, g, ps]))
    patches = b.op("Reshape", b.op("Transpose", patches, perm=[0, 2, 4, 1, 3, 5]), b.ints([-1, c * ps * ps]))  # (channel, row, column)
    return b.linear(patches, f"{prefix}.patch")


def swin_stack(b: GraphBuilder, h: str, t: SwinTower, prefix: str) -> str:
    """The patch embeddings ``h`` [B · grid², embed_dim] through the patch norm, the stages and the pooling: [B, t.width]."""
    if t.patch_norm:
        h = b.layer_norm(h, f"{prefix}.patch_norm", MERGE_EPS)
    shared = Windows(b, t.window_size)
    for s in range(t.stages):
        for i in range(t.depths[s]):
            h = _block(b, h, f"{prefix}.stages.{s}.blocks.{i}", t, s, t.shift(s, i), shared)
        if s < t.stages - 1:
            h = _merge(b, h, f"{prefix}.stages.{s}.merge", t, s)
    h = b.layer_norm(h, f"{prefix}.ln_final", MERGE_EPS)
    last = t.resolution(t.stages - 1)
    return token_mean(b, b.op("Reshape", h, b.ints([-1, last * last, t.width])), last * last, t.width)


def token_mean(b: GraphBuilder, tokens: str, count: int, width: int) -> str:
    """The mean of ``tokens`` [B, count, width] over its tokens: [B, width], the same bits for an
    item in any batch. A row of ones times each item's tokens (one product a batch item), then
    divided by ``count``: ONNX Runtime's ReduceMean over axis 1 sums in another order for B > 1
    than for one item, and its transpose optimiser turns a reduction over a transposed last axis
    back into that one."""
    ones = b.const(np.ones((1, count)), "ones", np.float32)
    if b.float_type != TensorProto.FLOAT:
        ones = b.op("Cast", ones, to=b.float_type)
    total = b.op("Reshape", b.op("MatMul", ones, tokens), b.ints([-1, width]))
    return b.op("Div", total, b.scalar(float(count)))  # type: ignore[no-any-return]
