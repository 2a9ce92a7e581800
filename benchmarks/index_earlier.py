"""An earlier uform's index (no path index until its first write): what an update's look at its
paths (``Store.known``) costs there, beside the same index with its path index.

    python benchmarks/index_earlier.py [--items 1000000] [--workdir DIR]

An ``index.sqlite`` of ``--items`` items (paths ``/data/photos/dNNNN/pNNNNNNN.png``, 1,000 to a
folder, random 16-byte hashes) is written straight through SQLite, once with the path index and
once without it (what an earlier uform made); on each, a reader times ``Store.known`` for one
folder, three (one missing), 10 text keys and 256 (wall and CPU s; no row files are read).
Writes benchmarks/results/index_earlier.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from common import save, table

ASKS = {"1 folder": (["/data/photos/d0500"], 0), "3 folders": (["/data/photos/d0500", "/data/photos/d0900", "/elsewhere"], 0),
        "10 text keys": ([], 10), "256 text keys": ([], 256)}  # fmt: skip


def build(folder: Path, items: int, *, earlier: bool) -> None:
    from uform.index.identity import Identity
    from uform.index.store import Store

    Store(folder, write=True, identity=Identity("0" * 64, "synthetic", "bf16", 8, "f32")).close()  # the database, made as uform makes it
    conn = sqlite3.connect(folder / "index.sqlite", isolation_level=None)
    conn.execute("BEGIN")
    rows = ((i, f"/data/photos/d{i // 1000:04d}/p{i:07d}.png", 1000 + i, i, os.urandom(16)) for i in range(items))
    conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?, NULL)", rows)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'slots'", (str(items),))
    conn.execute("COMMIT")
    if earlier:
        for drop in ("TRIGGER items_removed", "TABLE removed", "INDEX items_hash", "INDEX items_path"):
            conn.execute(f"DROP {drop}")
    conn.close()


def timed(folder: Path) -> dict[str, Any]:
    from uform.index.store import Store

    store = Store(folder, write=False)
    out = {}
    try:
        for name, (roots, keys) in ASKS.items():
            wall, cpu = time.perf_counter(), time.process_time()
            with store.snapshot():
                found = store.known(roots, [f"note-{i}" for i in range(keys)])
            out[name] = {"found": len(found), "wall_s": round(time.perf_counter() - wall, 3), "cpu_s": round(time.process_time() - cpu, 3)}
    finally:
        store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", default="index_earlier")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.workdir))
    try:
        result: dict[str, Any] = {"items": args.items, "load_average": os.getloadavg()}
        for kind, earlier in (("with the path index", False), ("earlier uform", True)):
            build(work / kind.replace(" ", "-"), args.items, earlier=earlier)
            result[kind] = timed(work / kind.replace(" ", "-"))
        print(table([{"index": kind, "asked": name, **r} for kind in ("with the path index", "earlier uform") for name, r in result[kind].items()],
                    ["index", "asked", "found", "wall_s", "cpu_s"]))  # fmt: skip
        save(args.out, result)
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
