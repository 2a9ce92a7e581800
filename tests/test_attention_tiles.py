"""Attention with BF16 values: on the tiles (native/uform_ops/attention_tiles.inc), QKᵀ and PV as
BF16 tile products with float32 sums, the softmax in float32. ``amx-model`` runs the same code
over the scalar model of the tile instructions on every machine; ``amx`` runs it on AMX's tiles
where Linux grants them (elsewhere those tests are skipped, saying why) and must give the model's
bits. ``avx512-bf16`` (attention_bf16.cpp) keeps the scores in float32 and takes PV as VDPBF16PS
products: the same bounds, and the same independence of an item from its batch."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from attention_reference import attention_reference
from oplibrary import runnable

# (items, tokens, heads, head_dim): one token, a part of a tile, exactly a tile, one past a
# block of 16 queries and of 32 keys, odd lengths, head widths of 1-4 C tiles and past 64 columns
SHAPES = [(1, 1, 1, 16), (2, 5, 2, 16), (1, 16, 1, 64), (2, 17, 2, 48), (1, 33, 3, 32), (2, 64, 1, 80), (1, 87, 2, 64), (1, 197, 1, 64)]


def case(items: int, tokens: int, heads: int, head_dim: int, mask: str) -> tuple[np.ndarray, np.ndarray | None]:
    rng = np.random.default_rng(tokens * heads + head_dim)
    qkv = rng.standard_normal((items * tokens, 3 * heads * head_dim)).astype(np.float32)
    if mask == "padding":
        lengths = rng.integers(1, tokens + 1, items)
        return qkv, np.where(np.arange(tokens)[None, :] < lengths[:, None], 0, -1e9).astype(np.float32)
    if mask == "causal":
        return qkv, np.triu(np.full((tokens, tokens), -1e9, np.float32), 1)
    return qkv, None


def values_rounded(qkv: np.ndarray) -> np.ndarray:
    """qkv with v rounded to BF16, as the tiles read it (q goes as a BF16 pair that keeps it, k
    rounded to BF16: that rounding is left in what the tests below allow)."""
    out = qkv.copy()
    width = qkv.shape[1] // 3
    out[:, 2 * width :] = qkv[:, 2 * width :].astype(ml_dtypes.bfloat16).astype(np.float32)
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
@pytest.mark.parametrize("variant", ["amx", "amx-model", "avx512-bf16"])
def test_tile_attention_is_attention_with_bf16_values(variant: str, shape: tuple[int, int, int, int], mask: str) -> None:
    """Against numpy in float64 over v rounded to BF16 (q and k as float32: the tiles take q as a
    BF16 pair, k rounded to BF16), what is left is k's rounding and the numerators' (2⁻⁹ relative
    each) and the pair's last bits: within 2e-3 of the largest |input| (measured 1.4e-3; 7e-4
    with k a pair too); against the float32 inputs within 5e-3 (v's own rounding; measured 2.3e-3)."""
    lib = runnable(variant)
    items, tokens, heads, _ = shape
    qkv, additive = case(*shape, mask)
    got = lib.attention(qkv, items, heads, additive, causal=mask == "causal", threads=2, variant=variant)
    scale = np.abs(qkv).max()
    want = attention_reference(values_rounded(qkv), items, heads, additive, mask == "causal")
    np.testing.assert_allclose(got, want, atol=2e-3 * scale)
    np.testing.assert_allclose(got, attention_reference(qkv, items, heads, additive, mask == "causal"), atol=5e-3 * scale)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
def test_the_tiles_give_the_models_bits(shape: tuple[int, int, int, int], mask: str) -> None:
    """``amx`` (AMX's TDPBF16PS, VCVTNEPS2BF16, vector code at 512 bits) and ``amx-model`` (the
    scalar model, vector code at the baseline's width) give the same bits, on 1 and 2 threads."""
    lib = runnable("amx")
    items, tokens, heads, _ = shape
    qkv, additive = case(*shape, mask)
    model = lib.attention(qkv, items, heads, additive, causal=mask == "causal", threads=1, variant="amx-model")
    for threads in (1, 2):
        tiles = lib.attention(qkv, items, heads, additive, causal=mask == "causal", threads=threads, variant="amx")
        assert np.array_equal(tiles.view(np.uint32), model.view(np.uint32)), f"{threads} threads"


@pytest.mark.parametrize("variant", ["amx", "amx-model", "avx512-bf16"])
def test_an_items_bits_are_its_own_in_any_batch_and_any_padding(variant: str) -> None:
    """Texts of 3 to 70 tokens alone (as long as they are, no padding) and in batches padded to
    the longest with the padding mask, as the text towers run them: every item's rows are the
    same bits, whatever its batch, its padding and the number of threads (tiles run at every
    length, so no length picks another kernel)."""
    lib = runnable(variant)
    rng = np.random.default_rng(3)
    heads, head_dim = 2, 64
    lengths = [3, 70, 17, 33, 1, 48, 16]
    items = [rng.standard_normal((n, 3 * heads * head_dim)).astype(np.float32) for n in lengths]
    alone = [lib.attention(x, 1, heads, np.zeros((1, len(x)), np.float32), threads=1, variant=variant) for x in items]
    for start, size in ((0, 7), (0, 3), (2, 2), (4, 3)):
        group, longest = items[start : start + size], max(lengths[start : start + size])
        filler = [10 * rng.standard_normal((longest - len(x), x.shape[1])).astype(np.float32) for x in group]  # the pads' own q, k, v
        padded = np.concatenate([np.concatenate([x, f]) for x, f in zip(group, filler, strict=True)])
        mask = np.where(np.arange(longest)[None, :] < np.array([len(x) for x in group])[:, None], 0, -1e9).astype(np.float32)
        for threads in (1, 2):
            out = lib.attention(padded, size, heads, mask, threads=threads, variant=variant).reshape(size, longest, -1)
            for i, x in enumerate(group):
                assert np.array_equal(out[i, : len(x)], alone[start + i]), f"item {start + i} in a batch of {size}, {threads} threads"
