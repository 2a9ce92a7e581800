"""``kill -9`` at random moments of real ``uform index`` runs (docs/index.md, "Crash safety").

Each trial starts the command in a subprocess over a folder of pictures (its chunks made small,
so that a run commits many times) and kills it with SIGKILL after a random delay drawn over a
whole run's length: during start-up, the walk, an encode, an append, a commit, the pruning or a
compaction. The child prints ``committed N`` after each commit it made. After every kill the
index must open, hold at least the N items the child said it committed, and hold nothing
half-written: every row's vector is the model's embedding of the bytes its hash names. Between
trials the folder changes (files added, rewritten, renamed, deleted), and every few trials an
unkilled run must complete the index to exactly the folder's contents. 20 kills, on a tiny model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import uform
import uform.index.update as update
from ckpt import make_checkpoint
from uform.index import Index

KILLS = 20
CHILD = """
import sys
import uform.index.ivf as ivf
import uform.index.update as update
update.CHUNK = 3
ivf.MIN_ROWS = 8  # clustered from 8 rows on: kills land in clusterings (a rewrite of every row) too
commit = update.Updater._commit

def committed(self, pending, count):  # says, once its transaction is committed, each path it put in and its hash
    commit(self, pending, count)
    paths = [n.insert.path for n in pending.new if n.insert.path in self.rows] + [m.path for m in pending.moves]  # refused ones left
    print("committed", *(f"{p}={self.rows[p].hash.hex()}" for p in paths), flush=True)

update.Updater._commit = committed
from uform.index import Index
with Index(sys.argv[1], checkpoint=sys.argv[2]) as ix:
    ix.update([sys.argv[3]])
print("finished", flush=True)
"""


def picture(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (20, 20, 3), dtype=np.uint8))


def run(index: Path, ckpt: Path, folder: Path, *, kill_after: float | None) -> tuple[dict[str, str], str]:
    """What the child said it committed (path: hash) and all it printed; killed after ``kill_after`` s."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(index), str(ckpt), str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after is None:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-3000:]
    else:
        try:
            child.wait(timeout=kill_after)  # a run that ends first is not killed (and counts no kill)
        except subprocess.TimeoutExpired:
            os.kill(child.pid, signal.SIGKILL)
        out, err = child.communicate(timeout=60)
        assert child.returncode in (0, -signal.SIGKILL), err[-3000:]
    committed = dict(word.split("=") for line in out.splitlines() if line.startswith("committed") for word in line.split()[1:])
    return committed, out


def test_random_kills_leave_a_valid_index_and_lose_nothing_committed(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "tiny.safetensors", "tiny", 0, ["image"])
    folder, index = tmp_path / "photos", tmp_path / "idx"
    folder.mkdir()
    rng = np.random.default_rng(1234)
    seeds = iter(range(10_000))
    for _ in range(30):
        picture(next(seeds)).save(folder / f"p{next(seeds)}.png")
    with uform.Model.load_ram(ckpt) as model:

        def truth(path: Path) -> np.ndarray:
            return np.array(model.image_encode([path.read_bytes()], uform.Arena()).embeddings[0])

        reference: dict[str, np.ndarray] = {}  # hash -> embedding of the bytes that hash, of every content the folder held
        for p in folder.iterdir():
            reference[update.digest(p.read_bytes()).hex()] = truth(p)
        start = time.perf_counter()
        run(index, ckpt, folder, kill_after=None)
        whole = time.perf_counter() - start  # one full run's length: the kills are drawn over it
        kills = completions = 0
        while kills < KILLS:
            change(folder, rng, seeds)
            for p in folder.iterdir():
                reference.setdefault(update.digest(p.read_bytes()).hex(), truth(p))
            committed, out = run(index, ckpt, folder, kill_after=float(rng.uniform(0.0, whole * 1.1)))
            killed = "finished" not in out
            kills += killed
            with Index(index, checkpoint=ckpt, read_only=True) as ix:  # opens: never damaged
                entries = list(ix.entries())
                held = {e.path: e.hash for e in entries}
                for e in entries[:3]:  # and it answers searches, clustered or not: an item finds itself
                    assert ix.search_embedding(e.embedding.astype(np.float32), 1, nprobe=16)[0].score == pytest.approx(1, abs=1e-5)
                assert committed.items() <= held.items(), sorted(committed.items() - held.items())  # nothing committed lost
                for e in entries:  # nothing half-written: each row is its hash's embedding
                    np.testing.assert_allclose(e.embedding, reference[e.hash], atol=1e-6, err_msg=e.path)
                assert len({e.path for e in entries}) == len(entries)
            if killed and kills % 5 == 0:  # the next run completes it: exactly the folder, nothing stale
                start = time.perf_counter()
                run(index, ckpt, folder, kill_after=None)
                whole = time.perf_counter() - start  # the machine's pace now: later kills are drawn over it
                completions += 1
                with Index(index, checkpoint=ckpt, read_only=True) as ix:
                    held = {e.path: e.hash for e in ix.entries()}
                assert held == {str(p): update.digest(p.read_bytes()).hex() for p in folder.iterdir()}
                assert len(list(index.glob("ivf-*.npz"))) == 1  # the completed run clustered it
        assert completions == KILLS // 5


def change(folder: Path, rng: np.random.Generator, seeds: object) -> None:
    """Add, rewrite, rename and delete a few pictures."""
    files = sorted(folder.iterdir())
    pick = rng.permutation(len(files))
    nxt = seeds.__next__  # type: ignore[attr-defined]
    picture(nxt()).save(files[pick[0]])
    os.rename(files[pick[1]], folder / f"moved{nxt()}.png")
    files[pick[2]].unlink()
    for _ in range(3):
        picture(nxt()).save(folder / f"new{nxt()}.png")

