"""``uform index`` and ``uform search --index``: the goals of docs/index.md, measured.

    python benchmarks/index.py [--files 10000] [--sizes 10000,100000,1000000] [--queries 50] [--rounds 5] [--workdir DIR]

1. A folder of ``--files`` JPEGs (generated, 640 x 480, quality 90) indexed by the command with
   the default model, as subprocesses: the first indexing, a re-run with nothing changed, a
   re-run after 1 % of the files were rewritten with other pictures; beside them ``uform
   describe`` (the command's start-up with the model loaded), which the goals subtract; each the
   least of ``--rounds`` (5) interleaved rounds (another 1 % rewritten each round). And,
   in this process, how many files the unchanged re-run opened (``uform.index.update.read``).
2. Search at each of ``--sizes`` stored 256-d F32 embeddings, synthetic: a mixture of
   ``sqrt(n)`` clusters of Zipf-distributed sizes (each row a centre plus Gaussian noise, cosine
   to its centre about 0.7), made unit; queries are fresh draws of the mixture. The query model
   is a random 256-d ``small`` checkpoint (``uform new``), so ``search(text)`` includes a real
   text encode. p50 of ``Index.search`` (text) exact and, from ``ivf.MIN_ROWS`` rows (and at
   100k forced, for comparison), with the IVF at several ``nprobe``, its recall@10 against exact;
   the store's bytes per item beyond the embeddings' own; an update of a 3-line text file, its
   unchanged re-run and its removal among those rows (wall and CPU s); ``counts()`` and ``len``
   after 3,000 items are removed (not compacted); and the command's wall time. With
   ``--exact-threads``, exact search by numpy's loop and by BLAS (OpenBLAS's default threads, and
   one), each in a process of its own, idle and beside a process spinning on a core. With
   ``--peers usearch,lancedb``, the same rows in those stores (how the store was chosen).
Writes benchmarks/results/index.json (``--out NAME``: NAME.json).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import save, table
from PIL import Image


def picture(rng: np.random.Generator, width: int = 640, height: int = 480) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    a, b, c = rng.uniform(0.5, 4.0, 3)
    base = np.stack([128 + 100 * np.sin(a * x / width * 6 + c), 128 + 100 * np.cos(b * y / height * 6), rng.uniform(0, 255) + 0 * x], -1)
    cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(8, 40)
    base[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))


CHILD_CPU: list[float] = []  # CPU seconds (user + system) of each command timed, in order


def timed(argv: list[str]) -> float:
    """Wall seconds of the command; its CPU seconds go to ``CHILD_CPU``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    took = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CHILD_CPU.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr[-2000:]}")
    return took


def folder(work: Path, files: int, rounds: int = 5) -> dict[str, Any]:
    photos, index = work / "photos", work / "photos.index"
    rng = np.random.default_rng(0)
    shutil.rmtree(index, ignore_errors=True)
    have = len(list(photos.rglob("*.jpg"))) if photos.is_dir() else 0
    for i in range(files if have != files else 0):  # a --workdir already holding the pictures keeps them
        sub = photos / f"{i // 500:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        picture(rng).save(sub / f"IMG_{i:05d}.jpg", quality=90)
    uform = [sys.executable, "-m", "uform.cli"]
    run = [*uform, "index", str(photos), "--into", str(index), "-q"]
    first = timed(run)
    # each command's least time over interleaved rounds: on a shared machine others' work only adds
    first_cpu = CHILD_CPU[-1]
    describes, unchanged_runs, changed_runs = [], [], []
    cpu: dict[str, list[float]] = {"describe": [], "unchanged": [], "changed": []}
    everything = sorted(photos.rglob("*.jpg"))
    for r in range(rounds):
        describes.append(timed([*uform, "describe"]))
        cpu["describe"].append(CHILD_CPU[-1])
        unchanged_runs.append(timed(run))
        cpu["unchanged"].append(CHILD_CPU[-1])
        changed = everything[r :: 100]  # another 1 % each round
        for p in changed:
            picture(rng).save(p, quality=90)
        changed_runs.append(timed(run))
        cpu["changed"].append(CHILD_CPU[-1])
    describe, unchanged, one_percent = min(describes), min(unchanged_runs), min(changed_runs)

    import uform.index.update as update
    from uform.index import Index

    opened = 0
    real = update.read

    def counting(path: str) -> Any:
        nonlocal opened
        opened += 1
        return real(path)

    update.read = counting
    try:
        with Index(index) as ix:
            t = time.perf_counter()
            report = ix.update([photos])
            in_process = time.perf_counter() - t
    finally:
        update.read = real
    return {
        "files": files, "changed_files": len(changed), "describe_s": describe, "first_s": first, "unchanged_s": unchanged,
        "changed_1pct_s": one_percent, "unchanged_beyond_startup_fraction": max(0.0, unchanged - describe) / first,
        "changed_1pct_beyond_startup_fraction": max(0.0, one_percent - describe) / first,
        "unchanged_in_process_s": in_process, "unchanged_files_opened": opened, "unchanged_reported": report.unchanged,
        "rounds": {"describe_s": describes, "unchanged_s": unchanged_runs, "changed_1pct_s": changed_runs},
        "cpu_s": {"first": first_cpu, **{k: min(v) for k, v in cpu.items()}},
        "cpu_unchanged_beyond_startup_fraction": max(0.0, min(cpu["unchanged"]) - min(cpu["describe"])) / first_cpu,
        "cpu_changed_1pct_beyond_startup_fraction": max(0.0, min(cpu["changed"]) - min(cpu["describe"])) / first_cpu,
    }  # fmt: skip


