"""Fused attention (the op library's ``ai.uform.Attention``) against ONNX Runtime's unfused
MatMul/Softmax/MatMul, tower by tower, for each kernel variant this CPU runs.

Loads run with attention fused only for the variants in ``uform.plugins.e4m3.FUSED_ATTENTION``
(today every variant). For each variant a load on this CPU reaches, this script loads each
tower twice with the same BF16 weights, pinned to the variant's class — once with the
variant in that set, once without — and times both loads in turns in one process (median
latency of each case), so that the ratio compares like with like on a shared machine: text
(a 12-byte query, a 52-byte text, 64 texts of 86 bytes) and images (1 and 16 of 224 x 224).
It also checks that both loads answer the same embeddings (max |difference|). Writes
benchmarks/results/attention.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import save, table  # noqa: E402

CLASS_OF = {"avx2": "x86-64-v3", "avx2-split": "x86-64-v3", "avx512": "x86-64-v4", "avx512-bf16": "x86-64-v4+vnni+bf16", "amx": "x86-64-amx"}


def cases(tower: str, rng: np.random.Generator, small: bool) -> list[tuple[str, list[Any]]]:
    if tower == "text":
        return [
            ("12 B", [b"a red circle"]),
            ("52 B", [b"a red circle moves left while two blue squares rest u"]),
            ("4 x 86 B" if small else "64 x 86 B", [bytes(rng.integers(97, 123, 86).astype(np.uint8)) for _ in range(4 if small else 64)]),
        ]  # fmt: skip
    side = 32 if small else 224
    return [(f"{n} image{'s' * (n > 1)}", [rng.integers(0, 256, (side, side, 3)).astype(np.uint8) for _ in range(n)]) for n in (1, 4 if small else 16)]


def measure(variant: str, path: Path, tower: str, seconds: float, small: bool) -> list[dict[str, Any]]:
    import uform
    import uform.plugins.e4m3 as e4m3

    usual = e4m3.FUSED_ATTENTION
    pin = uform.CPUClass(CLASS_OF[variant])
    loads = {}
    try:
        for fused in (False, True):
            e4m3.FUSED_ATTENTION = usual | {variant} if fused else usual - {variant}
            loads[fused] = uform.Model.load_ram(path, quantization="bf16", cpu_class=pin)
    finally:
        e4m3.FUSED_ATTENTION = usual
    arena = uform.Arena()
    rows = []
    for name, batch in cases(tower, np.random.default_rng(0), small):
        encode: dict[bool, Callable[[], Any]] = {
            f: (lambda m=m: m.text_encode(batch, arena)) if tower == "text" else (lambda m=m: m.image_encode_pixels(batch, arena))
            for f, m in loads.items()
        }  # fmt: skip
        got = {f: np.array(fn().embeddings, copy=True) for f, fn in encode.items()}  # copies: the arena is reused
        times: dict[bool, list[float]] = {False: [], True: []}
        start = time.perf_counter()
        while time.perf_counter() - start < seconds or len(times[True]) < 3:
            for f, fn in encode.items():
                t = time.perf_counter()
                fn()
                times[f].append(time.perf_counter() - t)
        unfused, fused = (statistics.median(times[f]) * 1e3 for f in (False, True))
        rows.append({
            "variant": variant, "tower": tower, "case": name, "unfused ms": f"{unfused:.2f}", "fused ms": f"{fused:.2f}",
            "fused speed": f"{unfused / fused:.3f}x", "max |diff|": f"{np.abs(got[True] - got[False]).max():.1e}",
        })  # fmt: skip
        print(table(rows[-1:], list(rows[-1])), flush=True)
    for model in loads.values():
        model.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--towers", default="text,image")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()

    import uform
    from uform.core import checkpoint
    from uform.core.host import get_host
    from uform.plugins.cpu import machine_classes
    from uform.plugins.oplib.library import OpLibraryError, library

    classes = machine_classes()
    print(f"cpu class: {classes[-1].value}; threads: {uform.core.executor.available_cores()}")
    result: dict[str, Any] = {"cpu_class": classes[-1].value, "preset": args.preset, "rows": []}
    try:
        runnable = sorted(library().runnable)
    except OpLibraryError as exc:  # the fallback: nothing fused to time
        result["skipped"] = str(exc)
        print(f"skipped: {exc}")
        save("attention", result)
        return
    # a variant no load reaches on this machine is not timed: here x86-64-v3 takes either
    # avx2 or avx2-split (uform.plugins.e4m3.variant_of), never both
    from uform.plugins.e4m3 import variant_of

    reached = [v for v in runnable if v in CLASS_OF and variant_of(uform.CPUClass(CLASS_OF[v])) == v]  # amx-model: tests only
    if skipped := sorted(set(runnable) - set(reached)):
        print(f"not timed (no load on this machine runs them): {', '.join(skipped)}")
    with tempfile.TemporaryDirectory() as tmp:
        for tower in args.towers.split(","):
            path = Path(tmp) / f"{tower}.safetensors"
            config, tensors = checkpoint.new(get_host(), args.preset, 0, [tower])
            checkpoint.save(path, config, tensors)
            for variant in reached:
                result["rows"] += measure(variant, path, tower, args.seconds, args.preset == "tiny")
    print()
    print(table(result["rows"], list(result["rows"][0])) if result["rows"] else "no rows")
    print(f"wrote {save('attention', result)}")


if __name__ == "__main__":
    main()
