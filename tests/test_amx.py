"""The amx kernels beside the rest: which variant each class takes (by vendor, by the tiles
being granted, by the environment), the thread's tile configuration left as it was found,
ONNX Runtime's own int8 products right before and after uform's tile products in one process,
and the tile peak probe. The kernels' arithmetic is tested with every variant's in
tests/test_e4m3.py and tests/test_epilogues.py: ``amx`` on AMX CPUs, ``amx-model`` (the same
kernels over a scalar model of the tile instructions) everywhere."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from oplibrary import LIBRARY, needs_library, runnable

from uform import CPUClass
from uform.core.errors import UnsupportedError
from uform.plugins import e4m3

AMX, BF16 = CPUClass.X86_64_AMX, CPUClass.X86_64_V4_VNNI_BF16
REFUSED = "Linux refused the tile state (ARCH_REQ_XCOMP_PERM: a kernel older than 5.16?)"


def as_if(monkeypatch: pytest.MonkeyPatch, vendor: str, tiles: bool) -> None:
    """The library as on a CPU of ``vendor`` whose tiles are granted or refused."""
    assert LIBRARY is not None
    base = LIBRARY.runnable - {"amx"}
    lib = dataclasses.replace(LIBRARY, vendor=vendor, runnable=base | {"amx"} if tiles else base, amx_refusal=None if tiles else REFUSED)
    monkeypatch.setattr(e4m3, "library", lambda: lib)


@needs_library
@pytest.mark.parametrize("vendor", ["intel", "amd", "other"])
def test_each_class_takes_the_variant_measured_on_its_vendors_cores(monkeypatch: pytest.MonkeyPatch, vendor: str) -> None:
    monkeypatch.delenv("UFORM_AVX512_KERNELS", raising=False)
    without_tiles = "avx512" if vendor == "intel" else "avx512-bf16"  # Intel's VDPBF16PS: no faster than FMA
    as_if(monkeypatch, vendor, tiles=True)
    assert e4m3.variant_of(AMX) == "amx" and e4m3.variant_of(BF16) == without_tiles
    assert e4m3.compute_of(AMX, "amx") == "bf16 tile products, float32 sums (amx kernels)"
    as_if(monkeypatch, vendor, tiles=False)
    assert e4m3.variant_of(AMX) == without_tiles == e4m3.variant_of(BF16)
    assert e4m3.compute_of(AMX, without_tiles) == f"{e4m3.COMPUTE[without_tiles]}: amx refused ({REFUSED})"
    assert e4m3.compute_of(BF16, without_tiles) == e4m3.COMPUTE[without_tiles]  # a class without tiles: nothing refused
    assert e4m3.variant_of(CPUClass.X86_64_V4) == "avx512"


@needs_library
def test_uform_plugins_says_the_tiles_were_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UFORM_AVX512_KERNELS", raising=False)
    monkeypatch.delenv("UFORM_CPU_CLASS", raising=False)  # the words an uncapped machine says
    as_if(monkeypatch, "intel", tiles=False)
    monkeypatch.setattr(e4m3, "machine_classes", lambda: [CPUClass.X86_64_V3, CPUClass.X86_64_V4, BF16, AMX])
    assert e4m3.describe_here().startswith(
        f"float32 products of weights widened in cache (avx512 kernels): amx refused ({REFUSED}) for x86-64-amx; library "
    )


@needs_library
def test_the_environment_picks_any_of_the_classs_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    as_if(monkeypatch, "intel", tiles=True)
    for chosen in ("avx512-bf16", "avx512", "amx"):
        monkeypatch.setenv("UFORM_AVX512_KERNELS", f" {chosen} ")
        assert e4m3.variant_of(AMX) == chosen
        assert e4m3.compute_of(AMX, chosen) == e4m3.COMPUTE[chosen]  # chosen, not refused
    monkeypatch.setenv("UFORM_AVX512_KERNELS", "avx512-bf16")
    assert e4m3.variant_of(BF16) == "avx512-bf16" and e4m3.variant_of(CPUClass.X86_64_V4) == "avx512"  # v4 has one choice
    monkeypatch.setenv("UFORM_AVX512_KERNELS", "amx")
    with pytest.raises(UnsupportedError, match=r"^UFORM_AVX512_KERNELS='amx' names no kernels of x86-64-v4\+vnni\+bf16: set it to avx512-bf16 or avx512, or unset it$"):
        e4m3.variant_of(BF16)
    monkeypatch.setenv("UFORM_AVX512_KERNELS", "avx2")
    with pytest.raises(UnsupportedError, match=r"^UFORM_AVX512_KERNELS='avx2' names no kernels of x86-64-amx: set it to amx or avx512-bf16 or avx512"):
        e4m3.variant_of(AMX)
    as_if(monkeypatch, "intel", tiles=False)
    monkeypatch.setenv("UFORM_AVX512_KERNELS", "amx")
    with pytest.raises(UnsupportedError, match=r"^UFORM_AVX512_KERNELS=amx, but this process cannot run the amx kernels: Linux refused"):
        e4m3.variant_of(AMX)


@pytest.mark.parametrize("variant", ["amx", "amx-model"])
def test_the_tile_kernels_write_each_rows_bits_whatever_rows_and_threads_run_with_it(variant: str) -> None:
    """A C tile's row depends on its A row alone, and every row sums its k in the same order
    whichever tile (of 16 or 32 rows), task or thread runs it, and products of any rows run on
    the tiles: a product's rows are the bits of the same rows run in other groupings (1 row
    to 257) and on 1-3 threads. Many panels (n = 629), odd k."""
    lib = runnable(variant)
    rng = np.random.default_rng(7)
    m, n, k = 300, 629, 771
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.3).astype(ml_dtypes.bfloat16)
    bias = rng.standard_normal(n).astype(np.float32)
    for quantized in (False, True):
        packed, scale = lib.pack(variant, w, quantized, threads=2)
        whole = lib.gemm(variant, x, packed, n, scale, bias, threads=1)
        for threads in (2, 3):
            assert np.array_equal(lib.gemm(variant, x, packed, n, scale, bias, threads=threads), whole)
        for size in (1, 2, 3, 4, 5, 17, 33, 257):
            rows = 40 if size < 16 and variant == "amx-model" else m  # the model runs 16 rows for each: the first rows only
            parts = np.concatenate([lib.gemm(variant, x[r : r + size], packed, n, scale, bias, threads=2) for r in range(0, rows - size + 1, size)])
            assert np.array_equal(parts, whole[: len(parts)]), f"{'e4m3' if quantized else 'bf16'}, groups of {size}"


MLAS_CONFIG = bytes([1, 0] + [0] * 14 + [64, 0] * 8 + [0] * 16 + [16] * 8 + [0] * 8)  # palette 1, 8 tiles of 16 x 64 B
OTHER_CONFIG = bytes([1, 0] + [0] * 14 + [32, 0] * 4 + [0] * 24 + [8] * 4 + [0] * 12)  # 4 tiles of 8 x 32 B


@needs_library
@pytest.mark.parametrize("found", [bytes(64), MLAS_CONFIG, OTHER_CONFIG], ids=["none", "mlas", "other"])
def test_a_product_leaves_the_threads_tile_configuration_as_it_found_it(found: bytes) -> None:
    """On the thread that runs them (the caller, with one thread), the tile kernels load their
    configuration where the thread had another, and put back what they found after: none
    (released), MLAS's own (untouched: it is the same), or any other."""
    lib = runnable("amx-model")
    rng = np.random.default_rng(0)
    n, k = 70, 100
    w = (rng.standard_normal((n, k)) * 0.1).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((40, k)).astype(np.float32)
    want = x.astype(ml_dtypes.bfloat16).astype(np.float64) @ w.astype(np.float64).T
    for quantized in (False, True):
        packed, scale = lib.pack("amx-model", w, quantized)
        lib.model_tile_config(found)
        y = lib.gemm("amx-model", x, packed, n, scale, threads=1)
        assert lib.model_tile_config() == found
        if not quantized:
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        session = lib.product_session("amx-model", quantized, n, k, packed.size, threads=1)  # no pool: the caller runs it
        feeds = {"x": x, "w": packed, **({"scale": scale} if quantized else {})}
        lib.model_tile_config(found)
        (z,) = session.run(None, feeds)
        assert lib.model_tile_config() == found and np.array_equal(z, y)


