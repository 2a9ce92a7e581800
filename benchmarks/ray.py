"""Ray Data against one in-process Model with the same total threads (docs/scale.md).

    python benchmarks/ray.py [--preset small] [--texts 1000] [--images 150] [--actors 1,2] [--threads 2]

For texts and images (JPEG bytes, 160-320 px): rows/s of one in-process ``Model`` with
``--threads`` threads (the best of one call over all rows and calls of ``--batch`` rows),
and of ``uform.ray.encode_dataset`` with 1 and 2 actors sharing the same threads
(``--threads // actors`` each), on a local ``ray.init(num_cpus=threads)``. A Ray rate is
marginal: ``(rows(2N) - rows(N)) / (t(2N) - t(N))`` over pipelines of N and 2N rows, so the
fixed cost of a pipeline (actors started, model loaded in each, scheduling) is left out and
reported on its own, as is ``ray.init``. Each Ray result is compared with the in-process one
bit for bit (``wrong_rows``). Ray's files and auth token go to a temporary folder. Writes
benchmarks/results/ray.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# this file is named ray.py: its folder leaves sys.path so that `import ray` finds Ray, and
# common.py is loaded by its path
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("uform_benchmarks_common", HERE / "common.py")
assert _spec is not None and _spec.loader is not None
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)
save, table = common.save, common.table

WORDS = "the a cat dog sat on mat market stock price rose fell sharply quietly over under river city night morning bright".split()


def texts(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, rng.integers(6, 40))) for _ in range(n)]


def images(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        h, w = (int(x) for x in rng.integers(160, 320, 2))
        y, x = np.mgrid[0:h, 0:w]
        rgb = np.stack([128 + 100 * np.sin(x / (7 + i % 5)), 128 + 100 * np.cos(y / 9), (x + y + 13 * i) % 256], -1)
        buf = io.BytesIO()
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def in_process(checkpoint: Path, verb: str, items: list[Any], threads: int, batch: int, repeats: int) -> tuple[float, np.ndarray]:
    import uform

    with uform.Executor(threads) as ex, uform.Model.load_ram(checkpoint, executor=ex) as model:
        fn = getattr(model, verb)
        arena = uform.Arena()
        fn(items[:batch], arena)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn(items, arena)
            whole = time.perf_counter() - t
            t = time.perf_counter()
            for i in range(0, len(items), batch):
                fn(items[i : i + batch], arena)
            batched = time.perf_counter() - t
            best = min(best, whole, batched)
        return len(items) / best, np.array(fn(items, arena).embeddings)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--texts", type=int, default=1000, help="N for texts (pipelines of N and 2N rows)")
    parser.add_argument("--images", type=int, default=150, help="N for images")
    parser.add_argument("--actors", default="1,2")
    parser.add_argument("--threads", type=int, default=2, help="total threads, in process and across the actors")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="uray-bench-"))
    token = root / "auth_token"
    token.write_text(secrets.token_hex(32))
    # nothing under the home folder; Ray's session files under root/ray (Ray takes TMPDIR/ray for its temp folder
    # on Linux; ray.init's own temp-dir parameter is underscored, private)
    os.environ.update({"RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0", "TMPDIR": str(root)})
    from uform.core import checkpoint as ckpt
    from uform.core.host import get_host

    checkpoint = root / f"{args.preset}.safetensors"
    config, tensors = ckpt.new(get_host(), args.preset, 0, ["text", "image"])
    ckpt.save(checkpoint, config, tensors)
    data = {"texts": ("text", "text_encode", texts(2 * args.texts), args.texts), "images": ("image", "image_encode", images(2 * args.images), args.images)}

    reference = {}
    rows: list[dict[str, Any]] = []
    for name, (modality, verb, items, n) in data.items():
        rate, reference[name] = in_process(checkpoint, verb, items, args.threads, args.batch, args.repeats)
        rows.append({"data": name, "runtime": f"in-process Model, {args.threads} threads", "rows/s": round(rate, 1), "vs in-process": "1.00x"})

    import ray

    from uform.ray import encode_dataset

    t = time.perf_counter()
    ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        for name, (modality, _verb, items, n) in data.items():
            base = next(r["rows/s"] for r in rows if r["data"] == name)
            for actors in (int(a) for a in args.actors.split(",")):
                threads = max(1, args.threads // actors)
                best: dict[int, float] = {}
                wrong = 0
                for size in (n, 2 * n):
                    ds = ray.data.from_items([{"id": i, "item": x} for i, x in enumerate(items[:size])])
                    for _ in range(args.repeats):
                        t = time.perf_counter()
                        out = encode_dataset(ds, "item", modality, str(checkpoint), actors=actors, threads_per_actor=threads, batch_size=args.batch).materialize()
                        took = time.perf_counter() - t
                        best[size] = min(best.get(size, float("inf")), took)
                        got = {r["id"]: r["embedding"] for r in out.iter_rows()}
                        wrong += sum(not np.array_equal(got[i], reference[name][i]) for i in range(size))
                rate = n / (best[2 * n] - best[n])
                fixed = best[n] - n / rate
                rows.append({
                    "data": name, "runtime": f"Ray, {actors} actor(s) x {threads} thread(s)", "rows/s": round(rate, 1),
                    "vs in-process": f"{rate / base:.2f}x", "pipeline fixed s": round(fixed, 2),
                    f"wall s ({n} / {2 * n} rows)": f"{best[n]:.2f} / {best[2 * n]:.2f}", "wrong_rows": wrong,
                })  # fmt: skip
    finally:
        t = time.perf_counter()
        ray.shutdown()
        shutdown_s = time.perf_counter() - t
        shutil.rmtree(root, ignore_errors=True)
    print(f"ray.init {init_s:.2f} s, ray.shutdown {shutdown_s:.2f} s, ray {ray.__version__}, preset {args.preset}")
    print(table(rows, ["data", "runtime", "rows/s", "vs in-process", "pipeline fixed s", "wrong_rows"]))
    path = save("ray", {
        "preset": args.preset, "threads": args.threads, "batch": args.batch, "cpu_cores": os.cpu_count(), "ray": ray.__version__,
        "ray_init_s": round(init_s, 2), "ray_shutdown_s": round(shutdown_s, 2), "runs": rows,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
