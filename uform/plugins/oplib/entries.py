"""The op library's C entries, as Python calls: :class:`OpLibrary` (packing weights into the
panels the kernels read, a product outside ONNX Runtime and one inside it, attention, the
measured FMA peak, the modelled tile configuration), the kernel variants by the index the
entries take, and :class:`OpLibraryError`. Finding and loading the library is
:mod:`uform.plugins.oplib.library`, which re-exports these names."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from uform.plugins.oplib.memory import aligned_empty, zeros

# Kernel variants, by the index the ops take. ``amx-model`` runs the amx kernels over a scalar
# model of the tile instructions on any AVX2 machine: for tests; no load takes it.
VARIANTS = ("avx2", "avx512", "avx512-bf16", "avx2-split", "amx", "amx-model")
# Variants whose products take BF16 pairs (VDPBF16PS, TDPBF16PS): x is rounded to BF16 once per
# product, and BF16 subnormals (weights or activations) count as zeros.
BF16_PRODUCTS = frozenset({"avx512-bf16", "amx", "amx-model"})
BF16, E4M3 = 0, 1  # weight types, as the library numbers them
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
# what a matrix to pack may be: BF16 values, or their bits (float16, two bytes too, is not BF16)
BF16_DTYPES = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.uint16))


class OpLibraryError(RuntimeError):
    """The op library cannot be used here; the message says why."""


def _pointer(array: np.ndarray | None) -> Any:
    return None if array is None else array.ctypes.data_as(_P)


def cannot_run(variant: str) -> OpLibraryError:
    """The refusal of an entry asked for kernels this CPU lacks (the library runs none of them)."""
    return OpLibraryError(f"this CPU cannot run the {variant} kernels")


@dataclass(frozen=True)
class OpLibrary:
    """A loaded op library: its path, the kernel variants this CPU runs, whether this CPU
    runs 256-bit AVX operations as two 128-bit halves (``splits_256``: AMD Zen 1 and Zen+,
    whose AVX2 loads take the ``avx2-split`` kernels), the CPU's vendor (``intel``, ``amd`` or
    ``other``) and, where the amx kernels cannot run, why not (``amx_refusal``: no AMX, no
    tile state from the operating system, or Linux refused the permission)."""

    path: Path
    handle: ctypes.CDLL
    runnable: frozenset[str]
    splits_256: bool = False
    vendor: str = "other"
    amx_refusal: str | None = None

    def packed_elements(self, variant: str, n: int, k: int) -> int:
        """Elements of an [n, k] matrix packed for ``variant`` (panels padded with zeros)."""
        return int(self.handle.uform_packed_elements(VARIANTS.index(variant), _I64(n), _I64(k)))

    def pack(self, variant: str, weights: np.ndarray, e4m3: bool, threads: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
        """``weights`` (BF16, [n, k]) packed for ``variant``: BF16 bits (uint16), or E4M3
        codes (uint8) and a float32 scale per output row. ValueError names the index of a
        weight that is NaN or infinite."""
        return self.pack_all(variant, [(weights.shape, e4m3)], lambda i: weights, threads)[0]

    def pack_all(
        self,
        variant: str,
        matrices: Sequence[tuple[tuple[int, ...], bool]],
        fetch: Callable[[int], np.ndarray],
        threads: int = 1,
    ) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Each matrix ``i``, of ``matrices[i] = (shape, e4m3)``, packed as :meth:`pack` does,
        all in one private anonymous map of huge pages (its pages go back to the system when
        the last array goes; see :func:`zeros`). ``fetch(i)``
        answers matrix ``i``'s BF16 weights when its turn comes (it may reuse one buffer for
        all). ValueError names a weight that is not finite."""
        shapes = []
        for shape, e4m3 in matrices:
            if len(shape) != 2 or 0 in shape:
                raise ValueError(f"weights must be a non-empty [n, k] matrix, got shape {list(shape)}")
            dtype = np.dtype(np.uint8 if e4m3 else np.uint16)
            shapes.append((self.packed_elements(variant, *shape), dtype))
        arrays = zeros(shapes)
        packed = []
        for i, ((shape, e4m3), out) in enumerate(zip(matrices, arrays)):
            weights = fetch(i)
            if weights.shape != tuple(shape) or weights.dtype not in BF16_DTYPES:
                raise ValueError(f"matrix {i}: expected BF16 {list(shape)}, got {weights.dtype} {list(weights.shape)}")
            bits = np.ascontiguousarray(weights).view(np.uint16)
            n, k = bits.shape
            scale = np.zeros(n, np.float32) if e4m3 else None
            found = self.handle.uform_pack(
                VARIANTS.index(variant), E4M3 if e4m3 else BF16, _pointer(bits), _I64(n), _I64(k),
                _pointer(out), _pointer(scale), max(1, threads),
            )  # fmt: skip
            if found == -3:
                raise cannot_run(variant)
            if found < -1:
                raise ValueError(f"the op library refused to pack a [{n}, {k}] matrix for {variant} ({found})")
            if found >= 0:
                raise ValueError(f"weight [{found // k}, {found % k}] is not finite")
            packed.append((out, scale))
        return packed

    def gemm(
        self, variant: str, x: np.ndarray, packed: np.ndarray, n: int,
        scale: np.ndarray | None = None, bias: np.ndarray | None = None, threads: int = 1,
        residual: np.ndarray | None = None, gelu: bool = False, activation: int = 0,
    ) -> np.ndarray:  # fmt: skip
        """``act(scale * (x @ W.T) + bias) + residual`` with W packed for ``variant`` by
        :meth:`pack`; ``act`` is the ops' ``activation`` (0 the identity, 1 exact GELU, 2 tanh
        GELU, 3 quick GELU; ``gelu`` is 1)."""
        x = np.ascontiguousarray(x, np.float32)
        m, k = x.shape
        if packed.size != self.packed_elements(variant, n, k):
            raise ValueError(f"packed holds {packed.size} elements, not an [{n}, {k}] matrix packed for {variant}")
        for name, vector in (("scale", scale), ("bias", bias)):
            if vector is not None and (vector.dtype != np.float32 or vector.shape != (n,)):
                raise ValueError(f"{name} must be float32 [{n}]")
        if residual is not None and (residual.dtype != np.float32 or residual.shape != (m, n) or not residual.flags.c_contiguous):
            raise ValueError(f"residual must be a C-contiguous float32 [{m}, {n}]")
        if activation not in (0, 1, 2, 3):
            raise ValueError(f"activation must be 0 (none), 1 (GELU), 2 (tanh GELU) or 3 (quick GELU), not {activation}")
        y = aligned_empty((m, n), np.float32)  # as ONNX Runtime's outputs: the kernels write whole lines
        wtype = E4M3 if packed.dtype == np.uint8 else BF16
        rc = self.handle.uform_gemm(
            VARIANTS.index(variant), _pointer(x), _I64(m), _I64(k), _pointer(packed), wtype, _I64(n),
            _pointer(scale), _pointer(bias), _pointer(residual), 1 if gelu else activation, _pointer(y), max(1, threads),
        )  # fmt: skip
        if rc == 1:
            raise cannot_run(variant)
        if rc != 0:
            raise OpLibraryError(f"uform_gemm failed ({rc})")
        return y

    def product_session(
        self, variant: str, e4m3: bool, n: int, k: int, packed_size: int, threads: int, pool: int | None = None, bias: bool = False
    ) -> Any:  # fmt: skip
        """One product node in an ONNX Runtime session, as the towers run it: feeds ``x`` [m, k]
        (any m), ``w`` (``packed_size`` elements packed by :meth:`pack`), ``scale`` [n] when
        ``e4m3`` and ``bias`` [n] when ``bias``; its tasks cut for ``threads`` threads (the
        node's ``threads`` attribute), run by a pool of ``pool`` (default ``threads``)."""
        import onnxruntime as ort
        from onnx import TensorProto, helper

        from uform.plugins.sessions.replicas import session_options

        op, wtype = ("MatMulE4M3", TensorProto.UINT8) if e4m3 else ("MatMulBF16", TensorProto.UINT16)
        names = ["x", "w"] + (["scale"] if e4m3 else []) + (["bias"] if bias else [])
        shapes: dict[str, list[str | int]] = {"x": ["m", k], "w": [packed_size], "scale": [n], "bias": [n]}
        inputs = [helper.make_tensor_value_info(name, wtype if name == "w" else TensorProto.FLOAT, shapes[name]) for name in names]
        node = helper.make_node(op, names, ["y"], domain="ai.uform", variant=VARIANTS.index(variant), n=n, threads=threads)
        graph = helper.make_graph([node], "product", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.uform", 1)])
        options = session_options(threads if pool is None else pool)
        options.register_custom_ops_library(str(self.path))
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def fma_peak(self, variant: str, threads: int = 1) -> float | None:
        """FLOP/s of ``variant``'s products on ``threads`` threads at once with nothing but
        registers (the best of 3 runs of about 0.1 s): the class's peak as measured here, for
        benchmarks' share of peak: FMA chains for AVX2's variants, TDPBF16PS chains for
        ``amx``. None where the variant has no probe or this CPU cannot run it."""
        rate = float(self.handle.uform_fma_peak(VARIANTS.index(variant), max(1, threads)))
        return rate if rate > 0 else None

    def model_tile_config(self, config: bytes | None = None) -> bytes:
        """The calling thread's tile configuration as the ``amx-model`` variant models it (64
        bytes; all zeros where none is loaded), then set to ``config`` where given: tests see
        that a product leaves it as it found it."""
        out = ctypes.create_string_buffer(64)
        given = None if config is None else ctypes.create_string_buffer(bytes(config), 64)
        self.handle.uform_amx_model_config(out, given)
        return out.raw

    def attention(
        self,
        qkv: np.ndarray,
        items: int,
        heads: int,
        mask: np.ndarray | None = None,
        causal: bool = False,
        threads: int = 1,
        variant: str = "avx512",
    ) -> np.ndarray:
        """The ``Attention`` op outside ONNX Runtime, through ``variant``'s kernel (AVX2's float32
        for ``avx2`` and ``avx2-split``, the tiles' for ``amx`` and their scalar model for
        ``amx-model``, AVX-512's float32 scores with BF16 values for ``avx512-bf16``, AVX-512's
        float32 for ``avx512``): ``qkv`` float32 [items * tokens, 3W];
        ``mask`` additive, [items, tokens] (padding), or [tokens, tokens] when ``causal``."""
        qkv = np.ascontiguousarray(qkv, np.float32)
        rows, triple = qkv.shape
        if items < 0 or rows % max(items, 1) or (items == 0 and rows):
            raise ValueError(f"qkv's {rows} rows are not {items} items of equal length")
        tokens, width = rows // max(items, 1), triple // 3
        if heads < 1 or triple % (3 * heads) or width // heads % 16 or width == 0:
            raise ValueError(f"qkv must be [items * tokens, 3 * heads * head_dim] with head_dim a multiple of 16, got width {triple} for {heads} heads")
        if mask is not None:
            mask = np.ascontiguousarray(mask, np.float32)
            if mask.shape != ((tokens, tokens) if causal else (items, tokens)):
                raise ValueError(f"mask must be {'[tokens, tokens]' if causal else '[items, tokens]'}, got {list(mask.shape)}")
        out = np.empty((rows, width), np.float32)
        rc = self.handle.uform_attention(
            VARIANTS.index(variant), _pointer(qkv), _pointer(mask), int(causal), _pointer(out), _I64(items), _I64(tokens), _I64(heads),
            _I64(width // heads), max(1, threads),
        )  # fmt: skip
        if rc == 1:
            raise cannot_run(variant)
        if rc != 0:
            raise OpLibraryError(f"uform_attention failed ({rc})")
        return out
