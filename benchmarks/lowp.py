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
- ``torch fp32`` and ``torch bf16 autocast``: the PyTorch reference, eager;
- ``openvino bf16`` and ``openvino f32``: OpenVINO running the tower as ``uform export`` writes
  it (float32 ONNX), with its inference precision hint at bf16 (what it picks by itself on CPUs
  with AVX-512 BF16 or AMX) or f32, in a process and an environment of its own
  (``openvino_peer.py``: ``benchmarks/.openvino-venv``, made the first time from PyPI).

- ``torch fp32 [avx2]``: the same, with PyTorch's AVX-512 paths switched off in its process
  (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``, ``MKL_ENABLE_INSTRUCTIONS=AVX2``;
  the capability it ran is printed): on a machine above x86-64-v3, the fair float32 peer of
  the pinned AVX2 kernels, whose own float32 path (ONNX Runtime's MLAS) still uses AVX-512.

Where the CPU has CPUID faulting, ``python benchmarks/cpu_view.py x86-64-v3
benchmarks/lowp.py ...`` runs all of it as on an AVX2-only machine instead: every library of
every process sees x86-64-v3, MLAS included, so the plain runs are the AVX2 runs and the
float32 path is the AVX2 peer itself (the view is printed and kept in the result file).

As the ``turns`` part, batch 1 again with every uform run of a tower loaded in one process and
called in turns on the same item, at least 15 turns (``vs f32 @1``: the median over turns of
the float32 path's time over the run's, with its quartiles): a batch-1 call takes 0.05-0.5 s on
2 cores, so the best of calls filling ``--seconds`` sees only a few of them, and runs timed
minutes apart drift; read batch 1 here.

For text towers, short queries too — ``text_encode`` median latency of a 12-byte text alone,
of 8 of them in one call, and of a 52-byte text — the texts a search sends — and, as the
``queries`` part, the same again with every uform run loaded in one process and called in
turns (ratios that see the same machine, where runs minutes apart drift). Then the kernels
alone, each as the towers run it (one of the library's ops in an ONNX Runtime session): the
four products of a base block (qkv, out, fc1, fc2; k = 768, 3072) at m = 16, 87 and 5,568 rows (a short query, one 86-byte text, 64 of them; ``--kernel-rows``), BF16 and E4M3 weights, for
every variant this CPU runs (``amx-model``, the scalar model of the tiles, excepted): GFLOP/s
and the share of the variant's peak as measured here (``OpLibrary.fma_peak``: 12
register-only FMA chains a thread for AVX2's variants, 4 TDPBF16PS chains for ``amx``, in the
same run); beside them their peer, PyTorch's own BF16 ``linear`` (oneDNN: AMX tiles where the
CPU has them) on the same products and rows, its share of the tile peak. And
``profile``: where each tower's time goes at batch 64 with BF16 weights, op by op, and its
products' rate in the tower against the same shapes alone (``tower_profile.py``). And
``full-load``: the full base checkpoint (every tower, 823 MiB), load over read. Named
only: ``huge-pages`` (each e4m3-backend run loaded twice in one process, its packed weights in
4 KiB pages and in huge pages) and ``epilogues`` (loaded twice, GELU and residual adds as ONNX
Runtime's nodes and inside the products), ``handoff`` (fc1's output to fc2 as float32 and
handed over as BF16), ``streaming`` (the products' outputs kept in the caches, and past them
from 4 MiB as the ``amx`` kernels write them) and ``qkv`` (each block's qkv projection and
attention as two ops, and as one op a chunk of items at a time; these two run by default where
the ``amx`` kernels run), each pair called in turns on the short queries, one 86-byte text (and,
for all but ``huge-pages``, 64 of them): the median ratio of each turn's times. Last,
the AVX2 goals and, where OpenVINO ran, the AMX goals (OpenVINO, PyTorch and the float32 path
as peers), each read from the rows that measure it fairly (``lowp_goals.py``), met or not.

Each runs in a process of its own: resident memory after load (growth over the process
before it), and load time (the median of 3 loads) over the time to read the file (warm in
the page cache, the best of 3; for ``full-load`` also in the load's own process, the file
read into fresh memory before each load, the median of 3: "load/read in turns", both sides
writing as much new memory in the same state); what the
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
from common import cpu_view, describe_view, latency, rate, save, table  # noqa: E402
from lowp_goals import amx_goals, goals  # noqa: E402
from tower_inputs import TEXT_BYTES, load, pictures, texts  # noqa: E402

