"""One prepared check on a machine with an NVIDIA GPU, in under 5 minutes.

    python benchmarks/gpu_check.py [--preset base] [--devices 0] [--seconds 1.5] [--compute tf32,f16] [--batches 1,256]

1. Prints what the check runs on: Python, onnxruntime (which wheel, the CUDA and cuDNN it
   was built for, its providers), the driver and devices, which CUDA libraries load.
   Stops with exit status 2, saying why and writing nothing, when CUDA cannot run.
2. Makes a random checkpoint of every installed modality (``--preset``), loads it with
   ``Model.load_vram`` (the load time is reported) and, for every tower the PyTorch
   reference supports, checks the CUDA tower against the reference (float32, CPU) on the
   same inputs: max abs error and min cosine per tower.
3. Throughput at batch 1 and 256 (``--batches``): per tower (feeds already made: compute and transfers),
   and end to end for the verbs with synthetic inputs (texts/s, images/s).
4. The peer, once: the PyTorch reference towers on the same device with the same feeds
   (already on the device), in float32 with TF32 matrix products and under BF16 autocast;
   each uform tower row then shows its ratio to both (where PyTorch has CUDA).

Steps 2 and 3 run once per ``--compute`` setting of the cuda backend: ``tf32`` (the
default: float32, TF32 products), ``f16`` (weight matrix products in float16) and ``e4m3``
(``quantization=Scalar.E4M3``: the blocks' matrices held as FP8 codes, dequantized on the
device; on a class without FP8 the refusal is reported and the run goes on). Parity asks a
cosine above 0.999 of the float settings and above 0.98 of E4M3.

Writes benchmarks/results/gpu_check.json (docs/benchmarks.md quotes it). Needs the
``onnxruntime-gpu`` wheel in place of ``onnxruntime`` (docs/gpus.md), with its CUDA 12
and cuDNN 9 libraries (CUDA 13 for onnxruntime-gpu 1.27 and newer on PyPI), and torch (CPU is
enough) for the reference.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import rate, save, table  # noqa: E402

PARITY_ROWS, LENGTH = 8, 64  # rows compared with the reference; bytes per text / decoder row


def versions() -> dict[str, Any]:
    """Everything about the software and devices the numbers depend on (printed as found)."""
    import onnxruntime as ort

    wheels = {d: metadata.version(d) for d in ("onnxruntime", "onnxruntime-gpu") if _installed(d)}
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(), "onnxruntime": ort.__version__}
    info["wheels"] = wheels
    try:
        from onnxruntime.capi import build_and_package_info as build

        info["built_for"] = {k: getattr(build, k) for k in ("package_name", "cuda_version", "cudnn_version") if hasattr(build, k)}
    except ImportError:
        info["built_for"] = {}
    from uform.plugins import cuda

    info["providers"] = ort.get_available_providers()
    needed = cuda.needed_libraries(cuda.built_for())
    missing = cuda.missing_libraries(cuda.built_for())  # after onnxruntime.preload_dlls(), as the backend does
    info["libraries"] = {lib: "missing" if lib in missing else "loads" for lib in needed} or "not known for this wheel"
    found = cuda.detect()
    info["driver"], info["detected_by"] = found.driver, found.source
    info["devices"] = [f"{g} {g.memory >> 20} MiB" for g in found.gpus]
    info["detect_error"] = found.reason
    try:
        import torch

        info["torch"] = f"{torch.__version__} (cuda {torch.version.cuda}, available {torch.cuda.is_available()})"
    except ImportError:
        info["torch"] = "not installed"
    for key, value in info.items():
        print(f"{key:>14}: {value}")
    return info


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def synthetic_feeds(graph: Any, rows: int, rng: np.random.Generator, length: int) -> dict[str, np.ndarray]:
    """Valid feeds for any tower graph: bytes for 2-D integer inputs (``length`` of them, the
    size of every unnamed dimension), positions under ``length`` for 1-D integer inputs
    (text ``lengths``, decoder ``last``), pixels and samples else."""
    from onnx import TensorProto

    feeds: dict[str, np.ndarray] = {}
    for value in graph.graph.input:
        t = value.type.tensor_type
        dims = [rows] + [d.dim_value or length for d in t.shape.dim[1:]]
        if t.elem_type == TensorProto.INT64:
            feeds[value.name] = rng.integers(0, 256, dims) if len(dims) > 1 else rng.integers(1, length, dims)
        elif t.elem_type == TensorProto.UINT8:
            feeds[value.name] = rng.integers(0, 256, dims, dtype=np.uint8)
        else:
            feeds[value.name] = (rng.standard_normal(dims) * 0.1).astype(np.float32)
    return feeds


def parity(model: Any, path: Path, towers: list[str], min_cosine: float = 0.999) -> list[dict[str, Any]]:
    import torch

    from uform.exporters.reference import ReferenceModel
    from uform.model import runtime_of

    ref = ReferenceModel.from_checkpoint(path)
    rows, rng = [], np.random.default_rng(0)
    for name in towers:
        loaded = runtime_of(model).towers[name]
        feeds = synthetic_feeds(loaded.graph, PARITY_ROWS, rng, min(LENGTH, model.describe().context))
        first = loaded.graph.graph.output[0].name
        try:
            got = runtime_of(model).placement.runners[name].run([first], feeds)[0].astype(np.float64)
            with torch.no_grad():
                want = ref.towers[name](*(torch.from_numpy(f) for f in feeds.values()))
        except Exception as exc:  # noqa: BLE001 - one tower's failure is reported, the others still run
            rows.append({"tower": name, "output": first, "error": f"{type(exc).__name__}: {exc}"[:300], "ok": False})
            continue
        want = (want[0] if isinstance(want, tuple) else want).double().numpy()
        cosine = np.sum(got * want, 1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        error = float(np.abs(got - want).max())
        ok = bool(cosine.min() > min_cosine and (min_cosine < 0.999 or error <= 1e-2 * max(1.0, float(np.abs(want).max()))))
        rows.append({"tower": name, "output": first, "max_abs_error": f"{error:.2e}", "min_cosine": f"{cosine.min():.6f}", "ok": ok})
    return rows


def throughput(model: Any, towers: list[str], seconds: float, batches: list[int]) -> list[dict[str, Any]]:
    from uform import Arena
    from uform.model import runtime_of

    rows, rng = [], np.random.default_rng(1)
    for name in towers:
        loaded, runner = runtime_of(model).towers[name], runtime_of(model).placement.runners[name]
        first = loaded.graph.graph.output[0].name
        for batch in batches:
            feeds = synthetic_feeds(loaded.graph, batch, rng, min(LENGTH, model.describe().context))
            rows.append(_measure(f"{name} tower", batch, "", lambda: runner.run([first], feeds), seconds))
    words = "the a cat dog sat on mat river city night morning bright market rose".split()
    verbs: dict[str, tuple[str, Any]] = {
        "text_encode": ("texts/s", lambda n: [" ".join(rng.choice(words, 12)) for _ in range(n)]),
        "image_encode_pixels": ("images/s", lambda n: [rng.integers(0, 256, (256, 320, 3), dtype=np.uint8) for _ in range(n)]),
    }
    for verb, (unit, make) in verbs.items():
        if verb not in model.served.verbs:
            continue
        for batch in batches:
            items, arena = make(batch), Arena()
            rows.append(_measure(verb, batch, unit, lambda: getattr(model, verb)(items, arena), seconds))
    return rows


def torch_peer(path: Path, model: Any, towers: list[str], seconds: float, batches: list[int]) -> dict[tuple[str, int, str], float]:
    """Items/s of the PyTorch reference towers on CUDA device 0, keyed (tower, batch, setting):
    ``tf32`` (float32 weights, TF32 products, as uform's default) and ``bf16`` (autocast)."""
    import torch

    from uform.exporters.reference import ReferenceModel
    from uform.model import runtime_of

    if not torch.cuda.is_available():
        print("\n(no PyTorch peer: this torch has no CUDA)")
        return {}
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    ref = ReferenceModel.from_checkpoint(path).to("cuda")
    found: dict[tuple[str, int, str], float] = {}
    rng = np.random.default_rng(1)
    for name in towers:
        loaded = runtime_of(model).towers[name]
        for batch in batches:
            feeds = synthetic_feeds(loaded.graph, batch, rng, min(LENGTH, model.describe().context))
            args = [torch.from_numpy(f).to("cuda") for f in feeds.values()]
            for setting in ("tf32", "bf16"):

                def run() -> None:
                    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=setting == "bf16"):
                        ref.towers[name](*args)
                    torch.cuda.synchronize()

                try:
                    found[(name, batch, setting)] = rate(run, batch, seconds)
                except Exception as exc:  # noqa: BLE001 - a failed peer row is reported, not fatal
                    print(f"(PyTorch {setting} {name} at batch {batch} failed: {type(exc).__name__}: {exc})"[:300])
    del ref
    torch.cuda.empty_cache()
    return found