@needs_library
def test_onnx_runtimes_int8_products_stay_right_beside_the_tile_kernels() -> None:
    """MLAS's int8 products (MatMulInteger; AMX tiles of its own configuration on AMX CPUs) in
    the same session and process as uform's tile products, before and after them, on the same
    threads: each answers exactly what numpy does, every time."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from uform.plugins.sessions.replicas import session_options

    assert LIBRARY is not None
    variant = "amx" if "amx" in LIBRARY.runnable else "amx-model"
    runnable(variant)
    rng = np.random.default_rng(1)
    m, k, n = 64, 256, 96
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    # b within [-64, 64): MLAS's u8 x s8 kernels without VNNI (AVX2, AVX-512BW) sum pairs of
    # products in int16 (VPMADDUBSW) and saturate past it, as ONNX Runtime documents; within this
    # range every pair fits, so exact answers are every kernel's, with tiles beside them or not
    b = rng.integers(-64, 64, (k, n), dtype=np.int8)
    want_q = a.astype(np.int32) @ b.astype(np.int32)
    w = (rng.standard_normal((n, k)) * 0.1).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((m, k)).astype(np.float32)
    packed, _ = LIBRARY.pack(variant, w, False)
    want_y = x.astype(ml_dtypes.bfloat16).astype(np.float64) @ w.astype(np.float64).T

    def session(with_tiles: bool, threads: int) -> ort.InferenceSession:
        nodes = [helper.make_node("MatMulInteger", ["a", "b"], ["q"])]
        inputs = [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])]
        outputs = [helper.make_tensor_value_info("q", TensorProto.INT32, [m, n])]
        if with_tiles:
            nodes.append(helper.make_node("MatMulBF16", ["x", "w"], ["y"], domain="ai.uform", variant=e4m3.VARIANTS.index(variant), n=n))
            inputs += [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k]), helper.make_tensor_value_info("w", TensorProto.UINT16, [packed.size])]
            outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n]))
        graph = helper.make_graph(nodes, "int8", inputs, outputs, [numpy_helper.from_array(b, "b")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.uform", 1)])
        options = session_options(threads)
        options.register_custom_ops_library(str(LIBRARY.path))
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    for threads in (1, 2):
        alone, both = session(False, threads), session(True, threads)
        for _ in range(3):
            (q,) = alone.run(None, {"a": a})
            assert np.array_equal(q, want_q)
            q, y = both.run(None, {"a": a, "x": x, "w": packed})
            assert np.array_equal(q, want_q)
            np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5 * np.abs(want_y).max())
        (q,) = alone.run(None, {"a": a})
        assert np.array_equal(q, want_q)


@needs_library
def test_the_tile_peak_probe_answers_where_the_tiles_run() -> None:
    assert LIBRARY is not None
    peak = LIBRARY.fma_peak("amx")
    if "amx" in LIBRARY.runnable:
        assert peak is not None and peak > 1e11  # 1,024 FLOP a cycle a core at any clock of these CPUs
    else:
        assert peak is None and LIBRARY.amx_refusal
    assert LIBRARY.fma_peak("amx-model") is None  # a model has no peak


def edge_rows(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """Rows whose sums the tiles' order and rounding decide: long cancelling runs, products
    that underflow (flushed), subnormal inputs (taken as zero), magnitudes from 2^-120 to 2^60."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0] = np.float32(1e-39)  # subnormal: rounds to a subnormal BF16, which the tiles read as zero
    x[1] = rng.choice([1.0, -1.0], k).astype(np.float32) * np.float32(2.0**-120)  # products below float32's normals
    x[2, ::2], x[2, 1::2] = 3.0e4, -3.0e4  # even and odd sums that cancel
    x[3] = np.ldexp(1.0, rng.integers(-40, 60, k)).astype(np.float32) * rng.choice([1.0, -1.0], k)
    return x