RUNS = ["uform f32", "uform bf16", "uform e4m3", "uform e4m3 dql", "ort int8 nbits", "torch fp32", "torch bf16 autocast", "openvino bf16", "openvino f32"]
OPENVINO = "openvino bf16"  # the peer of the AMX goals
PINNED = ["uform bf16 [x86-64-v3]", "uform e4m3 [x86-64-v3]"]  # added where the machine's best class is above v3
AVX2_PEER = "torch fp32 [avx2]"  # likewise: PyTorch with its AVX-512 paths off, the pinned kernels' fair peer
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
QUERIES = {"12 B": [12], "8 x 12 B": [12] * 8, "52 B": [52]}  # short queries: bytes of each text of one call
KERNEL_ROWS = (16, 87, 5568)
PARTS = "towers,turns,queries,kernels,profile,full-load"  # the default parts
BLOCK = {"qkv": (2304, 768), "out": (768, 768), "fc1": (3072, 768), "fc2": (768, 3072)}  # [n, k] of a base block
LOADS = 3  # loads timed per run (the median is reported)
BATCHES = (1, 64)
TURNS = 15  # turns at least, for the batch-1 rows called in turns


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
    from uform.plugins.sessions.replicas import ort_values, session_options

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

    import uform

    if run.startswith("torch"):  # only PyTorch's runs import it (2-3 s a process; a uform user has no torch)
        import torch

        torch.set_num_threads(uform.core.executor.available_cores())
    items = {1: 8, 64: 64} if tower == "text" else {1: 4, 64: 64}
    inputs: list[Any] = []
    if tower == "text":
        inputs = texts(64)
    elif tower != "all":
        inputs = list(pictures(path, 64))
    result: dict[str, Any] = {}
    if not run.startswith("torch"):  # what the first load of a process does once: find plugins, open the library
        from uform.core.host import get_host

        t = time.perf_counter()
        for backend in get_host().backends.values():
            backend.probe()
        result["first_in_process_s"] = time.perf_counter() - t
    reads = []  # the full checkpoint: the file read into fresh memory before each load, as a load writes into it
    if tower == "all":
        path.read_bytes()  # the page cache, as the loads find it
        t = time.perf_counter()
        path.read_bytes()
        reads.append(time.perf_counter() - t)
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

        result["held"] = "f32 weights" + (", bf16 products" if autocast else "") + f" (ATen {torch.backends.cpu.get_cpu_capability()})"
    else:
        from uform.core.host import get_host

        if run == "ort int8 nbits":
            get_host().add(nbits_backend(), "lowp-int8-nbits")
        model = load(run, path)
        loaded = time.perf_counter() - started
        arena = uform.Arena()
        encode = model.text_encode if tower == "text" else model.image_encode_pixels

        def call(batch: list[Any]) -> None:
            encode(batch, arena)

        result["held"] = f"{model.describe().quantization} weights, {model.compute} [{model.backend}]"
    result["rss_mib"] = (rss_anon() - before) / 2**20
    loads = [loaded]  # a load's time varies with how fast fresh memory comes (this VM: 0.1-0.45 s for one file): the median of 3
    for _ in range(LOADS - 1):
        if reads:
            t = time.perf_counter()
            path.read_bytes()
            reads.append(time.perf_counter() - t)
        if run.startswith("torch"):
            t = time.perf_counter()
            ReferenceModel.from_checkpoint(path)
        else:
            t = time.perf_counter()
            load(run, path).close()
        loads.append(time.perf_counter() - t)
    result["load_s"] = float(np.median(loads))
    result["loads_s"] = loads
    if reads:
        result["read_s"], result["reads_s"] = float(np.median(reads)), reads
    for batch in BATCHES if tower != "all" else ():
        calls = [inputs[i : i + batch] for i in range(0, items[batch], batch)]
        result[f"items/s @{batch}"] = rate(lambda calls=calls: [call(c) for c in calls], items[batch], seconds)  # type: ignore[misc]
    if tower == "text":
        for name, lengths in QUERIES.items():
            query = [line[:n] for line, n in zip(texts(len(lengths)), lengths)]
            result[f"{name} ms"] = 1e3 * latency(lambda query=query: call(query), seconds)
    return result