def synthetic(path: Path, checkpoint: Path, n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An index of ``n`` clustered unit rows; answers (centres, cluster weights) to draw queries from."""
    from uform.index.identity import Identity, checkpoint_digest
    from uform.index.records import Chunk, Insert
    from uform.index.store import Store

    rng = np.random.default_rng(seed)
    clusters = max(16, int(np.sqrt(n)))
    centres = rng.standard_normal((clusters, d)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    weights = 1.0 / np.arange(1, clusters + 1) ** 0.8
    weights /= weights.sum()
    store = Store(path, write=True, identity=Identity(checkpoint_digest(checkpoint), checkpoint.name, "bf16", d, "f32"))
    block = 100_000
    for start in range(0, n, block):
        m = min(block, n - start)
        rows = draw(rng, centres, weights, m)
        store.commit(Chunk(rows, [Insert(f"/home/someone/photos/2024/album-{(start + i) // 1000:04d}/IMG_{start + i:07d}.jpg",
                                         2_000_000 + i, 1_700_000_000_000_000_000 + i, rng.bytes(16), None, 1) for i in range(m)], new_paths=True))  # fmt: skip
    store.close()
    return centres, weights


def draw(rng: np.random.Generator, centres: np.ndarray, weights: np.ndarray, m: int) -> np.ndarray:
    d = centres.shape[1]
    rows = centres[rng.choice(len(centres), m, p=weights)] + rng.standard_normal((m, d)).astype(np.float32) * np.float32(1.0 / np.sqrt(d))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def p50(fn: Any, runs: int, rounds: int = 3) -> float:
    """Median wall milliseconds of ``fn`` (after one warm-up) in each of ``rounds`` rounds a second
    apart; answers the least of the rounds' medians (on a shared machine others' work only adds),
    and puts the largest in ``WORST_MS`` and the process's CPU milliseconds (median, that round) in ``CPU_MS``."""
    fn()
    medians, cpus = [], []
    for _ in range(rounds):
        times, cpu = [], []
        for _ in range(runs):
            t, c = time.perf_counter(), time.process_time()
            fn()
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        medians.append(float(np.median(times)) * 1e3)
        cpus.append(float(np.median(cpu)) * 1e3)
        time.sleep(1)
    best = int(np.argmin(medians))
    CPU_MS.append(round(cpus[best], 2))
    WORST_MS.append(round(max(medians), 2))
    return medians[best]


CPU_MS: list[float] = []
WORST_MS: list[float] = []

EXACT_CHILD = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[4])
from index import CPU_MS, p50
from uform.index import Index, scoring
if sys.argv[3] == "blas":  # the product exact search took before: one BLAS call, its threads OpenBLAS's
    scoring.dot = lambda rows, query: np.asarray(rows @ query, np.float32)
q = np.random.default_rng(1).standard_normal(256).astype(np.float32)
with Index(sys.argv[1], checkpoint=sys.argv[2], read_only=True) as ix:
    print(p50(lambda: ix.search_embedding(q, 10, exact=True), 9, 5), CPU_MS[-1])
