"""text_encode throughput against the PyTorch reference, in one run.

    python benchmarks/text.py [--presets tiny,small,base] [--seconds 2] [--uform-only]

For each preset: texts/s and tokens/s of uform's text_encode (ONNX Runtime, CPU) and of the
PyTorch reference of the same checkpoint (FP32 eager, and BF16 autocast), at batch 1 and
batch 64, with the CPU's FP32 peak for context. Both batch sizes encode the same 64
sentences (30-150 bytes): 64 one-text calls against one 64-text call, so the texts/s compare
per text. uform's two batch sizes are timed in alternating rounds (``--rounds``, best of
each), so load from other processes falls on both alike. ``batch64_vs_batch1`` gives, per
preset, uform's texts/s at batch 64 over batch 1 (at least 1: a call of many texts is never
slower per text). Writes benchmarks/results/text.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_peak_gflops, rate, save, table  # noqa: E402

WORDS = "the a cat dog sat on mat market stock price rose fell sharply quietly over under river city night morning bright".split()


def sentences(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(6, 24))).encode() for _ in range(n)]


def alternating(fns: dict[int, Callable[[], None]], items: int, rounds: int) -> dict[int, float]:
    """Items per second of each fn (which handles ``items`` items a call): the best of
    ``rounds`` rounds, each running every fn once in turn, after one warm-up call each."""
    best = {k: float("inf") for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return {k: items / t for k, t in best.items()}


def flops_per_text(params: int, tokens: float, width: int, depth: int) -> float:
    return 2 * params * tokens + 4 * depth * tokens * tokens * width  # matmuls + attention


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", default="tiny,small,base")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of uform at batch 1 and 64")
    parser.add_argument("--uform-only", action="store_true", help="skip the PyTorch reference")
    args = parser.parse_args()

    import torch

    import uform
    from uform.core import checkpoint
    from uform.core.host import get_host
    from uform.exporters.reference import ReferenceModel

    threads = uform.core.executor.available_cores()
    torch.set_num_threads(threads)
    peak, peak_note = cpu_peak_gflops()
    rows, results = [], {"peak_gflops": peak, "peak": peak_note, "threads": threads, "runs": [], "batch64_vs_batch1": {}}
    for preset in args.presets.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{preset}.safetensors"
            config, tensors = checkpoint.new(get_host(), preset, 0, ["text"])
            checkpoint.save(path, config, tensors)
            params = sum(t.size for t in tensors.values())
            model = uform.Model.load_ram(path)
            ref = ReferenceModel.from_checkpoint(path).towers["text"]
        g = config.towers["text"]
        texts = sentences(64)
        mean_tokens = float(np.mean([min(len(t), config.context) + 1 for t in texts]))
        arena = uform.Arena()

        def ours(batch: int) -> Callable[[], None]:
            calls = [texts[i : i + batch] for i in range(0, len(texts), batch)]

            def run() -> None:
                for call in calls:
                    model.text_encode(call, arena)

            return run

        uform_rate = alternating({1: ours(1), 64: ours(64)}, len(texts), args.rounds)
        for batch in (1, 64):
            calls = [texts[i : i + batch] for i in range(0, len(texts), batch)]

            def eager() -> None:
                with torch.no_grad():
                    for call in calls:
                        ref.encode(call)

            def autocast() -> None:
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    for call in calls:
                        ref.encode(call)

            per_text = flops_per_text(params, mean_tokens, g["width"], g["depth"])
            torch_runs = [] if args.uform_only else [("torch fp32", eager), ("torch bf16 autocast", autocast)]
            measured = {"uform": uform_rate[batch]} | {name: rate(fn, len(texts), args.seconds) for name, fn in torch_runs}
            for name, texts_s in measured.items():
                row = {
                    "preset": preset, "batch": batch, "runtime": name, "texts/s": round(texts_s, 1),
                    "tokens/s": round(texts_s * mean_tokens), "GFLOP/s": round(texts_s * per_text / 1e9, 1),
                    "% of peak": f"{100 * texts_s * per_text / 1e9 / peak:.1f}", "vs torch fp32": f"{texts_s / measured['torch fp32']:.2f}x" if "torch fp32" in measured else "",
                }  # fmt: skip
                rows.append(row)
                results["runs"].append(row | {"params": params, "mean_tokens": mean_tokens})
        ours_at = {r["batch"]: r["texts/s"] for r in results["runs"] if r["preset"] == preset and r["runtime"] == "uform"}
        results["batch64_vs_batch1"][preset] = round(ours_at[64] / ours_at[1], 2)
    print(f"CPU FP32 peak: {peak:.0f} GFLOP/s = {peak_note}")
    print(table(rows, ["preset", "batch", "runtime", "texts/s", "tokens/s", "GFLOP/s", "% of peak", "vs torch fp32"]))
    for preset, ratio in results["batch64_vs_batch1"].items():
        print(f"{preset}: uform at batch 64 runs {ratio:.2f}x the texts/s of batch 1 (same 64 texts)")
    print(f"wrote {save('text', results)}")


if __name__ == "__main__":
    main()