def kernels(seconds: float, ms: tuple[int, ...] = KERNEL_ROWS) -> list[dict[str, Any]]:
    """GFLOP/s of a base block's four products through each variant this CPU runs, each as
    the towers run it (one ``ai.uform`` node in an ONNX Runtime session, its packed weights
    fed with every run, on the session's intra-op pool), and the share of the class's FMA
    peak measured in the same run (where the variant has a probe)."""
    import ml_dtypes

    from uform.core.executor import available_cores
    from uform.plugins.oplib.library import library

    lib, threads = library(), available_cores()
    rng = np.random.default_rng(0)
    weights = {name: (rng.standard_normal(shape) * 0.05).astype(ml_dtypes.bfloat16) for name, shape in BLOCK.items()}

    rows, peaks = [], {}
    for variant in sorted(lib.runnable - {"amx-model"}):  # the model of the tiles is for tests: minutes a product here
        peak = peaks[variant] = lib.fma_peak(variant, threads)
        for e4m3 in (False, True):
            runs = []
            for name, w in weights.items():
                n = w.shape[0]
                packed, scale = lib.pack(variant, w, e4m3, threads)
                feeds = {"w": packed} | ({"scale": scale} if scale is not None else {})
                runs.append((lib.product_session(variant, e4m3, n, w.shape[1], packed.size, threads), feeds, *w.shape))
            for m in ms:
                flops, spent = 0.0, 0.0
                for sess, feeds, n, k in runs:
                    x = rng.standard_normal((m, k)).astype(np.float32)
                    calls = rate(lambda: sess.run(None, feeds | {"x": x}), 1, seconds / 8)  # noqa: B023
                    flops, spent = flops + 2.0 * m * n * k, spent + 1 / calls
                gflops = flops / spent / 1e9
                rows.append({
                    "variant": variant, "weights": "e4m3" if e4m3 else "bf16", "m": m, "GFLOP/s": f"{gflops:.1f}",
                    "of peak": f"{100 * gflops * 1e9 / peak:.0f} %" if peak else "no probe",
                    "peak GFLOP/s": f"{peak / 1e9:.0f}" if peak else "",
                })  # fmt: skip
    return rows + torch_kernels(weights, threads, peaks.get("amx"), seconds, ms)  # the share of the same peak as amx's rows


def torch_kernels(weights: dict[str, Any], threads: int, peak: float | None, seconds: float, ms: tuple[int, ...] = KERNEL_ROWS) -> list[dict[str, Any]]:
    """The kernels' peer: PyTorch's own BF16 product (``torch.nn.functional.linear`` over BF16
    activations and weights: oneDNN, on AMX tiles where the CPU has them) on the same four
    products and rows, ``threads`` threads, the activations already BF16 (the kernels' times
    include rounding them); the share of the tile peak where the tiles run."""
    try:
        import torch
    except ImportError:
        return []
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    ws = {name: torch.from_numpy(w.view(np.uint16).astype(np.int16)).view(torch.bfloat16) for name, w in weights.items()}
    rows = []
    with torch.inference_mode():
        for m in ms:
            flops, spent = 0.0, 0.0
            for w in ws.values():
                n, k = w.shape
                x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
                calls = rate(lambda: torch.nn.functional.linear(x, w), 1, seconds / 8)  # noqa: B023
                flops, spent = flops + 2.0 * m * n * k, spent + 1 / calls
            gflops = flops / spent / 1e9
            rows.append({
                "variant": f"torch {torch.__version__.split('+')[0]} bf16 linear", "weights": "bf16", "m": m, "GFLOP/s": f"{gflops:.1f}",
                "of peak": f"{100 * gflops * 1e9 / peak:.0f} %" if peak else "no probe", "peak GFLOP/s": f"{peak / 1e9:.0f}" if peak else "",
            })  # fmt: skip
    return rows


def touch_fresh(nbytes: int) -> float:
    """Seconds to write ``nbytes`` of memory this process never had (then freed): how fresh
    memory comes here, printed beside the loads. A VM may back its guest's memory only as it
    is first touched and take freed memory back: on the Zen 1 VM, 823 MiB of never-used memory took
    1.3-1.4 s and of memory just freed 0.12-0.14 s (docs/notes/benchmarks-history.md), and a load writes that much."""
    t = time.perf_counter()
    block = np.ones(nbytes, np.uint8)
    took = time.perf_counter() - t
    del block
    return took