"""


def exact_variants(path: Path, checkpoint: Path) -> dict[str, Any]:
    """Exact search's p50 ms and CPU ms (least of 5 rounds' medians of 9) by numpy's loop and by
    BLAS with OpenBLAS's default threads and with one, each in a process of its own; then again
    with a process spinning beside them (a busy core)."""
    variants = {"numpy_loop": ("einsum", {}), "blas_default_threads": ("blas", {}), "blas_1_thread": ("blas", {"OPENBLAS_NUM_THREADS": "1"})}
    out: dict[str, Any] = {}
    for load in ("idle", "busy"):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "busy" else None
        try:
            for name, (how, env) in variants.items():
                argv = [sys.executable, "-c", EXACT_CHILD, str(path), str(checkpoint), how, str(Path(__file__).parent)]
                wall, cpu = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout.split()
                out[f"{load}_{name}"] = {"p50_ms": round(float(wall), 1), "cpu_ms": float(cpu), "load_average": round(os.getloadavg()[0], 1)}
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    return out


def search(work: Path, sizes: list[int], queries: int, peer_names: list[str] = [], peer_rows: list[dict[str, Any]] = [],  # noqa: B006
           peer_sizes: tuple[int, ...] = (), exact_threads: bool = False) -> list[dict[str, Any]]:
    from uform.index import Index, ivf

    checkpoint = work / "small.safetensors"
    subprocess.run([sys.executable, "-m", "uform.cli", "new", str(checkpoint), "--preset", "small", "--modalities", "text", "-q"], check=True, capture_output=True)
    out = []
    for n in sizes:
        path = work / f"synthetic-{n}"
        t = time.perf_counter()
        centres, weights = synthetic(path, checkpoint, n, 256)
        built = time.perf_counter() - t
        os.sync()
        embeddings = n * 256 * 4
        row: dict[str, Any] = {"items": n, "build_s": round(built, 1), "bytes_per_item_beyond_embeddings": round((_size(path) - embeddings) / n, 1)}
        rng = np.random.default_rng(1)
        qs = draw(rng, centres, weights, queries)
        if peer_names and n in peer_sizes:
            for r in peers(path, peer_names, qs):
                print(r, flush=True)
                peer_rows.append(r)
        with Index(path, checkpoint=checkpoint) as ix:
            ix.search("warm up", 10)
            row["load_average"] = round(os.getloadavg()[0], 1)
            row["exact_text_p50_ms"] = round(p50(lambda: ix.search("a red circle on a white background", 10, exact=True), 9), 2)
            row["exact_text_cpu_ms"], row["exact_text_worst_round_ms"] = CPU_MS[-1], WORST_MS[-1]
            if exact_threads:
                row["exact_variants"] = exact_variants(path, checkpoint)
                print(row["exact_variants"], flush=True)
            exact = [[h.path for h in ix.search_embedding(q, 10, exact=True)] for q in qs]
            if n >= min(100_000, ivf.MIN_ROWS):
                t = time.perf_counter()
                ix.build_ivf(force=True)
                row["ivf_build_s"] = round(time.perf_counter() - t, 1)
                os.sync()  # the rewritten vectors reach the disk before the timings, not during them
                row["ivf_lists"] = int(np.sqrt(n))
                row["bytes_per_item_with_ivf"] = round((_size(path) - embeddings) / n, 1)
                for nprobe in sorted({8, 16, 32, 64, 128, ivf.default_nprobe(max(16, int(np.sqrt(n))))}):
                    got = [[h.path for h in ix.search_embedding(q, 10, nprobe=nprobe)] for q in qs]
                    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, exact)]))
                    row[f"ivf_nprobe{nprobe}_recall10"] = round(recall, 4)
                    row[f"ivf_nprobe{nprobe}_emb_p50_ms"] = round(p50(lambda q=qs[0], n_=nprobe: ix.search_embedding(q, 10, nprobe=n_), 9, 1), 2)
                row["default_text_p50_ms"] = round(p50(lambda: ix.search("a red circle on a white background", 10), 15, 5), 2)
                row["default_text_cpu_ms"], row["default_text_worst_round_ms"] = CPU_MS[-1], WORST_MS[-1]
            few = work / "few.txt"  # a small update among n items: what it costs beyond its own items
            few.write_text("a red circle\na blue square\na green triangle\n")
            for name, act in (("update_3_lines", lambda: ix.update([few])), ("update_3_lines_unchanged", lambda: ix.update([few])),
                              ("remove_3_lines", lambda: ix.remove([few]))):  # fmt: skip
                t, c = time.perf_counter(), time.process_time()
                act()
                row[f"{name}_s"], row[f"{name}_cpu_s"] = round(time.perf_counter() - t, 3), round(time.process_time() - c, 3)
            albums = [f"/home/someone/photos/2024/album-{a:04d}" for a in range(3)]  # 3,000 items removed, not compacted
            t = time.perf_counter()
            row["remove_3000_s"] = (ix.remove(albums), round(time.perf_counter() - t, 3))[1]
            row["counts_after_removal_ms"] = round(p50(ix.counts, 5, 1), 2)
            row["len_after_removal_ms"] = round(p50(lambda: len(ix), 5, 1), 3)
        row["command_wall_s"] = round(timed([sys.executable, "-m", "uform.cli", "search", "a red circle", "--index", str(path), "-m", str(checkpoint)]), 2)
        out.append(row)
        print(row, flush=True)
        shutil.rmtree(path)
    return out


def peers(path: Path, names: list[str], queries: np.ndarray, runs: int = 20) -> list[dict[str, Any]]:
    """The same rows in USearch (HNSW) and LanceDB (its brute-force scan, and its IVF-PQ index):
    build time, search p50 of one query, recall@10 against exact, bytes per item beyond the embeddings."""
    from uform.index import scoring
    from uform.index.store import Store

    store = Store(path, write=False)
    rows, _ = store.vectors(*store.state())
    rows = np.asarray(rows)
    n, d = rows.shape
    exact = [set(scoring.top(rows @ q, 10).tolist()) for q in queries]
    out: list[dict[str, Any]] = []

    def recall(found: list[list[int]]) -> float:
        return round(float(np.mean([len(set(f) & e) / 10 for f, e in zip(found, exact)])), 4)

    if "usearch" in names:
        from usearch.index import Index as HNSW

        for dtype in ("f32", "f16"):
            t = time.perf_counter()
            hnsw = HNSW(ndim=d, metric="ip", dtype=dtype, connectivity=16)
            hnsw.add(np.arange(n), rows, threads=len(os.sched_getaffinity(0)))
            built = time.perf_counter() - t
            file = path.parent / f"usearch-{dtype}.bin"
            hnsw.save(str(file))
            found = [list(hnsw.search(q, 10).keys) for q in queries]
            out.append({"store": f"usearch hnsw {dtype} (M=16)", "items": n, "build_s": round(built, 1), "recall10": recall(found),
                        "p50_ms": round(p50(lambda: hnsw.search(queries[0], 10), runs), 3),
                        "bytes_per_item_beyond_embeddings": round((file.stat().st_size + _size(path) - n * d * 4) / n, 1),
                        "note": "its own copy of the vectors beside uform's store"})  # fmt: skip
            file.unlink()
    if "lancedb" in names:
        import lancedb
        import pyarrow as pa

        folder = path.parent / "lance"
        t = time.perf_counter()
        db = lancedb.connect(str(folder))
        table = db.create_table("items", pa.table({"id": np.arange(n), "vector": pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), d)}))
        built = time.perf_counter() - t
        found = [list(table.search(q).metric("dot").limit(10).to_arrow()["id"].to_numpy()) for q in queries]
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        out.append({"store": "lancedb flat scan", "items": n, "build_s": round(built, 1), "recall10": recall(found),
                    "p50_ms": round(p50(lambda: table.search(queries[0]).metric("dot").limit(10).to_arrow(), 5), 2),
                    "bytes_per_item_beyond_embeddings": round((size - n * d * 4) / n, 1)})  # fmt: skip
        t = time.perf_counter()
        table.create_index(metric="dot", num_partitions=int(np.sqrt(n)), num_sub_vectors=d // 8)
        built = time.perf_counter() - t
        found = [list(table.search(q).metric("dot").nprobes(max(8, int(np.sqrt(n)) // 10)).limit(10).to_arrow()["id"].to_numpy()) for q in queries]
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        out.append({"store": "lancedb ivf-pq", "items": n, "build_s": round(built, 1), "recall10": recall(found),
                    "p50_ms": round(p50(lambda: table.search(queries[0]).metric("dot").nprobes(max(8, int(np.sqrt(n)) // 10)).limit(10).to_arrow(), 9), 2),
                    "bytes_per_item_beyond_embeddings": round((size - n * d * 4) / n, 1)})  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)
    store.close()
    return out


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the folder's re-runs (the least time of each counts)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--peers", default="", help="also measure these stores on the same rows: usearch,lancedb")
    ap.add_argument("--peer-sizes", default="100000", help="the sizes --peers are measured at")
    ap.add_argument("--exact-threads", action="store_true", help="also exact search by numpy's loop and by BLAS (default threads, one), idle and beside a busy core")
    ap.add_argument("--out", default="index", help="the result file's name (benchmarks/results/NAME.json)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="uform-index-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "load_average_at_start": round(os.getloadavg()[0], 1)}
    try:
        if args.files:
            result["folder"] = folder(work, args.files, args.rounds)
            print(table([result["folder"]], list(result["folder"])), flush=True)
        sizes = [int(s) for s in args.sizes.split(",") if s]
        result["peers"] = []
        result["search"] = search(work, sizes, args.queries, [p for p in args.peers.split(",") if p], result["peers"],
                                  tuple(int(s) for s in args.peer_sizes.split(",") if s), args.exact_threads)  # fmt: skip
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print("wrote", save(args.out, result))


if __name__ == "__main__":
    main()
