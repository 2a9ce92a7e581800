"""The e4m3 backend's kernels: products against numpy at every shape and row count, quantization
bits, rows' bits whatever the schedule, which variant the machine and the environment pick,
packing refusals, huge pages, and the library's machine code.

Every kernel variant this machine runs is checked; the others are skipped with the reason.
The attention kernels: tests/test_e4m3_attention.py; loads through the library and the
fallback: tests/test_e4m3_loads.py.
"""

from __future__ import annotations

import dataclasses
import mmap
import re
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import uform
from uform import CPUClass
from uform.plugins import e4m3
from uform.plugins.sessions.dequantize import quantize_e4m3
from uform.plugins.oplib.library import BF16_PRODUCTS, VARIANTS, OpLibraryError

from oplibrary import LIBRARY, needs_library, runnable


def bf16(rng: np.random.Generator, *shape: int, scale: float = 0.05) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16)


def reference(variant: str, x: np.ndarray, w: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None) -> np.ndarray:
    """float64 numpy of what the kernels compute; the BF16 dot-product variant rounds x to BF16."""
    if variant in BF16_PRODUCTS:
        x = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    y = x.astype(np.float64) @ w.astype(np.float64).T
    if scale is not None:
        y = y * scale
    return y + (0 if bias is None else bias)