def with_peer(rows: list[dict[str, Any]], peer: dict[tuple[str, int, str], float]) -> None:
    """Adds ``vs torch tf32`` / ``vs torch bf16`` to the tower rows the peer measured."""
    for row in rows:
        tower = row["what"].removesuffix(" tower")
        for setting in ("tf32", "bf16"):
            theirs = peer.get((tower, row["batch"], setting))
            if theirs and isinstance(row["items/s"], float):
                row[f"vs torch {setting}"] = f"{row['items/s'] / theirs:.2f}x"


def _measure(what: str, batch: int, unit: str, fn: Any, seconds: float) -> dict[str, Any]:
    """One throughput row; a failure (e.g. out of memory at batch 256) is recorded, not fatal."""
    try:
        return {"what": what, "batch": batch, "items/s": round(rate(fn, batch, seconds), 1), "unit": unit}
    except Exception as exc:  # noqa: BLE001
        return {"what": what, "batch": batch, "items/s": "failed", "unit": f"{type(exc).__name__}: {exc}"[:200]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="base")
    parser.add_argument("--devices", default="0", help="comma-separated CUDA ordinals, e.g. 0,1")
    parser.add_argument("--seconds", type=float, default=1.5, help="seconds per throughput measurement")
    parser.add_argument("--compute", default="tf32,f16,e4m3", help="cuda.COMPUTE settings (or e4m3) to check, in order")
    parser.add_argument("--batches", default="1,256", help="batch sizes of the throughput rows")
    parser.add_argument("--no-peer", action="store_true", help="skip the PyTorch reference on CUDA")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result: dict[str, Any] = {"versions": versions(), "preset": args.preset}
    from uform.plugins import cuda

    reason = cuda.probe()
    if reason is not None:
        print(f"\nGPU CHECK CANNOT RUN: {reason}\n(nothing written)")
        return 2

    import uform
    from uform.core import checkpoint
    from uform.core.host import get_host
    from uform.exporters.reference import TOWERS

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{args.preset}.safetensors"
        config, tensors = checkpoint.new(get_host(), args.preset, 0)
        checkpoint.save(path, config, tensors)
        result["checkpoint_bytes"] = path.stat().st_size
        devices = [int(d) for d in args.devices.split(",")]
        result["devices"], result["runs"] = devices, {}
        peer: dict[tuple[str, int, str], float] | None = None
        for compute in args.compute.split(","):
            cuda.COMPUTE = "tf32" if compute == "e4m3" else compute
            quantization = uform.Scalar.E4M3 if compute == "e4m3" else uform.Scalar.BF16
            t = time.perf_counter()
            try:
                model = uform.Model.load_vram(path, devices=devices, quantization=quantization)
            except uform.UnsupportedError as exc:
                print(f"\n[{compute}] refused: {exc}")
                result["runs"][compute] = {"refused": str(exc)}
                continue
            run: dict[str, Any] = {"load_vram_s": round(time.perf_counter() - t, 2), "compute": model.compute}
            run["description"] = {k: str(v) for k, v in model.describe()._asdict().items()}
            towers = list(model.served.towers)
            print(f"\n[{compute}] load_vram of {path.stat().st_size >> 20} MiB on devices {devices}: {run['load_vram_s']} s; towers {towers}")
            run["parity"] = parity(model, path, [n for n in towers if n in TOWERS], 0.98 if compute == "e4m3" else 0.999)
            print(table(run["parity"], ["tower", "output", "max_abs_error", "min_cosine", "ok", "error"]))
            batches = [int(b) for b in args.batches.split(",")]
            run["throughput"] = throughput(model, towers, args.seconds, batches)
            if peer is None and not args.no_peer:
                peer = torch_peer(path, model, [n for n in towers if n in TOWERS], args.seconds, batches)
                result["torch_peer"] = [{"tower": t, "batch": b, "setting": s, "items/s": round(v, 1)} for (t, b, s), v in peer.items()]
            with_peer(run["throughput"], peer or {})
            print(table(run["throughput"], ["what", "batch", "items/s", "unit", "vs torch tf32", "vs torch bf16"]))
            result["runs"][compute] = run
            del model
    result["seconds"] = round(time.perf_counter() - started, 1)
    parity_ok = all(r["ok"] for run in result["runs"].values() for r in run.get("parity", []))
    result["status"] = "ok" if parity_ok else "parity FAILED"
    print(f"\n{result['status']} in {result['seconds']} s; wrote {save('gpu_check', result)}")
    return 0 if parity_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