def read_time(path: Path) -> float:
    path.read_bytes()  # warm the page cache
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        path.read_bytes()
        best = min(best, time.perf_counter() - t)
    return best


def measure(run: str, path: Path, tower: str, seconds: float) -> dict[str, Any] | None:
    """One run in a process of its own (with its environment: the fallback's blocked plugin,
    PyTorch's AVX-512 paths off); None, and its stderr printed, when it failed."""
    if run.startswith("openvino"):
        from openvino_peer import measure as openvino

        return openvino(run, path, tower, seconds)
    env = dict(os.environ)
    if run == "uform e4m3 dql":
        env["UFORM_BLOCK_PLUGINS"] = ",".join(filter(None, [env.get("UFORM_BLOCK_PLUGINS"), "e4m3"]))
    if run == AVX2_PEER:
        env.update(AVX2_ONLY)
    done = subprocess.run(
        [sys.executable, __file__, "--seconds", str(seconds), "--worker", run, str(path), tower],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        print(f"{tower} {run}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--towers", default="text:small,text:base,image:base")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--parts", default=PARTS, help="which of towers, turns, queries, kernels, profile, full-load, huge-pages, epilogues, handoff, streaming, qkv to run (the last five only when named; streaming and qkv also by default where the amx kernels run)")
    parser.add_argument("--kernel-rows", default=",".join(map(str, KERNEL_ROWS)), help="the kernels part's rows (m), comma-separated")
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
    from uform.plugins.cpu import machine_classes

    try:
        variant = e4m3.describe_here()
    except Exception as exc:  # noqa: BLE001 - printed, the run goes on
        variant = f"none ({exc})"
    probe = get_host().backends["e4m3"].probe() if "e4m3" in get_host().backends else "not installed"
    classes = machine_classes()
    print(f"op library: {'available' if probe is None else probe}; kernels: {variant}")
    print(f"cpu class: {classes[-1].value}; threads: {uform.core.executor.available_cores()}")
    print(describe_view(cpu_view()))
    parts = set(args.parts.split(","))
    if args.parts == PARTS and "(amx kernels)" in variant:
        parts |= {"streaming", "qkv"}  # whether the tiles' outputs past the caches, and qkv in chunks, pay inside the towers
    results: dict[str, Any] = {"variant": variant, "library": probe or "available", "cpu_class": classes[-1].value, "cpu_view": cpu_view(), "runs": []}
    runs = args.runs.split(",")
    above_v3 = uform.CPUClass.X86_64_V3 in classes[:-1]
    if args.runs == ",".join(RUNS) and above_v3:
        runs[3:3] = PINNED
        runs.append(AVX2_PEER)
    rows: list[dict[str, Any]] = []
    queries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        turns: list[dict[str, Any]] = []
        for spec in args.towers.split(",") if parts & {"towers", "turns"} else ():
            tower, preset = spec.split(":")
            path = Path(tmp) / f"{tower}-{preset}.safetensors"
            config, tensors = checkpoint.new(get_host(), preset, 0, [tower])
            checkpoint.save(path, config, tensors)
            del tensors
            if "turns" in parts:
                turns += [{"tower": spec} | row for row in interleaved_towers(path, tower, runs, args.seconds)]
            if "towers" not in parts:
                continue
            file_read = read_time(path)
            measured = {run: m for run in runs if (m := measure(run, path, tower, args.seconds)) is not None}
            peer, f32, avx2, ov = (measured.get(r, {}) for r in ("torch bf16 autocast", "uform f32", AVX2_PEER, OPENVINO))
            for run, m in measured.items():
                row = {
                    "tower": spec, "run": run, "RSS MiB": f"{m['rss_mib']:.0f}",
                    "RSS/file": f"{m['rss_mib'] * 2**20 / path.stat().st_size:.2f}",
                    "load/read": f"{m['load_s'] / file_read:.1f}",
                }  # fmt: skip
                for batch in BATCHES:
                    key = f"items/s @{batch}"
                    row[key] = f"{m[key]:.2f}"
                    row[f"vs torch bf16 @{batch}"] = ratio(m[key], peer.get(key))
                    row[f"vs f32 @{batch}"] = ratio(m[key], f32.get(key))
                    row[f"vs torch avx2 @{batch}"] = ratio(m[key], avx2.get(key))
                    row[f"vs openvino bf16 @{batch}"] = ratio(m[key], ov.get(key))
                rows.append(row)
                results["runs"].append(row | {"held": m["held"], "file_bytes": path.stat().st_size, "read_s": file_read, **m})
                if tower == "text":
                    query = {"tower": spec, "run": run}
                    for name in QUERIES:
                        key = f"{name} ms"
                        query[key] = f"{m[key]:.1f}"
                        query[f"{name} vs f32"] = ratio(f32.get(key), m[key])  # speed: the f32 path's time over this run's
                        query[f"{name} vs torch avx2"] = ratio(avx2.get(key), m[key])
                        query[f"{name} vs openvino bf16"] = ratio(ov.get(key), m[key])
                    queries.append(query)
        if rows:
            columns = ["tower", "run", "items/s @1", "vs f32 @1", "vs torch bf16 @1", "items/s @64", "vs f32 @64", "vs torch bf16 @64"]
            columns += ["vs torch avx2 @1", "vs torch avx2 @64"] if above_v3 else []
            columns += ["vs openvino bf16 @1", "vs openvino bf16 @64"] if OPENVINO in runs else []
            print(table(rows, columns + ["RSS MiB", "RSS/file", "load/read"]))
            for r in results["runs"]:
                print(f"  {r['tower']} {r['run']}: {r['held']}")
        if turns:
            print("\nbatch 1, the uform runs of each tower in one process called in turns: median items/s, and the median of each turn's f32 time over this run's")
            print(table(turns, list(turns[0])))
            results["turns"] = turns
        if queries:
            print("\nshort queries: text_encode median ms (vs: the peer's time over this run's)")
            print(table(queries, list(queries[0])))
            results["queries"] = queries
        if "queries" in parts:
            spec, path = query_tower(args.towers, Path(tmp))
            results["query_tower"], results["queries_interleaved"] = spec, interleaved_queries(path, runs, args.seconds)
            print(f"\nshort queries, {spec}, the uform runs in one process called in turns: text_encode median ms")
            print(table(results["queries_interleaved"], list(results["queries_interleaved"][0])))
        if "kernels" in parts:
            from uform.plugins.oplib.library import OpLibraryError

            try:
                results["kernels"] = kernels(args.seconds, tuple(int(m) for m in args.kernel_rows.split(",")))
                print("\nkernels alone: a base block's four products (qkv, out, fc1, fc2), GFLOP/s")
                print(table(results["kernels"], list(results["kernels"][0])))
            except OpLibraryError as exc:  # the fallback: nothing of the library to time
                results["kernels"], results["kernels_skipped"] = [], str(exc)
                print(f"\nkernels alone: skipped ({exc})")
        pairs = {  # the parts that load each run twice (paired): what differs, and what ms and ratio are
            "huge-pages": (huge_pages, "packed weights in 4 KiB pages (UFORM_HUGE_PAGES=0) and in huge pages", "in 4 KiB pages", "in huge pages"),
            "epilogues": (epilogues, "GELU and residual adds as ONNX Runtime nodes and inside the products", "as nodes", "fused"),
            "handoff": (handoff, "fc1's output to fc2 as float32 and handed over as BF16", "float32", "handed over"),
            "streaming": (streaming, "products' outputs kept in the caches (stream=0) and past them from 4 MiB (amx's tiles)", "kept", "past the caches"),
            "qkv": (qkv, "each block's qkv projection and attention as two ops and as one, a chunk of items at a time", "two ops", "one"),
        }  # fmt: skip
        for part, (measure_pair, what, before, after) in pairs.items():
            if part not in parts:
                continue
            spec, path = query_tower(args.towers, Path(tmp))
            key = part.replace("-", "_")
            results[key] = measure_pair(path, [r for r in runs if r != "uform f32"], args.seconds)
            print(f"\n{part}, {spec}: each run loaded twice in one process, {what}, called in turns")
            print(f"(ms: {before}; ratio: the median over turns of the time {after} over it, quartiles)")
            print(table(results[key], list(results[key][0])))
        if "profile" in parts:  # where the towers' time goes at batch 64, BF16 (tower_profile.py)
            from tower_profile import profile, report

            results["profile"] = [profile(spec, "uform bf16", Path(tmp), 64, 2, args.seconds / 4) for spec in args.towers.split(",")]
            print("\nwhere the towers' time goes (ONNX Runtime's profiler), and their products in the tower against alone:")
            for result in results["profile"]:
                print("\n" + report(result))
        if "full-load" in parts:
            results["full_load"] = full_load(Path(tmp), runs)
            print("\nthe full base checkpoint (every tower): load over read")
            print(table(results["full_load"], list(results["full_load"][0])))
    pinned = above_v3 and PINNED[0] in runs
    results["goals"] = goals(results, pinned, v3_variant())
    where = "the AVX2 kernels pinned, against a float32 path that uses AVX-512" if pinned else f"the {classes[-1].value} runs"
    print(f"\nthe AVX2 goals, read from this run ({where}; they are set for AVX2-only machines):")
    print(table(results["goals"], ["goal", "measured", "met"]))
    if OPENVINO in runs:
        results["amx_goals"] = amx_goals(results)
        print(f"\nthe AMX goals, read from this run ({classes[-1].value}, {variant}; they are set for x86-64-amx):")
        print(table(results["amx_goals"], ["goal", "measured", "met"]))
    print(f"wrote {save('lowp', results)}")


def v3_variant() -> str | None:
    """The kernels x86-64-v3 runs on this machine (None without the op library)."""
    from uform import CPUClass
    from uform.plugins import e4m3

    try:
        return e4m3.variant_of(CPUClass.X86_64_V3)
    except Exception:  # noqa: BLE001 - no op library: the kernel goals are "not run"
        return None


def query_tower(towers: str, tmp: Path) -> tuple[str, Path]:
    """A search's query tower among ``towers`` (text:base when asked for or when no text tower
    is, else the first text tower asked for), written once into ``tmp``: its spec and path."""
    from uform.core import checkpoint
    from uform.core.host import get_host

    asked = [t for t in towers.split(",") if t.startswith("text:")]
    spec = "text:base" if "text:base" in asked or not asked else asked[0]
    path = tmp / f"queries-{spec.replace(':', '-')}.safetensors"
    if not path.exists():
        config, tensors = checkpoint.new(get_host(), spec.split(":")[1], 0, ["text"])
        checkpoint.save(path, config, tensors)
    return spec, path


def interleaved_towers(path: Path, tower: str, runs: list[str], seconds: float) -> list[dict[str, Any]]:
    """Batch 1 again, every uform run of ``runs`` loaded in this one process and called in
    turns: a turn calls each run once on the same item (the runs' order rotating from turn to
    turn), for at least ``TURNS`` turns and ``2 × seconds`` a run. Each run's items/s is the
    inverse of its median call, and ``vs f32`` the median over turns of the float32 path's
    time over this run's in the same turn. A tower's batch-1 call is 0.05-0.5 s on 2 cores, so
    the best of runs filling ``seconds`` (the ``towers`` part) sees only a few calls, minutes
    apart from the peer's: these ratios are the ones to read at batch 1."""
    import uform

    models = {run: load(run, path) for run in runs if run.startswith("uform") and "dql" not in run}
    if tower == "text":
        items: list[Any] = [[line] for line in texts(8)]
        encode = {run: model.text_encode for run, model in models.items()}
    else:
        items = [p[None] for p in pictures(path, 4)]
        encode = {run: model.image_encode_pixels for run, model in models.items()}
    arena = uform.Arena()
    names = list(models)
    for run in names:  # a warm-up call each: first products, the arena's buffers
        encode[run](items[0], arena)
    times: dict[str, list[float]] = {run: [] for run in names}
    start, turn = time.perf_counter(), 0
    while turn < TURNS or time.perf_counter() - start < 2 * seconds * len(names):
        item = items[turn % len(items)]
        for run in names[turn % len(names) :] + names[: turn % len(names)]:
            t = time.perf_counter()
            encode[run](item, arena)
            times[run].append(time.perf_counter() - t)
        turn += 1
    for model in models.values():
        model.close()
    f32 = np.array(times["uform f32"]) if "uform f32" in times else None
    rows: list[dict[str, Any]] = []
    for run, took in times.items():
        row = {"run": run, "turns": turn, "items/s @1": f"{1 / np.median(took):.2f}"}
        if f32 is not None:  # each turn's float32 time over this run's
            ratios = f32 / np.array(took)
            row |= {"vs f32 @1": f"{np.median(ratios):.2f}x", "spread": f"{np.percentile(ratios, 25):.2f}-{np.percentile(ratios, 75):.2f}"}
        rows.append(row)
    return rows


def interleaved_queries(path: Path, runs: list[str], seconds: float) -> list[dict[str, Any]]:
    """The short queries again, every uform run of ``runs`` loaded in this one process and
    called in turns (a call of each, then again), median latency of each: on a shared
    machine the ratios of runs timed minutes apart, each in a process of its own, drift with
    whatever else runs; in turns they see the same machine."""
    import uform

    loads = {}
    for run in (r for r in runs if r.startswith("uform") and "dql" not in r):
        loads[run] = load(run, path)
    arena = uform.Arena()
    medians: dict[str, dict[str, float]] = {run: {} for run in loads}
    for name, lengths in QUERIES.items():
        query = [line[:n] for line, n in zip(texts(len(lengths)), lengths)]
        times: dict[str, list[float]] = {run: [] for run in loads}
        for model in loads.values():
            model.text_encode(query, arena)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds * len(loads) or min(map(len, times.values())) < 5:
            for run, model in loads.items():
                t = time.perf_counter()
                model.text_encode(query, arena)
                times[run].append(time.perf_counter() - t)
        for run in loads:
            medians[run][name] = float(np.median(times[run]))
    for model in loads.values():
        model.close()
    f32 = medians.get("uform f32", {})
    rows = []
    for run, by_name in medians.items():
        row: dict[str, Any] = {"run": run}
        for name, took in by_name.items():
            row[f"{name} ms"] = f"{1e3 * took:.1f}"
            row[f"{name} vs f32"] = ratio(f32.get(name), took)
        rows.append(row)
    return rows


def paired(pair: dict[str, Any], inputs: dict[str, tuple[list[bytes], int]], seconds: float) -> dict[str, str]:
    """Two loads of one run, ``pair`` (``{"before": model, "after": model}``), called in
    turns on each of ``inputs`` (name: texts of one call, turns at least): per input, the
    median ms of ``before`` and the median of each turn's time of ``after`` over ``before``'s,
    with quartiles."""
    import uform

    arena = uform.Arena()
    row: dict[str, str] = {}
    for name, (query, least) in inputs.items():
        times: dict[str, list[float]] = {"before": [], "after": []}
        for model in pair.values():
            model.text_encode(query, arena)
        start, turn = time.perf_counter(), 0
        while time.perf_counter() - start < 2 * seconds or turn < least:
            for side in ("before", "after") if turn % 2 == 0 else ("after", "before"):
                t = time.perf_counter()
                pair[side].text_encode(query, arena)
                times[side].append(time.perf_counter() - t)
            turn += 1
        ratios = np.array(times["after"]) / np.array(times["before"])
        row[f"{name} ms"] = f"{1e3 * np.median(times['before']):.2f}"
        row[f"{name} ratio"] = f"{np.median(ratios):.3f} ({np.percentile(ratios, 25):.3f}-{np.percentile(ratios, 75):.3f})"
    return row


def query_inputs() -> dict[str, tuple[list[bytes], int]]:
    """The short queries and one text of ``TEXT_BYTES``, each for ``TURNS`` turns at least."""
    inputs = {name: ([line[:n] for line, n in zip(texts(len(lengths)), lengths)], TURNS) for name, lengths in QUERIES.items()}
    inputs[f"{TEXT_BYTES} B"] = (texts(1), TURNS)
    return inputs


def huge_pages(path: Path, runs: list[str], seconds: float) -> list[dict[str, Any]]:
    """The e4m3 backend's runs of ``runs``, each loaded twice in this process (its packed
    weights in 4 KiB pages, ``UFORM_HUGE_PAGES=0``, and in huge pages) and called in turns on
    the short queries and one text of ``TEXT_BYTES`` (:func:`paired`): ``ms`` in 4 KiB pages,
    ``ratio`` the time in huge pages over it."""
    rows = []
    for run in (r for r in runs if r.startswith("uform") and "dql" not in r):
        pair = {}
        before = os.environ.get("UFORM_HUGE_PAGES")
        for side, setting in (("before", "0"), ("after", "1")):
            os.environ["UFORM_HUGE_PAGES"] = setting
            pair[side] = load(run, path)
        if before is None:
            del os.environ["UFORM_HUGE_PAGES"]
        else:
            os.environ["UFORM_HUGE_PAGES"] = before
        rows.append({"run": run} | paired(pair, query_inputs(), seconds))
        for model in pair.values():
            model.close()
    return rows


def epilogues(path: Path, runs: list[str], seconds: float) -> list[dict[str, Any]]:
    """GELU and residual adds as ONNX Runtime's own nodes (``e4m3.FUSE_EPILOGUES = False``) and
    inside the products (:func:`switched`)."""
    return switched("FUSE_EPILOGUES", path, runs, seconds)


def handoff(path: Path, runs: list[str], seconds: float) -> list[dict[str, Any]]:
    """Layer norms' and fc1's outputs to the products as float32 (``e4m3.HAND_OVER = False``)
    and handed over as BF16 (:func:`switched`). Where the kernels read x as float32 nothing is
    handed over, and the ratio is 1 but for noise."""
    return switched("HAND_OVER", path, runs, seconds)


def qkv(path: Path, runs: list[str], seconds: float) -> list[dict[str, Any]]:
    """Each block's qkv projection and attention as two ops (``e4m3.FUSE_QKV = False``: the
    float32 qkv written to memory and read back) and as one (``QKVAttention...``: a chunk of
    items at a time, its qkv through the caches), :func:`switched`. Zen 5, 64 texts: 0.97-1.0x."""
    return switched("FUSE_QKV", path, runs, seconds)


def streaming(path: Path, runs: list[str], seconds: float) -> list[dict[str, Any]]:
    """Products' outputs kept in the caches whatever their size (``e4m3.STREAM_Y = False``, each
    product's ``stream`` attribute 0) and written past them from 4 MiB where the kernels do so
    (amx's tiles: 1.2x the product alone at 5,568 rows; the op that reads y next may pay it back),
    :func:`switched`. Elsewhere nothing streams, and the ratio is 1 but for noise."""
    return switched("STREAM_Y", path, runs, seconds)


def switched(flag: str, path: Path, runs: list[str], seconds: float) -> list[dict[str, Any]]:
    """The e4m3 backend's runs of ``runs``, each loaded twice in this process, with the e4m3
    module's ``flag`` off and on, and called in turns (:func:`paired`) on the short queries,
    one text of ``TEXT_BYTES`` and 64 of them: ``ms`` off, ``ratio`` the time on over it."""
    from uform.plugins import e4m3

    inputs = query_inputs() | {f"64 x {TEXT_BYTES} B": (texts(64), 5)}  # (epilogues, handoff, streaming, qkv)
    rows = []
    for run in (r for r in runs if r.startswith("uform") and "dql" not in r):
        pair = {}
        try:
            for side, on in (("before", False), ("after", True)):
                setattr(e4m3, flag, on)
                pair[side] = load(run, path)
        finally:
            setattr(e4m3, flag, True)
        rows.append({"run": run} | paired(pair, inputs, seconds))
        for model in pair.values():
            model.close()
    return rows


def full_load(tmp: Path, runs: list[str]) -> list[dict[str, Any]]:
    """Load over read of a base checkpoint holding every tower, for the uform runs."""
    from uform.core import checkpoint
    from uform.core.host import get_host

    path = tmp / "all-base.safetensors"
    config, tensors = checkpoint.new(get_host(), "base", 0)
    checkpoint.save(path, config, tensors)
    del tensors
    size = path.stat().st_size
    touched = [touch_fresh(size) for _ in range(2)]
    print(f"full load: {size / 2**20:.0f} MiB of memory this process never had written in {touched[0]:.2f} s, then {touched[1]:.2f} s "
          "(a VM may back a guest's memory only as it is first touched, and take freed memory back)")  # fmt: skip
    file_read = read_time(path)
    rows = []
    for run in (r for r in runs if r.startswith("uform") and "dql" not in r):
        m = measure(run, path, "all", 0)
        if m is not None:
            rows.append({"run": run, "file MiB": f"{size / 2**20:.0f}", "read s": f"{file_read:.2f}",
                         "load s": f"{m['load_s']:.2f}", "load/read": f"{m['load_s'] / file_read:.2f}",
                         "read in turns s": f"{m['read_s']:.2f}", "load/read in turns": f"{m['load_s'] / m['read_s']:.2f}",
                         "RSS/file": f"{m['rss_mib'] * 2**20 / size:.2f}"})  # fmt: skip
    path.unlink()
    return rows


if __name__ == "__main__":
    main()