@needs_library
def test_the_tile_model_gives_the_real_tiles_bits() -> None:
    """``amx-model`` (what every machine tests the amx kernels' arithmetic with) answers the bits
    the real tiles do, for every row count, k (one tile's depth, several, a padded one), BF16
    and E4M3 weights, bias, scale, GELU and residual, on 1 and 2 threads, tasks in either order
    (E4M3 takes its row blocks first from 8 of them)."""
    lib = runnable("amx")
    rng = np.random.default_rng(11)
    # 2,050: 9 blocks of rows, task order; 1,030 x 1,024: y of 4 MiB and more, written past the caches;
    # 290 x 1,056: k deep enough for blocks of 128 rows (3), a last group of one panel (n = 80)
    for m, n, k in [(1, 64, 32), (4, 100, 64), (17, 129, 771), (40, 64, 3072), (2050, 70, 64), (1030, 1024, 32), (290, 80, 1056)]:
        x = edge_rows(rng, max(m, 4), k)[:m] if m >= 4 else rng.standard_normal((m, k)).astype(np.float32)
        w = (rng.standard_normal((n, k)) * np.ldexp(1.0, rng.integers(-30, 3, (n, 1)))).astype(ml_dtypes.bfloat16)
        bias = rng.standard_normal(n).astype(np.float32)
        residual = rng.standard_normal((m, n)).astype(np.float32)
        for quantized in (False, True):
            real, real_scale = lib.pack("amx", w, quantized)
            model, model_scale = lib.pack("amx-model", w, quantized)
            assert np.array_equal(real, model) and (real_scale is None or np.array_equal(real_scale, model_scale))
            for gelu, add in ((False, None), (True, None), (False, residual)):
                want = lib.gemm("amx-model", x, model, n, model_scale, bias, threads=1, residual=add, gelu=gelu)
                for threads in (1, 2):
                    got = lib.gemm("amx", x, real, n, real_scale, bias, threads=threads, residual=add, gelu=gelu)
                    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"m={m} n={n} k={k} e4m3={quantized} gelu={gelu}"


