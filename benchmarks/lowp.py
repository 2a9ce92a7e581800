"""Weights in 32, 16 and 8 bits: towers' throughput, resident memory and load time, in one run.

    python benchmarks/lowp.py [--towers text:small,text:base,image:base] [--seconds 2]

For each tower (a checkpoint of that preset holding it alone), each way of running it, at
batch 1 and batch 64, with every input of equal length (texts of 86 bytes, images of the
tower's size) so that padding plays no part:

- ``uform f32``: the cpu backend's float32 path (``quantization=Scalar.F32``);
- ``uform bf16`` and ``uform e4m3``: the e4m3 backend, uform's op library (the kernel
  variant this machine runs is printed); with ``[x86-64-v3]`` (or another class) after the
  name, pinned to that class's kernels — on a machine with AVX-512 the AVX2 kernels run too,
  against an ONNX Runtime that still uses AVX-512 for its float32 path;
- ``uform e4m3 dql``: E4M3 through standard DequantizeLinear graphs (the cpu backend, with the
  e4m3 plugin blocked: what serves where the library is missing);
- ``ort int8 nbits``: ONNX Runtime's ``MatMulNBits`` with 8-bit blocks of 32 (a backend plugin
  this script registers, exactly as a third party would);
- ``torch fp32`` and ``torch bf16 autocast``: the PyTorch reference, eager.

Each runs in a process of its own: resident memory after load (growth over the process
before it), and load time (the median of 3 loads) over the time to read the file (warm in
the page cache, the best of 3); what the
first load of a process also does once (discovering plugins, opening the op library) is
timed apart (``first_in_process_s`` in the result file). Items/s
are the best of runs filling ``--seconds``; ``vs torch bf16`` is the ratio to PyTorch BF16
autocast in the same run. Writes benchmarks/results/lowp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import rate, save, table  # noqa: E402

RUNS = ["uform f32", "uform bf16", "uform e4m3", "uform e4m3 dql", "ort int8 nbits", "torch fp32", "torch bf16 autocast"]
PINNED = ["uform bf16 [x86-64-v3]", "uform e4m3 [x86-64-v3]"]  # added where the machine's best class is above v3
TEXT_BYTES = 86
LOADS = 3  # loads timed per run (the median is reported)
BATCHES = (1, 64)


def texts(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    words = "a red circle moves left while two blue squares rest under the bright yellow star".split()
    out = []
    for _ in range(n):
        line = " ".join(rng.choice(words, 40))
        out.append(line[:TEXT_BYTES].ljust(TEXT_BYTES).encode())
    return out


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


# -- ONNX Runtime's MatMulNBits, as a backend plugin ---------------------------------------


def nbits_backend() -> Any:
    """A RAM backend serving ``quantization=Scalar.I8``: every product over a checkpoint
    matrix becomes ``com.microsoft.MatMulNBits`` (8 bits, blocks of 32, int8 compute)."""
    import onnxruntime as ort
    from onnx import helper

    from uform.core.hookspecs import hookimpl
    from uform.core.plugin import Backend, LoadRequest, Placement
    from uform.core.types import Scalar
    from uform.core.weights import matrix_products, with_nodes
    from uform.plugins.sessions import ort_values, session_options

    block = 32

    def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, k = w.shape
        blocks = -(-k // block)
        padded = np.zeros((n, blocks * block), np.float32)
        padded[:, :k] = w.astype(np.float32)
        padded = padded.reshape(n, blocks, block)
        scale = np.abs(padded).max(axis=2) / 127
        scale[scale == 0] = 1
        q = np.clip(np.rint(padded / scale[..., None]), -127, 127) + 128  # zero point 128
        return q.astype(np.uint8), scale.astype(np.float32).reshape(-1)

    def open_ram(request: LoadRequest) -> Placement:
        runners, held = {}, 0
        for name, tower in request.towers.items():
            replacements: dict[int, list[Any]] = {}
            arrays: dict[str, np.ndarray] = {}
            for index, matrix in matrix_products(tower.graph, tower.weights).items():
                node = tower.graph.graph.node[index]
                n, k = tower.weights[matrix].shape
                arrays[f"{matrix}:q"], arrays[f"{matrix}:s"] = quantize(tower.weights[matrix])
                product = [node.output[0] + ":nobias"] if len(node.input) > 2 else list(node.output)
                replacements[index] = [helper.make_node(
                    "MatMulNBits", [node.input[0], f"{matrix}:q", f"{matrix}:s"], product, domain="com.microsoft",
                    K=k, N=n, bits=8, block_size=block, accuracy_level=4,
                )]  # fmt: skip
                if len(node.input) > 2:
                    replacements[index].append(helper.make_node("Add", [product[0], node.input[2]], list(node.output)))
            nodes = [r for i, node in enumerate(tower.graph.graph.node) for r in replacements.get(i, [node])]
            for w, stored in tower.weights.items():
                if f"{w}:q" not in arrays:
                    arrays[w] = stored.astype(np.float32)
            graph = with_nodes(tower.graph, nodes, arrays)
            graph.opset_import.append(helper.make_opsetid("com.microsoft", 1))
            values = ort_values(arrays)
            options = session_options(request.executor.threads)
            options.add_external_initializers(list(values), list(values.values()))
            runners[name] = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
            held += sum(a.nbytes for a in arrays.values())
        return Placement(runners, held, Scalar.I8, compute="int8 products (MatMulNBits, accuracy level 4)")

    class Plugin:
        @hookimpl
        def uform_backends(self) -> Any:
            yield Backend("ort-int8-nbits", "ram", lambda: None, open_ram, priority=100,
                          accepts=lambda r: None if r.quantization is Scalar.I8 else "serves i8 only")  # fmt: skip

    return Plugin()


# -- one run, in its own process -------------------------------------------------------------


def worker(run: str, path: Path, tower: str, seconds: float) -> dict[str, Any]:
    import onnxruntime  # noqa: F401 - imported before the baseline, as uform's load imports it
    import torch

    import uform

    threads = uform.core.executor.available_cores()
    torch.set_num_threads(threads)
    items = {1: 8, 64: 64} if tower == "text" else {1: 4, 64: 64}
    if tower == "text":
        inputs: list[Any] = texts(64)
    else:
        from uform.core.config import ModelConfig
        from uform.core.safetensors import parse

        size = int(ModelConfig.from_metadata(parse(memoryview(path.read_bytes())).metadata).towers["image"]["image_size"])
        inputs = list(np.random.default_rng(0).integers(0, 256, (64, size, size, 3), dtype=np.uint8))
    result: dict[str, Any] = {}
    if not run.startswith("torch"):  # what the first load of a process does once: find plugins, open the library
        from uform.core.host import get_host

        t = time.perf_counter()
        for backend in get_host().backends.values():
            backend.probe()
        result["first_in_process_s"] = time.perf_counter() - t
    before = rss_anon()
    started = time.perf_counter()
    if run.startswith("torch"):
        from uform.exporters.reference import ReferenceModel

        ref = ReferenceModel.from_checkpoint(path).towers[tower]
        loaded = time.perf_counter() - started
        autocast = run == "torch bf16 autocast"

        def call(batch: list[Any]) -> None:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                ref.encode(batch) if tower == "text" else ref(torch.from_numpy(np.stack(batch)))

        result["held"] = "f32 weights" + (", bf16 products" if autocast else "")
    else:
        from uform.core.host import get_host

        if run == "ort int8 nbits":
            get_host().add(nbits_backend(), "lowp-int8-nbits")
        name, _, pin = run.partition(" [")
        quantization = {"uform f32": "f32", "uform bf16": "bf16", "ort int8 nbits": "i8"}.get(name, "e4m3")
        model = uform.Model.load_ram(path, quantization=quantization, cpu_class=uform.CPUClass(pin.rstrip("]")) if pin else None)
        loaded = time.perf_counter() - started
        arena = uform.Arena()
        encode = model.text_encode if tower == "text" else model.image_encode_pixels

        def call(batch: list[Any]) -> None:
            encode(batch, arena)

        result["held"] = f"{model.describe().quantization} weights, {model.compute} [{model.backend}]"
    result["rss_mib"] = (rss_anon() - before) / 2**20
    loads = [loaded]  # a load's time varies with how fast fresh memory comes (this VM: 0.1-0.45 s for one file): the median of 3
    for _ in range(LOADS - 1):
        if run.startswith("torch"):
            t = time.perf_counter()
            ReferenceModel.from_checkpoint(path)
        else:
            t = time.perf_counter()
            uform.Model.load_ram(path, quantization=quantization, cpu_class=uform.CPUClass(pin.rstrip("]")) if pin else None).close()
        loads.append(time.perf_counter() - t)
    result["load_s"] = float(np.median(loads))
    result["loads_s"] = loads
    for batch in BATCHES:
        calls = [inputs[i : i + batch] for i in range(0, items[batch], batch)]
        result[f"items/s @{batch}"] = rate(lambda calls=calls: [call(c) for c in calls], items[batch], seconds)  # type: ignore[misc]
    return result


def read_time(path: Path) -> float:
    path.read_bytes()  # warm the page cache
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        path.read_bytes()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--towers", default="text:small,text:base,image:base")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--worker", nargs=3, metavar=("RUN", "CHECKPOINT", "TOWER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run, path, tower = args.worker
        print(json.dumps(worker(run, Path(path), tower, args.seconds)))
        return

    import uform
    from uform.core import checkpoint
    from uform.core.host import get_host
    from uform.plugins import e4m3

    try:
        variant = e4m3.describe_here()
    except Exception as exc:  # noqa: BLE001 - printed, the run goes on
        variant = f"none ({exc})"
    probe = get_host().backends["e4m3"].probe() if "e4m3" in get_host().backends else "not installed"
    print(f"op library: {'available' if probe is None else probe}; kernels: {variant}")
    print(f"threads: {uform.core.executor.available_cores()}")
    rows: list[dict[str, Any]] = []
    results: dict[str, Any] = {"variant": variant, "library": probe or "available", "runs": []}
    from uform.plugins.cpu import machine_classes

    runs = args.runs.split(",")
    if args.runs == ",".join(RUNS) and uform.CPUClass.X86_64_V3 in machine_classes()[:-1]:
        runs[3:3] = PINNED
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.towers.split(","):
            tower, preset = spec.split(":")
            path = Path(tmp) / f"{tower}-{preset}.safetensors"
            config, tensors = checkpoint.new(get_host(), preset, 0, [tower])
            checkpoint.save(path, config, tensors)
            file_read = read_time(path)
            measured = {}
            for run in runs:
                env = dict(os.environ)
                if run == "uform e4m3 dql":
                    env["UFORM_BLOCK_PLUGINS"] = ",".join(filter(None, [env.get("UFORM_BLOCK_PLUGINS"), "e4m3"]))
                done = subprocess.run(
                    [sys.executable, __file__, "--seconds", str(args.seconds), "--worker", run, str(path), tower],
                    env=env, capture_output=True, text=True, check=False,
                )  # fmt: skip
                if done.returncode != 0:
                    print(f"{spec} {run}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                    continue
                measured[run] = json.loads(done.stdout.strip().splitlines()[-1])
            peer = measured.get("torch bf16 autocast", {})
            for run, m in measured.items():
                row = {
                    "tower": spec, "run": run, "RSS MiB": f"{m['rss_mib']:.0f}",
                    "RSS/file": f"{m['rss_mib'] * 2**20 / path.stat().st_size:.2f}",
                    "load/read": f"{m['load_s'] / file_read:.1f}",
                }  # fmt: skip
                for batch in BATCHES:
                    key = f"items/s @{batch}"
                    row[key] = f"{m[key]:.2f}"
                    row[f"vs torch bf16 @{batch}"] = f"{m[key] / peer[key]:.2f}x" if peer else ""
                rows.append(row)
                results["runs"].append(row | {"held": m["held"], "file_bytes": path.stat().st_size, "read_s": file_read, **m})
    columns = ["tower", "run", "items/s @1", "vs torch bf16 @1", "items/s @64", "vs torch bf16 @64", "RSS MiB", "RSS/file", "load/read"]
    print(table(rows, columns))
    for r in results["runs"]:
        print(f"  {r['tower']} {r['run']}: {r['held']}")
    print(f"wrote {save('lowp', results)}")


if __name__ == "__main__":
    main()