SHAPES = [(1, 8, 1), (7, 33, 5), (13, 64, 33), (25, 31, 70), (200, 96, 48), (391, 40, 130), (12, 768, 2304), (30, 1031, 45)]
# (391, 40, 130): several blocks of rows, uneven, each against every panel; the last: several depth chunks, odd k


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_kernels_match_numpy(variant: str, m: int, k: int, n: int) -> None:
    lib = runnable(variant)
    rng = np.random.default_rng(m * 1000 + k + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = bf16(rng, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    codes, scale = quantize_e4m3(w)
    decoded = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    for quantized, want_w, want_scale in ((False, w.astype(np.float32), None), (True, decoded, scale)):
        packed, got_scale = lib.pack(variant, w, quantized, threads=2)
        if quantized:
            assert got_scale is not None and np.array_equal(got_scale, scale)
        for b in (None, bias):
            y = lib.gemm(variant, x, packed, n, got_scale, b, threads=2)
            want = reference(variant, x, want_w, want_scale, b)
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("variant", VARIANTS)
def test_quantization_is_the_reference_bit_for_bit(variant: str) -> None:
    """Every finite BF16 value, at several scales, gets the code numpy's reference gives:
    a product with the identity reads the decoded weights back exactly."""
    lib = runnable(variant)
    finite = np.arange(0x7F80, dtype=np.uint16)
    values = np.concatenate([finite, finite | 0x8000]).view(ml_dtypes.bfloat16).reshape(-1, 32)
    values[::3, 0] = 448  # rows whose largest weight is 448: codes of the values themselves
    codes, scale = quantize_e4m3(values)
    packed, got_scale = lib.pack(variant, values, True, threads=2)
    assert got_scale is not None and np.array_equal(got_scale, scale)
    y = lib.gemm(variant, np.eye(32, dtype=np.float32), packed, values.shape[0], got_scale)
    decoded = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale[:, None]
    assert np.array_equal(y.T, decoded)


def e4m3_values() -> np.ndarray:
    """The 254 finite E4M3FN values (both zeros included), as BF16: each exactly representable."""
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    return codes.view(ml_dtypes.float8_e4m3fn).astype(ml_dtypes.bfloat16)


def bf16_extremes() -> np.ndarray:
    """BF16 weights a decoder can get wrong: both zeros, every subnormal magnitude, the
    smallest and largest normals, ones and powers of two, and their negatives."""
    bits = [0x0000, 0x8000, 0x0080, 0x8080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80, 0x0100, 0x7F00]
    bits += list(range(0x0001, 0x0080)) + [b | 0x8000 for b in range(0x0001, 0x0080, 7)]
    return np.array(bits, np.uint16).view(ml_dtypes.bfloat16)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m", [*range(1, 18), 255])
def test_every_weight_decodes_exactly_at_every_row_count(variant: str, m: int) -> None:
    """A product with rows of the identity reads weights back one at a time: every finite
    E4M3 code (rows whose largest weight is 448 have scale 1, so their codes are the values)
    and BF16's zeros, subnormals and extremes come out exact, at each row count of the
    small-m path and past it, with odd n and k (partial panels and a half pair). Each of
    the first m columns holds every value of the pool, so every row count checks them all.
    The avx512-bf16 kernels' VDPBF16PS and the amx kernels' TDPBF16PS read BF16 subnormals as
    zero (the instructions' rule, whatever MXCSR says): for them those weights must come out
    as zero."""
    lib = runnable(variant)
    k = 255
    rng = np.random.default_rng(m)
    for quantized, pool in ((True, e4m3_values()), (False, bf16_extremes())):
        n = len(pool) + 3
        w = np.stack([pool[np.concatenate([rng.permutation(len(pool)), rng.integers(0, len(pool), 3)])] for _ in range(k)], 1)
        if quantized:
            w[:, k - 1] = 448  # every row's largest magnitude: scale 1
        packed, scale = lib.pack(variant, w, quantized, threads=2)
        y = lib.gemm(variant, np.eye(k, dtype=np.float32)[:m], packed, n, scale, threads=2)
        want = w.astype(np.float32)[:, :m].T
        if quantized:
            assert scale is not None and np.all(scale == 1)
        elif variant in BF16_PRODUCTS:
            want = np.where(np.abs(want) < np.finfo(np.float32).tiny, np.float32(0), want)
        assert np.array_equal(y, want), f"{'e4m3' if quantized else 'bf16'}: {np.argwhere(y != want)[:5].tolist()}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m", [*range(1, 18), 96, 97, 300])
def test_products_match_numpy_at_every_row_count(variant: str, m: int) -> None:
    """Random products, odd n and k, BF16 and E4M3 weights, bias or none: at m = 1..17
    (the small-m path and its edge) and past it (row blocks and their tails)."""
    lib = runnable(variant)
    n, k = 45, 771
    rng = np.random.default_rng(100 + m)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = bf16(rng, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    codes, scale = quantize_e4m3(w)
    decoded = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    for quantized, want_w, want_scale, b in ((False, w.astype(np.float32), None, None), (True, decoded, scale, bias)):
        packed, got_scale = lib.pack(variant, w, quantized, threads=2)
        y = lib.gemm(variant, x, packed, n, got_scale, b, threads=2)
        want = reference(variant, x, want_w, want_scale, b)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("variant", ["avx512-bf16", "amx", "amx-model"])
def test_a_rows_bits_do_not_depend_on_how_the_rows_are_scheduled(variant: str) -> None:
    """Five panels of E4M3 and BF16 weights over 900 rows (row blocks outer, E4M3's panels
    decoded once a thread into a slot each) and over 100 and 7 of the same rows (panels outer,
    one held panel, or one block): each row the same bits, and close to numpy's."""
    lib = runnable(variant)
    n, k = 300, 200
    x, w, bias = many_panels(900, n, k, 17)
    for quantized in (False, True):
        packed, scale = lib.pack(variant, w, quantized, threads=2)
        whole = lib.gemm(variant, x, packed, n, scale, bias, threads=2)
        for rows in (slice(0, 7), slice(400, 500), slice(893, 900)):
            part = lib.gemm(variant, np.ascontiguousarray(x[rows]), packed, n, scale, bias, threads=2)
            assert np.array_equal(part.view(np.uint32), whole[rows].view(np.uint32)), (quantized, rows)
        codes, want_scale = quantize_e4m3(w)
        want_w = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) if quantized else w.astype(np.float32)
        want = reference(variant, x, want_w, want_scale if quantized else None, bias)
        np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("m", [1, 6, 7, 8, 24, 25, 26, 97, 300])
def test_the_split_kernels_write_the_avx2_kernels_bits(m: int) -> None:
    """avx2-split stages panels as float32 (E4M3 from 7 rows a task, BF16 from 25) where
    avx2 widens in registers or stages F16 bits: every weight widens exactly and the sums
    run in the same order, so y is the same bit for bit, on either side of each threshold."""
    lib = runnable("avx2-split")
    n, k = 45, 771
    rng = np.random.default_rng(300 + m)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = bf16(rng, n, k, scale=0.3)
    bias = rng.standard_normal(n).astype(np.float32)
    for quantized in (False, True):
        ys = []
        for variant in ("avx2", "avx2-split"):
            packed, scale = lib.pack(variant, w, quantized, threads=2)
            ys.append(lib.gemm(variant, x, packed, n, scale, bias, threads=2))
        assert np.array_equal(ys[0], ys[1]), f"{'e4m3' if quantized else 'bf16'}: {np.argwhere(ys[0] != ys[1])[:5].tolist()}"


def many_panels(m: int, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [m, k], BF16 weights [n, k] and a bias [n] for a product of many panels."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    return x, bf16(rng, n, k, scale=0.3), rng.standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("variant", ["avx2", "avx2-split", "avx512"])
@pytest.mark.parametrize("m", [4, 7, 8, 14, 16, 24, 96])
def test_the_fma_kernels_write_each_rows_bits_whatever_rows_and_threads_run_with_it(variant: str, m: int) -> None:
    """Every row of an AVX2 or AVX-512 FMA product sums its k in the same order, one FMA at a
    time, whether it runs alone (widened in registers) or among m rows and 1-3 threads (E4M3
    panels staged as F16 bits, each task's next panel staged inside the FMA loop of the one
    before, tasks cut by the thread count; float32 stages from 24 rows on avx512, from 7 on
    avx2-split): so y is the bits of each row alone. Many panels (n = 629) and an odd k (a
    half pair) put every panel through staging."""
    lib = runnable(variant)
    n, k = 629, 771
    x, w, bias = many_panels(m, n, k, seed=400 + m)
    for quantized in (False, True):
        packed, scale = lib.pack(variant, w, quantized, threads=2)
        alone = np.concatenate([lib.gemm(variant, x[r : r + 1], packed, n, scale, bias, threads=1) for r in range(m)])
        for threads in (1, 2, 3):
            y = lib.gemm(variant, x, packed, n, scale, bias, threads=threads)
            assert np.array_equal(y, alone), f"{'e4m3' if quantized else 'bf16'}, {threads} threads: {np.argwhere(y != alone)[:5].tolist()}"


@pytest.mark.parametrize("variant", ["avx2", "avx2-split", "avx512"])
@pytest.mark.parametrize("m", [1, 3, 5, 13, 96, 97])
def test_every_panel_is_run_once_whoever_takes_it(variant: str, m: int) -> None:
    """Up to one block of rows (96) a product is cut into spans of panels, a span for each
    thread it was cut for, each thread taking its own span's panels from the front and then
    the others' from their backs. Cut for 8 threads and run by a pool of 1 or 2, most spans
    have no thread of their own: every panel must still be run once, its bits those of the
    rows alone. (97 rows: two blocks, cut into fixed tasks.)"""
    lib = runnable(variant)
    n, k = 629, 771
    x, w, bias = many_panels(m, n, k, seed=500 + m)
    for quantized in (False, True):
        packed, scale = lib.pack(variant, w, quantized, threads=2)
        alone = lib.gemm(variant, x, packed, n, scale, bias, threads=1)
        feeds = {"x": x, "w": packed, "bias": bias} | ({"scale": scale} if quantized else {})
        for tasks_for, pool in ((8, 1), (8, 2), (2, 2), (1, 2)):
            (y,) = lib.product_session(variant, quantized, n, k, packed.size, tasks_for, pool, bias=True).run(None, feeds)
            assert np.array_equal(y, alone), (
                f"{'e4m3' if quantized else 'bf16'}, cut for {tasks_for} threads, {pool} running: {np.argwhere(y != alone)[:5].tolist()}"
            )


@needs_library
@pytest.mark.parametrize("splits", [False, True])
def test_x86_64_v3_takes_the_split_kernels_where_256_bit_operations_are_halved(monkeypatch: pytest.MonkeyPatch, splits: bool) -> None:
    assert LIBRARY is not None
    monkeypatch.setattr(e4m3, "library", lambda: dataclasses.replace(LIBRARY, splits_256=splits, vendor="amd"))
    assert e4m3.variant_of(CPUClass.X86_64_V3) == ("avx2-split" if splits else "avx2")
    assert e4m3.variant_of(CPUClass.X86_64_V4) == "avx512"  # the other classes keep theirs
    assert e4m3.variant_of(CPUClass.X86_64_V4_VNNI_BF16) == "avx512-bf16"
    assert e4m3.variant_of(CPUClass.X86_64_V2) is None


@needs_library
@pytest.mark.parametrize("splits", [False, True])
@pytest.mark.parametrize("chosen", ["avx2", "avx2-split"])
def test_the_environment_picks_either_avx2_variant(monkeypatch: pytest.MonkeyPatch, splits: bool, chosen: str) -> None:
    """UFORM_AVX2_KERNELS overrides the machine's choice for x86-64-v3 (for CPUs no one has
    measured both on: Intel's AVX2 cores), and only for it."""
    assert LIBRARY is not None
    monkeypatch.setattr(e4m3, "library", lambda: dataclasses.replace(LIBRARY, splits_256=splits))
    monkeypatch.setenv("UFORM_AVX2_KERNELS", f" {chosen} ")
    assert e4m3.variant_of(CPUClass.X86_64_V3) == chosen
    assert e4m3.variant_of(CPUClass.X86_64_V4) == "avx512"
    monkeypatch.setenv("UFORM_AVX2_KERNELS", "")  # empty: as unset
    assert e4m3.variant_of(CPUClass.X86_64_V3) == ("avx2-split" if splits else "avx2")


@pytest.fixture
def v3_text(tmp_path: Path) -> Path:
    """A tiny text checkpoint, where this machine runs x86-64-v3 (else the test is skipped)."""
    from ckpt import make_checkpoint

    from uform.plugins.cpu import machine_classes

    if CPUClass.X86_64_V3 not in machine_classes():
        pytest.skip("this machine runs no x86-64-v3 kernels")
    return make_checkpoint(tmp_path / "tiny.safetensors", "tiny", 0, ["text"])


@needs_library
def test_an_unknown_avx2_variant_in_the_environment_fails_the_load(
    monkeypatch: pytest.MonkeyPatch, v3_text: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The load fails naming the setting, and the e4m3 backend is not logged as a plugin with a bug
    (its accepts raised: the host passed it over and the cpu backend loaded the model)."""
    from uform.core.errors import UnsupportedError

    path = v3_text
    monkeypatch.delenv("UFORM_CPU_CLASS", raising=False)  # describe_here's words below are an uncapped machine's
    monkeypatch.setenv("UFORM_AVX2_KERNELS", "avx3")
    with pytest.raises(UnsupportedError, match=r"UFORM_AVX2_KERNELS='avx3' names no AVX2 kernels: set it to avx2 or avx2-split, or unset it"):
        uform.Model.load_ram(path, cpu_class=CPUClass.X86_64_V3)
    assert "has a bug" not in caplog.text
    assert e4m3.variant_of(CPUClass.X86_64_V4) in (None, "avx512")  # other classes do not read it
    monkeypatch.setattr(e4m3, "machine_classes", lambda: [CPUClass.X86_64_V2, CPUClass.X86_64_V3])  # as on an AVX2-only CPU
    assert e4m3.describe_here().startswith("loads for x86-64-v3 fail: UFORM_AVX2_KERNELS='avx3' names no AVX2 kernels")
    monkeypatch.setenv("UFORM_AVX2_KERNELS", "avx2-split")
    assert e4m3.describe_here().startswith("float32 products of weights widened in cache (avx2-split kernels")
    model = uform.Model.load_ram(path, cpu_class=CPUClass.X86_64_V3)
    assert "avx2-split kernels" in model.compute


@needs_library
def test_a_capped_environment_loads_for_the_cap(monkeypatch: pytest.MonkeyPatch, v3_text: Path) -> None:
    path = v3_text
    monkeypatch.setenv("UFORM_CPU_CLASS", "x86-64-v3")
    avx2 = e4m3.variant_of(CPUClass.X86_64_V3)
    assert e4m3.describe_here().startswith(f"{e4m3.COMPUTE[avx2]} for x86-64-v3, capped by UFORM_CPU_CLASS; library ")
    model = uform.Model.load_ram(path)
    assert model.describe().cpu_class == CPUClass.X86_64_V3 and f"({avx2} kernels" in model.compute
    with pytest.raises(uform.UnsupportedError, match=r"^cpu_class x86-64-v4 is beyond this machine; the best class it runs is x86-64-v3$"):
        uform.Model.load_ram(path, cpu_class=CPUClass.X86_64_V4)
    monkeypatch.setenv("UFORM_CPU_CLASS", "x86-64-v9")
    with pytest.raises(uform.UnsupportedError, match=r"^UFORM_CPU_CLASS='x86-64-v9' names no CPU class"):
        uform.Model.load_ram(path)


@needs_library
def test_a_weight_that_is_not_finite_is_named() -> None:
    assert LIBRARY is not None
    w = np.zeros((40, 10), ml_dtypes.bfloat16)
    w[33, 7] = np.inf
    variant = sorted(LIBRARY.runnable)[0]
    for quantized in (False, True):
        with pytest.raises(ValueError, match=r"^weight \[33, 7\] is not finite$"):
            LIBRARY.pack(variant, w, quantized)


@needs_library
@pytest.mark.parametrize("dtype", [np.float16, np.int16, np.float32])
def test_packing_refuses_weights_that_are_not_bf16(dtype: type) -> None:
    """float16 (and int16) weights are two bytes too: they were packed as if BF16 bits (1.0 as
    float16 read as BF16 is 0.0078125), now refused naming the dtype."""
    assert LIBRARY is not None
    with pytest.raises(ValueError, match=f"matrix 0: expected BF16 \\[4, 8\\], got {np.dtype(dtype).name} \\[4, 8\\]"):
        LIBRARY.pack("avx2" if "avx2" in LIBRARY.runnable else "amx-model", np.ones((4, 8), dtype), False)


@needs_library
def test_packing_refuses_shapes_and_vectors_that_do_not_fit() -> None:
    assert LIBRARY is not None
    # a vector variant: the tile ones pad k to 32, so a k of 7 fits where 6 was packed
    variant = sorted(LIBRARY.runnable - {"amx", "amx-model"})[0]
    packed, _ = LIBRARY.pack(variant, np.ones((4, 6), ml_dtypes.bfloat16), False)
    with pytest.raises(ValueError, match="not an \\[40, 6\\] matrix packed for"):
        LIBRARY.gemm(variant, np.ones((2, 6), np.float32), packed, 40)
    with pytest.raises(ValueError, match="not an \\[4, 7\\] matrix packed for"):
        LIBRARY.gemm(variant, np.ones((2, 7), np.float32), packed, 4)
    with pytest.raises(ValueError, match=r"bias must be float32 \[4\]"):
        LIBRARY.gemm(variant, np.ones((2, 6), np.float32), packed, 4, bias=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="non-empty"):
        LIBRARY.pack(variant, np.ones((0, 6), ml_dtypes.bfloat16), False)


def advised_huge(array: np.ndarray) -> bool:
    """Whether the map holding ``array`` asked for huge pages (``hg`` in its smaps VmFlags)."""
    address, inside = array.ctypes.data, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            start, end = (int(v, 16) for v in line.split()[0].split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return "hg" in line.split()[1:]
    raise AssertionError(f"no map holds {address:#x}")


@pytest.mark.skipif(
    not Path("/proc/self/smaps").exists() or not Path("/sys/kernel/mm/transparent_hugepage").exists() or not hasattr(mmap, "MADV_HUGEPAGE"),
    reason="no /proc/self/smaps, transparent huge pages or MADV_HUGEPAGE here",
)
@pytest.mark.parametrize("setting", [None, "1", "0"])
def test_packed_weights_ask_for_huge_pages_unless_turned_off(monkeypatch: pytest.MonkeyPatch, setting: str | None) -> None:
    from uform.plugins.oplib.library import zeros

    if setting is None:
        monkeypatch.delenv("UFORM_HUGE_PAGES", raising=False)
    else:
        monkeypatch.setenv("UFORM_HUGE_PAGES", setting)
    arrays = zeros([(3 << 20, np.dtype(np.uint16)), (100, np.dtype(np.uint8))])
    assert [a.ctypes.data % 64 for a in arrays] == [0, 0] and arrays[0].ctypes.data % (2 << 20) == 0
    assert [a.size for a in arrays] == [3 << 20, 100] and not arrays[0].any()
    assert advised_huge(arrays[0]) == (setting != "0")


@needs_library
@pytest.mark.parametrize("variant", VARIANTS)
def test_kernels_this_cpu_cannot_run_are_refused_by_name(variant: str) -> None:
    """Packing for, and a product and attention through, a variant this CPU lacks: OpLibraryError
    naming it (they said 'refused to pack ... (-3)' and 'uform_attention failed (1)'), no
    instruction run; the one wording, oplib.entries.cannot_run."""
    assert LIBRARY is not None
    if variant in LIBRARY.runnable:
        pytest.skip(f"this CPU runs the {variant} kernels")
    w = np.ones((40, 64), ml_dtypes.bfloat16)
    for e4m3 in (False, True):
        with pytest.raises(OpLibraryError, match=f"^this CPU cannot run the {variant} kernels$"):
            LIBRARY.pack(variant, w, e4m3)
    with pytest.raises(OpLibraryError, match=f"^this CPU cannot run the {variant} kernels$"):
        LIBRARY.attention(np.ones((4, 96), np.float32), 1, 2, variant=variant)
    packed = np.zeros(LIBRARY.packed_elements(variant, 40, 64), np.uint16)  # the size a product checks first
    with pytest.raises(OpLibraryError, match=f"^this CPU cannot run the {variant} kernels$"):
        LIBRARY.gemm(variant, np.ones((2, 64), np.float32), packed, 40)


def test_the_fma_peak_probe_answers_for_avx2_and_the_tiles_only() -> None:
    """The benchmarks' share of peak: a positive rate for AVX2's kernels (avx2, avx2-split)
    on 1 and 2 threads, None for a variant without a probe (every other but ``amx``, whose
    tile probe answers where the tiles run: tests/test_amx.py)."""
    lib = runnable("avx2")
    for variant in ("avx2", "avx2-split"):
        one, two = lib.fma_peak(variant, 1), lib.fma_peak(variant, 2)
        assert one is not None and two is not None and one > 1e9 and two > 1e9
    for variant in sorted(lib.runnable - {"avx2", "avx2-split", "amx"}):
        assert lib.fma_peak(variant, 1) is None


# A function the compiler made once in each file (a template or inline function from a
# header) is a weak symbol, and the linker keeps one copy for every file. Made where an
# AVX-512 target was set, it stopped every AVX2-only machine with SIGILL
# (std::vector<float>::assign in the attention scratch). Machines that run AVX-512 never see it.
WIDE = re.compile(r"%[yz]mm\d+|%k[0-7]\b")


@needs_library
def test_no_weak_symbol_of_the_library_holds_vector_instructions() -> None:
    assert LIBRARY is not None
    tools = [shutil.which("nm"), shutil.which("objdump")]
    if None in tools:
        pytest.skip("binutils (nm, objdump) are not installed here")
    listed = subprocess.run(["nm", "--defined-only", str(LIBRARY.path)], capture_output=True, text=True, check=True).stdout
    weak = {line.split()[2] for line in listed.splitlines() if len(line.split()) == 3 and line.split()[1] in "WVu"}
    assert weak, "nm listed no weak symbol: the check would prove nothing"
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(LIBRARY.path)], capture_output=True, text=True, check=True).stdout
    wide, name = set(), ""
    for line in code.splitlines():
        if line.endswith(">:"):
            name = line[line.index("<") + 1 : -2]
        elif name in weak and WIDE.search(line):
            wide.add(name)
    assert not wide, f"weak symbols compiled for a wider instruction set than every machine runs: {sorted(wide)}"


# What runs when the library loads, on every CPU: the files' static initialisers and what they
# call inside the library. A TileConfig built at run time in a file compiled for AMX and AVX-512
# (tile_config.inc) filled itself with a zmm store and stopped `uform plugins`, and every load,
# with SIGILL on an AVX2-only Zen 3. Machines with AVX-512 never see it, so the check reads code.
LOAD_TIME_WIDE = re.compile(r"%[yz]mm\d+|%k[0-7]\b|\b(ldtilecfg|sttilecfg|tile\w+|tdp\w+)\b")


CALL = re.compile(r"\b(?:call|jmp)\s+[0-9a-f]+ <([^>@+]+)>")


@needs_library
def test_the_librarys_load_time_code_holds_no_vector_instructions() -> None:
    assert LIBRARY is not None
    if shutil.which("objdump") is None:
        pytest.skip("binutils (objdump) is not installed here")
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(LIBRARY.path)], capture_output=True, text=True, check=True).stdout
    bodies: dict[str, list[str]] = {}
    name = ""
    for line in code.splitlines():
        if line.endswith(">:"):
            name = line[line.index("<") + 1 : -2]
            bodies[name] = []
        elif name:
            bodies[name].append(line)
    roots = [n for n in bodies if n.startswith("_GLOBAL__sub_I_")]
    assert roots, "objdump named no static initialiser (_GLOBAL__sub_I_*): the check would prove nothing"
    seen, todo, wide = set(roots), list(roots), {}
    while todo:
        name = todo.pop()
        for line in bodies.get(name, []):
            if LOAD_TIME_WIDE.search(line):
                wide.setdefault(name, line.strip())
            callee = CALL.search(line)
            if callee and callee.group(1) in bodies and callee.group(1) not in seen:
                seen.add(callee.group(1))
                todo.append(callee.group(1))
    assert not wide, f"code run when the library loads holds instructions not every x86-64 CPU runs: {wide}"
