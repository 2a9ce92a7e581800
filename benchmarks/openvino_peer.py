"""OpenVINO as a peer: the towers ``uform export`` writes, run by OpenVINO in a process and an
environment of its own (never a uform dependency).

    python benchmarks/openvino_peer.py CHECKPOINT TOWER [--precision bf16] [--seconds 2]

``lowp.py`` and ``media.py`` call :func:`measure` for their ``openvino bf16`` and ``openvino f32``
runs. It makes the environment once (``benchmarks/.openvino-venv``: a virtual environment with
``pip install openvino numpy`` from PyPI; ``UFORM_OPENVINO_PYTHON`` names another Python that has
openvino), exports the tower in float32 with ``uform.exporters`` as ``uform export`` does, and runs
this file there as a worker. The worker compiles the ONNX file for the CPU with
``INFERENCE_PRECISION_HINT`` bf16 (what OpenVINO picks by itself on CPUs with AVX-512 BF16 or AMX)
or f32, as many threads as uform's executor takes, one stream, the latency hint, and times what
``lowp.py`` times: items/s at batch 1 and 64 (and ``--batches``), and for text towers the short
queries' median milliseconds, each input of the same length as uform's. Its JSON holds the same
keys as a ``lowp.py`` run's, plus OpenVINO's version and the precision it ran.
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

HERE = Path(__file__).parent
VENV = HERE / ".openvino-venv"
PYTHON = "UFORM_OPENVINO_PYTHON"
QUERIES = {"12 B": [12], "8 x 12 B": [12] * 8, "52 B": [52]}  # as lowp.py's
TEXT_BYTES = 86
EXPORTED: dict[Path, tuple[tempfile.TemporaryDirectory[str], dict[str, Path]]] = {}  # checkpoint -> its towers as `uform export` writes them
WORDS = b"a red circle moves left while two blue squares rest under the bright yellow star "


def python() -> str:
    """The Python of OpenVINO's environment, made the first time (SystemExit with pip's words
    where it cannot be: no network to PyPI, say)."""
    given = os.environ.get(PYTHON)
    if given:
        return given
    exe = VENV / "bin" / "python"
    if not exe.exists() or subprocess.run([str(exe), "-c", "import openvino"], capture_output=True).returncode != 0:
        print(f"making OpenVINO's environment in {VENV} (pip install openvino numpy)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        done = subprocess.run([str(exe), "-m", "pip", "install", "-q", "openvino", "numpy"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"openvino_peer: pip could not install openvino: {done.stderr[-1500:]}")
    return str(exe)


def measure(run: str, checkpoint: Path, tower: str, seconds: float, batches: tuple[int, ...] = (1, 64)) -> dict[str, Any] | None:
    """``run`` (``openvino bf16`` or ``openvino f32``) on ``tower`` of ``checkpoint``, in
    OpenVINO's process: the worker's results, or None with its error printed."""
    from uform.core.executor import available_cores
    from uform.exporters.towers import export_towers

    precision = run.rpartition(" ")[2]
    if checkpoint not in EXPORTED:  # once a checkpoint a process: both precisions and every call read it
        out = tempfile.TemporaryDirectory()
        EXPORTED[checkpoint] = (out, export_towers(checkpoint, Path(out.name), "f32"))
    command = [python(), __file__, "--worker", str(EXPORTED[checkpoint][1][tower]), tower, "--precision", precision, "--seconds", str(seconds),
               "--threads", str(available_cores()), "--batches", ",".join(map(str, batches))]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"{tower} {run}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the worker, in OpenVINO's environment (numpy and openvino; common.py imports no more) --


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


def texts(count: int, length: int) -> dict[str, Any]:
    """What the exported text tower takes for ``count`` texts of ``length`` bytes each."""
    import numpy as np

    line = np.frombuffer((WORDS * (length // len(WORDS) + 1))[:length], np.uint8).astype(np.int64)
    return {"bytes": np.tile(line, (count, 1)), "lengths": np.full(count, length, np.int64)}


def worker(onnx_path: Path, tower: str, precision: str, threads: int, seconds: float, batches: list[int]) -> dict[str, Any]:
    import numpy as np
    import openvino as ov

    sys.path.insert(0, str(HERE))
    from common import latency, rate  # numpy and the standard library only

    spec = json.loads(onnx_path.with_suffix(".json").read_text())
    before = rss_anon()
    started = time.perf_counter()
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(core.read_model(str(onnx_path)), "CPU", config)
    request = compiled.create_infer_request()
    loaded = time.perf_counter() - started
    ran = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # what it runs, not what was asked
    result: dict[str, Any] = {"held": f"OpenVINO {ov.__version__}, {ran} inference precision, {threads} threads", "load_s": loaded}

    def feeds(count: int, length: int = TEXT_BYTES) -> dict[str, Any]:
        if tower == "text":
            return texts(count, length)
        shape = [count if d == "batch" else int(d) for d in spec["inputs"][0]["shape"]]
        return {spec["inputs"][0]["name"]: np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)}

    for batch in batches:
        items = max(batch, 8 if tower == "text" else 4)
        given = feeds(batch)
        result[f"items/s @{batch}"] = rate(lambda given=given, calls=items // batch: [request.infer(given) for _ in range(calls)], items, seconds, runs=1)
    if tower == "text":
        for name, lengths in QUERIES.items():
            given = feeds(len(lengths), lengths[0])
            result[f"{name} ms"] = 1e3 * latency(lambda given=given: request.infer(given), seconds)
    result["rss_mib"] = (rss_anon() - before) / 2**20
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", nargs=2, metavar=("CHECKPOINT_OR_ONNX", "TOWER"))
    parser.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    path, tower = Path(args.target[0]), args.target[1]
    batches = [int(b) for b in args.batches.split(",")]
    if args.worker:
        print(json.dumps(worker(path, tower, args.precision, args.threads or os.cpu_count() or 1, args.seconds, batches)))
        return
    print(json.dumps(measure(f"openvino {args.precision}", path, tower, args.seconds, tuple(batches)), indent=1))


if __name__ == "__main__":
    main()