@needs_library
def test_stream_zero_keeps_ys_stores_plain_with_the_same_bits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A product's ``stream`` attribute (lowp.py's ``streaming`` part loads with 0): absent, 1
    and 0 give the same bits on a y past kStreamBytes (4 MiB) on the tiles (or their model),
    anything else is refused by name; ``e4m3.STREAM_Y = False`` puts 0 on every product."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from uform.plugins.sessions.replicas import session_options

    variant = "amx" if "amx" in LIBRARY.runnable else "amx-model"  # type: ignore[union-attr]
    lib = runnable(variant)
    rng = np.random.default_rng(3)
    m, n, k = 1040, 1024, 32  # y: 4.06 MiB of float32
    w = (rng.standard_normal((n, k)) * 0.1).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((m, k)).astype(np.float32)
    packed, _ = lib.pack(variant, w, False)

    def run(stream: int | None) -> np.ndarray:
        extra = {} if stream is None else {"stream": stream}
        node = helper.make_node("MatMulBF16", ["x", "w"], ["y"], domain="ai.uform", variant=e4m3.VARIANTS.index(variant), n=n, **extra)
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k]), helper.make_tensor_value_info("w", TensorProto.UINT16, [packed.size])]
        graph = helper.make_graph([node], "p", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.uform", 1)])
        options = session_options(2)
        options.register_custom_ops_library(str(lib.path))
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x, "w": packed})[0]  # type: ignore[no-any-return]

    want = x.astype(ml_dtypes.bfloat16).astype(np.float64) @ w.astype(np.float64).T
    plain = run(None)
    np.testing.assert_allclose(plain, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert np.array_equal(run(1), plain) and np.array_equal(run(0), plain)
    with pytest.raises(Exception, match=r"ai\.uform\.MatMulBF16: stream must be 0 or 1, not 2"):
        run(2)

    from uform.core import runtime
    from uform.core import safetensors as st
    from uform.core.checkpoint import new, save
    from uform.core.config import ModelConfig
    from uform.core.host import get_host

    checkpoint = tmp_path / "small.safetensors"
    save(checkpoint, *new(get_host(), "small", 0, ["text"]))
    container = st.parse(memoryview(checkpoint.read_bytes()))
    config = ModelConfig.from_metadata(container.metadata)
    for name, (modality, parsed, specs) in runtime.plan_towers(container, config, get_host()).items():
        graph = runtime.build_graph(name, modality, parsed, config, specs)
        weights = {key: container.array(key) for key in specs}
        for flag, want_stream in ((True, None), (False, 0)):
            monkeypatch.setattr(e4m3, "STREAM_Y", flag)
            low = e4m3.lower(graph, weights, True, "amx-model", lib, 1)  # type: ignore[arg-type]
            products = [node for node in low.graph.graph.node if node.op_type.startswith(("MatMulBF16", "MatMulE4M3"))]
            assert products and all({a.name: a.i for a in node.attribute}.get("stream") == want_stream for node in products), name
