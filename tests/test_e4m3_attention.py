"""The op library's fused attention: against numpy for every mask and shape, no items, rows that
are not whole items refused, and every attention of every tower fused and computing what the
graph does.

Every kernel variant this machine runs is checked; the others are skipped with the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import uform
from uform import Arena, Scalar
from uform.plugins import e4m3

from attention_reference import attention_reference
from captions import captions
from oplibrary import LIBRARY, needs_library, runnable


@pytest.mark.parametrize("items,tokens,heads,head_dim", [(1, 1, 1, 16), (2, 5, 2, 16), (1, 13, 12, 64), (2, 33, 2, 32), (3, 87, 12, 64), (1, 70, 3, 48)])
@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
@pytest.mark.parametrize("variant", ["avx2", "avx2-split", "avx512"])
def test_attention_matches_numpy(variant: str, items: int, tokens: int, heads: int, head_dim: int, mask: str) -> None:
    """Both attention kernels (AVX2's and AVX-512's; avx512-bf16 runs AVX-512's) against
    numpy in float64: keys in and past whole blocks, partial column blocks, every mask form."""
    runnable(variant)
    assert LIBRARY is not None
    rng = np.random.default_rng(tokens * heads)
    qkv = rng.standard_normal((items * tokens, 3 * heads * head_dim)).astype(np.float32)
    additive = None
    if mask == "padding":
        lengths = rng.integers(1, tokens + 1, items)
        additive = np.where(np.arange(tokens)[None, :] < lengths[:, None], 0, -1e9).astype(np.float32)
    elif mask == "causal":
        additive = np.triu(np.full((tokens, tokens), -1e9, np.float32), 1)
    got = LIBRARY.attention(qkv, items, heads, additive, causal=mask == "causal", threads=2, variant=variant)
    np.testing.assert_allclose(got, attention_reference(qkv, items, heads, additive, mask == "causal"), atol=2e-5)


ATTENTION_VARIANTS = ["avx2", "avx2-split", "avx512", "avx512-bf16", "amx", "amx-model"]


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
def test_attention_of_no_items_answers_no_rows(variant: str) -> None:
    """No items, no tokens: an empty context (the C entry divided by a chunk of 0 tasks and the
    process died of SIGFPE). In a child process, so that a crash fails the test alone."""
    runnable(variant)
    code = (
        "import numpy as np\nfrom uform.plugins.oplib.library import library\n"
        f"out = library().attention(np.zeros((0, 96), np.float32), 0, 2, variant={variant!r}, threads=2)\n"
        "print(out.shape)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "(0, 32)"), done.stderr[-2000:]


@needs_library
def test_attention_refuses_rows_that_are_not_whole_items() -> None:
    """10 rows are not 3 items: refused by name (the last row came back unwritten), as are a
    width that is not 3 heads' of a multiple of 16."""
    assert LIBRARY is not None
    with pytest.raises(ValueError, match=r"qkv's 10 rows are not 3 items of equal length"):
        LIBRARY.attention(np.ones((10, 96), np.float32), 3, 2, variant="avx2")
    with pytest.raises(ValueError, match=r"qkv's 4 rows are not 0 items of equal length"):
        LIBRARY.attention(np.ones((4, 96), np.float32), 0, 2, variant="avx2")
    with pytest.raises(ValueError, match=r"head_dim a multiple of 16, got width 90 for 2 heads"):
        LIBRARY.attention(np.ones((4, 90), np.float32), 1, 2, variant="avx2")


@needs_library
@pytest.mark.parametrize("variant", ["avx2", "avx2-split", "avx512"])
def test_every_attention_of_every_tower_is_fused_and_computes_what_the_graph_does(variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the float32-product kernels (AVX2's, AVX-512's) with attention fused, every
    tower agrees with the cpu backend's standard float32 graph. A variant this machine's class
    may run but does not pick (``avx2`` on a Zen 1, ``avx2-split`` elsewhere) is named in the
    environment, as a user would."""
    import collections

    from ckpt import make_checkpoint
    from uform.core import runtime
    from uform.core import safetensors as st
    from uform.core.config import ModelConfig
    from uform.core.host import get_host
    from uform.plugins.cpu import machine_classes

    assert variant in e4m3.FUSED_ATTENTION
    fma = next((c for c in machine_classes() if variant in e4m3.CHOICES.get(c, ())), None)
    if fma is None or LIBRARY is None or variant not in LIBRARY.runnable:
        pytest.skip(f"this machine runs no class whose kernels may be {variant}")
    if e4m3.variant_of(fma) != variant:
        monkeypatch.setenv(e4m3.AVX2_KERNELS if variant in e4m3.AVX2_VARIANTS else e4m3.AVX512_KERNELS, variant)
    assert e4m3.variant_of(fma) == variant
    path = make_checkpoint(tmp_path / "small.safetensors", "small", 2)
    container = st.parse(memoryview(path.read_bytes()))
    config = ModelConfig.from_metadata(container.metadata)
    for name, (modality, parsed, specs) in runtime.plan_towers(container, config, get_host()).items():
        graph = runtime.build_graph(name, modality, parsed, config, specs)
        lowered = e4m3.lower(graph, {k: container.array(k) for k in specs}, False, variant, LIBRARY, 1)  # type: ignore[arg-type]
        sites = json.loads({p.key: p.value for p in graph.metadata_props}["uform.attention_sites"])
        ops = collections.Counter(n.op_type for n in lowered.graph.graph.node)
        fused = ops["QKVAttentionBF16"] + ops["QKVAttentionE4M3"]  # with their qkv projection: variants that read x as BF16 alone
        assert ops["Attention"] == len(sites) > 0 and fused == 0, name
    ours = uform.Model.load_ram(path, cpu_class=fma)
    plain = uform.Model.load_ram(path, quantization=Scalar.F32)
    texts = captions(24)
    np.testing.assert_allclose(np.array(ours.text_encode(texts, Arena()).embeddings), np.array(plain.text_encode(texts, Arena()).embeddings), atol=1e-5)
    pixels = list(np.random.default_rng(0).integers(0, 256, (3, 96, 80, 3), dtype=np.uint8))
    np.testing.assert_allclose(
        np.array(ours.image_encode_pixels(pixels, Arena()).embeddings), np.array(plain.image_encode_pixels(pixels, Arena()).embeddings), atol=1e-5
    )
    questions = [f"Is the {c} red? Answer y or n: " for c in ("circle", "square")]
    np.testing.assert_allclose(np.array(ours.text_choose(questions, "yn", Arena())), np.array(plain.text_choose(questions, "yn", Arena())), atol=1e-5)
