"""``Index.remove`` at a million items: what the hash index and the list of removed slots cost a removal.

    python benchmarks/index_removal.py [--items 1000000] [--removals 3000,100000] [--rounds 2] [--workdir DIR]

An index of ``--items`` synthetic items (8-d F32 rows, 1,000 to a folder, random 16-byte hashes,
paths as benchmarks/index.py makes them) is built once through ``Store.commit``; each round copies
it and times ``Store.remove`` of the first folders holding each of ``--removals`` items (wall and
CPU s, the commit included: a ``DELETE ... WHERE path >= ? AND path < ?`` a folder, the trigger
listing each slot), then the same items removed one by one on another copy (their slots read,
then a ``DELETE ... WHERE slot = ?`` each, as uform did before). Checks that each leaves ``len`` lower by the items
removed and ``removed`` listing them. Writes benchmarks/results/index-removal.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import save, table

PER_FOLDER = 1000


def build(path: Path, items: int) -> None:
    from uform.index.identity import Identity
    from uform.index.records import Chunk, Insert
    from uform.index.store import Store

    rng = np.random.default_rng(0)
    store = Store(path, write=True, identity=Identity("0" * 64, "synthetic", "bf16", 8, "f32"))
    block = 100_000
    for start in range(0, items, block):
        m = min(block, items - start)
        rows = rng.standard_normal((m, 8)).astype(np.float32)
        store.commit(Chunk(rows, [Insert(f"/home/someone/photos/2024/album-{(start + i) // PER_FOLDER:04d}/IMG_{start + i:07d}.jpg",
                                         2_000_000 + i, 1_700_000_000_000_000_000 + i, rng.bytes(16), None, 1) for i in range(m)], new_paths=True))  # fmt: skip
    store.close()


def one_by_one(store: Any, folders: list[str]) -> int:
    from uform.index.schema import under

    with store.transaction() as c:
        slots = [s for f in folders for (s,) in c.execute("SELECT slot FROM items WHERE path >= ? AND path < ?", under(f))]
        c.executemany("DELETE FROM items WHERE slot = ?", ((s,) for s in slots))
    return len(slots)


def removal(base: Path, work: Path, count: int, *, method: str) -> dict[str, Any]:
    from uform.index.store import Store

    copy = work / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(base, copy)
    store = Store(copy, write=True)
    before = store.count()
    folders = [f"/home/someone/photos/2024/album-{a:04d}" for a in range(count // PER_FOLDER)]
    t, c = time.perf_counter(), time.process_time()
    removed = store.remove(folders, []) if method == "Store.remove" else one_by_one(store, folders)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    assert removed == count and store.count() == before - count and len(store.removed()) == count, (removed, store.count())
    store.close()
    return {"removed": count, "method": method, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "load_average": round(os.getloadavg()[0], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--removals", default="3000,100000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.workdir))
    try:
        t = time.perf_counter()
        build(work / "base", args.items)
        print(f"built {args.items} items in {time.perf_counter() - t:.1f} s", flush=True)
        rows = []
        for _ in range(args.rounds):
            for count in map(int, args.removals.split(",")):
                for method in ("Store.remove", "one by one"):
                    rows.append(removal(work / "base", work, count, method=method))
                    print(rows[-1], flush=True)
        print(table(rows, ["removed", "method", "wall_s", "cpu_s", "load_average"]))
        print(save("index-removal", {"items": args.items, "rows": rows}))
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
