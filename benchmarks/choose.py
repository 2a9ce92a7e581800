"""text_choose throughput beside text_encode, and the calibration experiment, in one run.

    python benchmarks/choose.py [--presets tiny,small] [--seconds 1] [--examples 3000]

Throughput: questions/s of ``text_choose`` (4 choices each) at batch 1 and batch 64, beside
``text_encode`` of the same texts, the decoder graph alone on prepared feeds (what the
host adds is the difference), and the PyTorch reference's ``choose``. Calibration: answers
drawn from the model's own probabilities at known per-group temperatures (the checkpoint
is untrained, so this is the only ground truth there is), temperatures fitted on 75% and
ECE / NLL measured on the held-out 25% (on the tiny preset: the method does not depend on
the size). Writes benchmarks/results/choose.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402

SUBJECTS = "the river city market price night morning engine planet theorem protein election".split()
TRUE_TEMPERATURES = [0.05, 0.15, 0.5]  # per group: multiple choice, yes/no, digits


def questions(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = " ".join(rng.choice(SUBJECTS, rng.integers(4, 16)))
        out.append(f"Q{i}: which is true of {words}? A) one B) two C) three D) four. Answer:")
    return out


def rate(fn: Callable[[], Any], items: int, seconds: float) -> tuple[float, float]:
    """Items per second of ``fn`` (``items`` per call) after a warm-up, the best of the calls
    made in ``seconds`` (one at least); and the CPU milliseconds per item of that call (all
    of this process's threads), steadier than wall time on a shared machine."""
    fn()
    best, cpu, spent = float("inf"), float("inf"), 0.0
    while spent < seconds or best == float("inf"):
        t, c = time.perf_counter(), time.process_time()
        fn()
        took, used = time.perf_counter() - t, time.process_time() - c
        best, cpu, spent = min(best, took), min(cpu, used), spent + took
    return items / best, 1000 * cpu / items


def throughput(model: Any, ref: Any, seconds: float) -> list[dict[str, Any]]:
    import torch

    import uform
    from uform.model import runtime_of
    from uform.plugins.choose import feeds

    runner = runtime_of(model).placement.runners["decoder"]
    context = model.describe().context
    rows = []
    for batch in (1, 64):
        texts = questions(8 if batch == 1 else batch)
        calls = [texts[i : i + batch] for i in range(0, len(texts), batch)]
        arena = uform.Arena()
        prepared = []
        for call in calls:
            chunks = [t.encode()[-context:] for t in call]
            prepared.append(feeds(chunks, np.array([len(c) for c in chunks]), np.arange(len(chunks))).feeds)
        encoded = [[t.encode() for t in call] for call in calls]

        def choose() -> None:
            for call in calls:
                model.text_choose(call, "ABCD", arena)

        def encode() -> None:
            for call in calls:
                model.text_encode(call, arena)

        def graph_only() -> None:
            for f in prepared:
                runner.run(["logits"], f)

        def reference() -> None:
            with torch.no_grad():
                for call in encoded:
                    ref.choose(call, [b"ABCD"] * len(call))

        for name, fn in (("text_choose", choose), ("decoder graph only", graph_only),
                         ("text_encode", encode), ("PyTorch reference choose", reference)):  # fmt: skip
            qps, cpu_ms = rate(fn, len(texts), seconds)
            rows.append({"what": name, "batch": batch, "per_s": round(qps, 1), "cpu_ms_per_item": round(cpu_ms, 3)})
            print(f"  {name:26s} batch {batch:3d}: {qps:9.1f} /s  {cpu_ms:8.3f} CPU ms per text", flush=True)
    return rows


def calibration(path: Path, out: Path, n: int) -> dict[str, Any]:
    import uform
    from uform import calibrate as cal

    model = uform.Model.load_ram(path)
    rng = np.random.default_rng(1)
    kinds = ("ABCD", "yn", "0123456789")
    texts = [f"{q} ({kinds[i % 3]})" for i, q in enumerate(questions(n, seed=2))]
    texts = [t[: int(rng.integers(10, len(t) + 1))] for t in texts]
    groups = [i % 3 for i in range(n)]
    examples = cal.sample_examples(model, texts, [kinds[g] for g in groups], groups, TRUE_TEMPERATURES, seed=3)
    t = time.perf_counter()
    report = cal.calibrate(path, examples, out, holdout=0.25, seed=0)
    summary = cal.summary(report) | {"true_temperatures": TRUE_TEMPERATURES, "seconds": round(time.perf_counter() - t, 2)}
    del summary["out"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", default="tiny,small", help="presets to measure throughput on")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--examples", type=int, default=3000, help="questions of the calibration experiment (tiny preset)")
    args = parser.parse_args()

    import torch

    import uform
    from uform.core import checkpoint
    from uform.core.executor import available_cores
    from uform.core.host import get_host
    from uform.exporters.reference import ReferenceModel

    torch.set_num_threads(available_cores())
    results: dict[str, Any] = {"threads": available_cores(), "throughput": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            path = Path(tmp) / f"{preset}.safetensors"
            config, tensors = checkpoint.new(get_host(), preset, 0, ["text", "choose"])
            checkpoint.save(path, config, tensors)
            model = uform.Model.load_ram(path)
            ref = ReferenceModel.from_checkpoint(path).towers["decoder"]
            print(f"{preset}: context {config.context}, decoder {config.towers['decoder']}, {available_cores()} threads")
            results["throughput"][preset] = throughput(model, ref, args.seconds)
        path = Path(tmp) / "calibration.safetensors"
        checkpoint.save(path, *checkpoint.new(get_host(), "tiny", 0, ["choose"]))
        print(f"calibration (tiny) on {args.examples} synthetic questions, true temperatures {TRUE_TEMPERATURES}:")
        results["calibration"] = calibration(path, Path(tmp) / "calibrated.safetensors", args.examples)
    c = results["calibration"]
    print(f"  fitted {[round(t, 4) for t in c['temperatures']]}  ECE {c['ece_before']:.4f} -> {c['ece_after']:.4f}"
          f"  NLL {c['nll_before']:.4f} -> {c['nll_after']:.4f}  accuracy {c['accuracy']:.3f}")  # fmt: skip
    print(f"wrote {save('choose', results)}")


if __name__ == "__main__":
    main()
