"""Where a tower's time goes, op by op, and its products in the tower against the same products alone.

    python benchmarks/tower_profile.py [--towers text:base,image:base] [--runs "uform bf16,uform e4m3"] [--batch 64] [--calls 3]

For each tower (a checkpoint of that preset holding it alone) and each uform run (as
``lowp.py`` names them), the tower is loaded with ONNX Runtime's profiler on, called once to
warm up and then ``--calls`` times on ``--batch`` items of equal length (texts of 86 bytes,
images of the tower's size), and the profile is read back:

- each op type's time per call (the profile holds the warm-up call too, and times are divided
  by every call made: a first call's extra shows as a small excess), its share of the ops'
  time, and its nodes per call;
- the library's product nodes (``MatMulBF16``, ``MatMulE4M3`` and their ``...Handoff`` kinds;
  not the qkv projections that run inside a ``QKVAttention...`` op): their
  FLOPs (``2 m n k`` from the shapes the profile records) over their time, as GFLOP/s in the
  tower; and the same products alone: each distinct node (op, attributes, input and output
  shapes) replayed in a session of its own with random inputs of the recorded types (x handed
  over as BF16 where the tower hands it, bias, residual, activation, its output handed over
  or not), weighted by how often the tower runs it.

A tower's products well below their rate alone spend the difference on what the tower adds
around them: activations written by one op and read by the next from memory rather than cache,
the pool's wake-ups between ops. Writes benchmarks/results/tower_profile.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import rate, save, table  # noqa: E402
from tower_inputs import load, pictures, texts  # noqa: E402

PRODUCTS = ("MatMulBF16", "MatMulE4M3")  # the library's product ops (and their ...Handoff kinds)


def profiled_run(run: str, path: Path, tower: str, batch: int, calls: int, prefix: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The profile's node events of ``calls`` + 1 calls of ``run`` on ``batch`` items (the first
    a record of the load's kernels), and the product nodes the e4m3 backend built, by name."""
    import uform
    from uform.plugins import cpu, e4m3
    from uform.plugins.sessions import replicas

    built: dict[str, Any] = {}

    def options(*args: Any, **kwargs: Any) -> Any:
        so = replicas.session_options(*args, **kwargs)
        so.enable_profiling, so.profile_file_prefix = True, prefix
        return so

    def lower(*args: Any, **kwargs: Any) -> Any:
        low = saved[2](*args, **kwargs)
        built.update((node.name, node) for node in low.graph.graph.node if node.op_type.startswith(PRODUCTS))
        return low

    saved = e4m3.session_options, cpu.session_options, e4m3.lower
    e4m3.session_options = cpu.session_options = options  # uform's own backends, as they open their sessions
    e4m3.lower = lower
    try:
        model = load(run, path)
    finally:
        e4m3.session_options, cpu.session_options, e4m3.lower = saved
    inputs = texts(batch) if tower == "text" else list(pictures(path, batch))
    encode = model.text_encode if tower == "text" else model.image_encode_pixels
    arena = uform.Arena()
    for _ in range(calls + 1):
        encode(inputs, arena)
    compute = model.compute
    model.close()  # ends the sessions: ONNX Runtime writes their profiles
    events = [e for f in glob.glob(prefix + "*.json") for e in json.loads(Path(f).read_text())]
    return [{"compute": compute}] + [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")], built


def typed_shapes(listed: list[dict[str, list[int]]]) -> list[tuple[str, list[int]]]:
    return [next(iter(item.items())) for item in listed]


def product_shape(event: dict[str, Any]) -> tuple[int, int, int]:
    """(m, n, k) of a product node's event: a ...Handoff writes [m + 16, n]."""
    op, args = event["args"]["op_name"], event["args"]
    out, x = typed_shapes(args["output_type_shape"])[0][1], typed_shapes(args["input_type_shape"])[0][1]
    m = int(np.prod(out[:-1])) - (16 if op.endswith("Handoff") else 0)
    return m, out[-1], x[-1]


def replay(node: Any, event: dict[str, Any], lib: Any, threads: int) -> tuple[Any, dict[str, np.ndarray]]:
    """A session of ``node`` alone, as the tower built it (op, attributes: activation, handed x,
    bias, residual), and feeds of the types and shapes the profile recorded: random values, the
    weights a random matrix packed for its variant."""
    import ml_dtypes
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from uform.plugins.oplib.library import VARIANTS
    from uform.plugins.sessions.replicas import session_options

    types = {"float": (TensorProto.FLOAT, np.float32), "uint16": (TensorProto.UINT16, np.uint16), "uint8": (TensorProto.UINT8, np.uint8)}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    m, n, k = product_shape(event)
    rng = np.random.default_rng(0)
    packed, scale = lib.pack(VARIANTS[attrs["variant"]], (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16), node.op_type.startswith("MatMulE4M3"))
    names = [name for name in node.input if name]
    shapes = typed_shapes(event["args"]["input_type_shape"])
    feeds: dict[str, np.ndarray] = {}
    infos = []
    for i, (name, (kind, dims)) in enumerate(zip(names, shapes)):
        onnx_type, dtype = types[kind]
        if i == 1:
            feeds[name] = packed
        elif i == 2 and scale is not None:
            feeds[name] = scale
        elif dtype == np.uint16:  # x handed over: BF16 bits of finite values
            feeds[name] = rng.standard_normal(dims).astype(ml_dtypes.bfloat16).view(np.uint16)
        else:
            feeds[name] = rng.standard_normal(dims).astype(dtype)
        infos.append(helper.make_tensor_value_info(name, onnx_type, dims))
    kind, dims = typed_shapes(event["args"]["output_type_shape"])[0]
    out = helper.make_tensor_value_info(node.output[0], types[kind][0], dims)
    graph = helper.make_graph([node], "alone", infos, [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.uform", 1)])
    options = session_options(threads)
    options.register_custom_ops_library(str(lib.path))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]), feeds


def alone(products: dict[str, tuple[Any, dict[str, Any], int]], seconds: float) -> float:
    """GFLOP/s of the tower's products each run alone (:func:`replay`), weighted by how often
    the tower runs each (one node of each distinct op, attributes and shapes)."""
    from uform.core.executor import available_cores
    from uform.plugins.oplib.library import library

    lib, threads = library(), available_cores()
    flops = spent = 0.0
    for node, event, count in products.values():
        session, feeds = replay(node, event, lib, threads)
        calls = rate(lambda: session.run(None, feeds), 1, seconds)  # noqa: B023
        m, n, k = product_shape(event)
        flops, spent = flops + count * 2.0 * m * n * k, spent + count / calls
    return flops / spent / 1e9


def summary(events: list[dict[str, Any]], built: dict[str, Any], calls: int, seconds: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The op table of one profiled run, and its products in the tower and alone."""
    compute, nodes = events[0]["compute"], events[1:]
    times, counts = Counter[str](), Counter[str]()
    kinds: dict[str, tuple[Any, dict[str, Any], int]] = {}  # a product's op, attributes and shapes: a node, an event, its count
    flops = product_us = 0.0
    for e in nodes:
        op = e["args"]["op_name"]
        times[op] += e["dur"]
        counts[op] += 1
        node = built.get(e["name"].removesuffix("_kernel_time"))
        if op.startswith(PRODUCTS) and node is not None:
            m, n, k = product_shape(e)
            flops, product_us = flops + 2.0 * m * n * k, product_us + e["dur"]
            attrs = sorted((a.name, str(a)) for a in node.attribute if a.name != "threads")
            key = repr((node.op_type, attrs, e["args"]["input_type_shape"], e["args"]["output_type_shape"]))
            kinds[key] = (node, e, kinds[key][2] + 1 if key in kinds else 1)
    total = sum(times.values())
    rows = [{"op": op, "ms a call": f"{us / 1e3 / (calls + 1):.1f}", "share": f"{100 * us / total:.1f} %", "nodes a call": f"{counts[op] / (calls + 1):g}"}
            for op, us in times.most_common() if us / total >= 0.001]  # fmt: skip
    products: dict[str, Any] = {"compute": compute}
    if kinds:
        products |= {"in the tower GFLOP/s": flops / product_us / 1e3, "alone GFLOP/s": alone(kinds, seconds)}
        products["tower / alone"] = products["in the tower GFLOP/s"] / products["alone GFLOP/s"]
    return rows, products


def checkpoint_of(spec: str, tmp: Path) -> Path:
    """A checkpoint of tower:preset ``spec`` holding that tower alone, in ``tmp`` (made once)."""
    from uform.core import checkpoint
    from uform.core.host import get_host

    tower, preset = spec.split(":")
    path = tmp / f"{tower}-{preset}.safetensors"
    if not path.exists():
        config, tensors = checkpoint.new(get_host(), preset, 0, [tower])
        checkpoint.save(path, config, tensors)
    return path


def profile(spec: str, run: str, tmp: Path, batch: int, calls: int, seconds: float) -> dict[str, Any]:
    """One tower's profile under one run: its op table, and its products in the tower and alone."""
    tower = spec.split(":")[0]
    events, built = profiled_run(run, checkpoint_of(spec, tmp), tower, batch, calls, str(tmp / f"profile-{spec.replace(':', '-')}-{run.replace(' ', '-')}-"))
    rows, products = summary(events, built, calls, seconds)
    return {"tower": spec, "run": run, "batch": batch, "ops": rows, **products}


def report(result: dict[str, Any]) -> str:
    """What a reader sees of :func:`profile`'s result."""
    lines = [f"{result['tower']}, {result['run']}, batch {result['batch']}: {result['compute']}", table(result["ops"], list(result["ops"][0]))]
    if "alone GFLOP/s" in result:
        lines.append("products: {:.0f} GFLOP/s in the tower, {:.0f} alone (the same shapes): {:.2f}x".format(
            result["in the tower GFLOP/s"], result["alone GFLOP/s"], result["tower / alone"]))  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--towers", default="text:base,image:base")
    parser.add_argument("--runs", default="uform bf16,uform e4m3")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="time for each product shape alone")
    args = parser.parse_args()

    from uform.plugins.cpu import machine_classes

    results: dict[str, Any] = {"cpu_class": machine_classes()[-1].value, "calls": args.calls, "runs": []}
    print(f"cpu class: {results['cpu_class']}; {args.calls} calls after one to warm up")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.towers.split(","):
            for run in args.runs.split(","):
                results["runs"].append(profile(spec, run, Path(tmp), args.batch, args.calls, args.seconds))
                print("\n" + report(results["runs"][-1]))
    print(f"wrote {save('tower_profile', results)}")


if __name__ == "__main__":
    main()
