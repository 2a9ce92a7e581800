"""uform.index's file: one writer at a time, readers seeing whole chunks, a cancelled update's
committed chunks kept, another model's, damaged and foreign indexes refused, an earlier uform's
index upgraded by its first write (never by a run with nothing to write), and the SQLite work each operation does (what it reads, not
every item). A tiny checkpoint and pictures made on the spot."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uform
import uform.index.update as update
from uform.index import Index, IndexBusyError, IndexFormatError, IndexModelError, Text
from uform.index.store import Store
from index_files import ckpt, model, other_ckpt, photos  # noqa: F401 (fixtures)


def test_an_index_another_writer_made_before_the_lock_is_opened_not_made_again(tmp_path: Path, ckpt: Path, model: uform.Model,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A writer looked for index.sqlite before it took the lock: one that found none, then got the
    lock after another writer had made the index and finished, made a new database and renamed it
    over the other's (its items lost, its rows orphaned). It now looks again under the lock."""
    import uform.index.files as files

    real = files.take_lock

    def racing(folder: Path) -> int:  # the other writer runs whole between the look and the lock
        monkeypatch.setattr(files, "take_lock", real)
        with Index(folder, checkpoint=ckpt, model=model) as other:
            other.update([Text("/k", "made by the other writer")])
        return real(folder)

    monkeypatch.setattr(files, "take_lock", racing)
    with Index(tmp_path / "idx", checkpoint=ckpt, model=model) as ix:
        assert [e.path for e in ix.entries()] == ["/k"] and len(ix) == 1


def test_two_writers_the_second_is_refused(tmp_path: Path, ckpt: Path) -> None:
    root = photos(tmp_path / "photos", 2)
    with Index(tmp_path / "idx", checkpoint=ckpt) as first:
        first.update([root])
        with pytest.raises(IndexBusyError, match="another writer"):
            Index(tmp_path / "idx", checkpoint=ckpt)
        with Index(tmp_path / "idx", checkpoint=ckpt, read_only=True) as reader:  # readers are never refused
            assert len(reader) == 2
    with Index(tmp_path / "idx", checkpoint=ckpt) as again:  # the lock went with the first writer
        assert len(again) == 2


def test_a_reader_sees_each_committed_chunk_whole(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = photos(tmp_path / "photos", 7)
    monkeypatch.setattr(update, "CHUNK", 2)
    seen: list[tuple[int, int]] = []
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:

        def progress(done: int, total: int) -> None:
            with Index(tmp_path / "idx", checkpoint=ckpt, read_only=True) as reader:
                seen.append((done, len(reader)))
                assert len(reader.search_embedding(np.ones(32, np.float32), 0)) == len(reader)

        ix.update([root], progress=progress)
    assert seen == [(2, 2), (4, 4), (6, 6), (7, 7)]


@pytest.mark.parametrize("stop", [False, np.False_], ids=["False", "numpy-False"])
def test_a_progress_handler_answering_false_cancels_and_committed_chunks_stay(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch, stop: Any) -> None:
    root = photos(tmp_path / "photos", 5)
    monkeypatch.setattr(update, "CHUNK", 2)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        with pytest.raises(uform.CancelledError, match="cancelled by its progress handler; what was committed stays"):
            ix.update([root], progress=lambda done, total: stop if done >= 4 else None)
        assert len(ix) == 4


def test_another_model_is_refused(tmp_path: Path, ckpt: Path, other_ckpt: Path) -> None:
    root = photos(tmp_path / "photos", 2)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
    with pytest.raises(IndexModelError, match=r"was made by .*tiny\.safetensors \(sha256 .*this is .*other\.safetensors.*--model .*tiny\.safetensors"):
        Index(tmp_path / "idx", checkpoint=other_ckpt)
    with pytest.raises(IndexModelError, match="bf16 weights.*e4m3 weights"):
        Index(tmp_path / "idx", checkpoint=ckpt, quantization="e4m3")
    with pytest.raises(IndexModelError, match=r"f32 vectors.*i8 vectors.*--quantization bf16 --outputs-scalar f32, or no --outputs-scalar\)"):
        Index(tmp_path / "idx", checkpoint=ckpt, outputs_scalar="i8")
    with Index(tmp_path / "idx", checkpoint=ckpt, read_only=True) as ix:  # untouched by the refusals
        assert len(ix) == 2


def test_damaged_or_foreign_indexes_are_refused(tmp_path: Path, ckpt: Path) -> None:
    root = photos(tmp_path / "photos", 3)
    for name in ("garbage", "short", "version"):
        with Index(tmp_path / name, checkpoint=ckpt) as ix:
            ix.update([root])
    (tmp_path / "garbage" / "index.sqlite").write_bytes(b"this is no database" * 100)
    with pytest.raises(IndexFormatError, match="damaged.*move it away"):
        Index(tmp_path / "garbage", checkpoint=ckpt)
    with open(tmp_path / "short" / "vectors-0.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(IndexFormatError, match="damaged: vectors-0.bin holds 0 rows, the database says 3"):
        Index(tmp_path / "short", checkpoint=ckpt)
    with sqlite3.connect(tmp_path / "version" / "index.sqlite") as c:
        c.execute("UPDATE meta SET value = 'uform-index/9' WHERE key = 'format'")
    with pytest.raises(IndexFormatError, match="format 'uform-index/9'"):
        Index(tmp_path / "version", checkpoint=ckpt, read_only=True)
    with pytest.raises(FileNotFoundError, match="no such index"):
        Index(tmp_path / "nowhere", checkpoint=ckpt, read_only=True)


def test_an_index_opened_without_a_quantization_uses_its_own(tmp_path: Path, ckpt: Path) -> None:
    root = photos(tmp_path / "photos", 2)
    with Index(tmp_path / "idx", checkpoint=ckpt, quantization="e4m3") as ix:
        ix.update([root])
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        assert ix.quantization == "e4m3" and ix.model.describe().quantization is uform.Scalar.E4M3
        assert ix.search_file(root / "p0.png", 1)[0].path == str(root / "p0.png")


@pytest.fixture
def sqlite_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of SQLite's virtual-machine steps (a call every 100) on every connection opened
    from now on: what a read costs, without timing it (a read of every item is thousands)."""
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    connect = sqlite3.connect

    def counted(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_progress_handler(step, 100)
        return conn

    monkeypatch.setattr(sqlite3, "connect", counted)
    return steps


def test_remove_reads_what_it_removes_not_every_item(tmp_path: Path, ckpt: Path, sqlite_steps: list[int]) -> None:
    """Index.remove read every item's path into Python and tested each against the paths given:
    removing a 3-line text file from a million-item index took 10.9 s (7.9 CPU s). Now each path
    is a range of the path index: a bounded number of SQLite's steps beside 20,000 other items,
    the same items removed (a folder's files, a text file's lines, a Text's key; nothing else)."""
    from uform.index.identity import Identity, checkpoint_digest
    from uform.index.records import Chunk, Insert
    from uform.index.store import Store

    n = 20_000
    paths = [f"/p/a/{i}" for i in range(n)] + ["/p/b", "/p/b/1", "/p/b/c/2", "/p/bb/3", "/p/t.txt:1", "/p/t.txt:2", "/p/t.txtx:1", "note", "/p/b.jpg"]
    texts = {"/p/t.txt:1", "/p/t.txt:2", "/p/t.txtx:1", "note"}
    rows = np.zeros((len(paths), 32), np.float32)
    rows[:, 0] = 1
    store = Store(tmp_path / "idx", write=True, identity=Identity(checkpoint_digest(ckpt), "tiny", "bf16", 32, "f32"))
    store.commit(Chunk(rows, [Insert(p, 1, 1, i.to_bytes(16, "big"), "x" if p in texts else None, 1) for i, p in enumerate(paths)], new_paths=True))
    store.close()
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        sqlite_steps[0] = 0
        assert ix.remove(["/p/b", "/p/t.txt", "/p/nothing", "note"]) == 6
        assert sqlite_steps[0] < 20, sqlite_steps  # reading every item is over 200 calls here
        assert {e.path for e in ix.entries()} == set(paths) - {"/p/b", "/p/b/1", "/p/b/c/2", "/p/t.txt:1", "/p/t.txt:2", "note"}


def test_an_update_reads_the_items_under_its_paths_not_every_item(tmp_path: Path, ckpt: Path, model: uform.Model,
                                                                   sqlite_steps: list[int]) -> None:  # fmt: skip
    """An update read every item of the index into Python (Store.known), and build_ivf every live
    slot, whatever it was given: a 3-line text file into a million-item index took 14.1 CPU s, its
    unchanged re-run 12.4. Now it reads the items under its paths (ranges of the path index) and
    counts the rest: the re-run is a bounded number of SQLite's steps beside 20,000 other items;
    new content still finds a copy's row anywhere in the index (every hash, read then)."""
    from uform.index.identity import Identity, checkpoint_digest
    from uform.index.records import Chunk, Insert
    from uform.index.store import Store
    from uform.index.update import digest

    n, dims = 20_000, model.describe().dimensions
    from uform.core.arena import Arena

    copy = np.array(model.text_encode(["a green triangle"], Arena()).embeddings[0])
    rows = np.zeros((n, dims), np.float32)
    rows[:, 0] = 1
    rows[5] = copy
    hashes = [i.to_bytes(16, "big") for i in range(n)]
    hashes[5] = digest("a green triangle".encode())
    store = Store(tmp_path / "idx", write=True, identity=Identity(checkpoint_digest(ckpt), "tiny", "bf16", dims, "f32"))
    store.commit(Chunk(rows, [Insert(f"/p/a/{i}", 1, 1, hashes[i], None, 1) for i in range(n)], new_paths=True))
    store.close()
    lines = tmp_path / "few.txt"
    lines.write_text("a red circle\na green triangle\n")
    with Index(tmp_path / "idx", checkpoint=ckpt, model=model) as ix:
        sqlite_steps[0] = 0
        first = ix.update([lines])
        assert (first.added, first.copied) == (1, 1)  # the second line's hash is /p/a/5's: its row copied
        assert sqlite_steps[0] < 60, sqlite_steps  # the copy found through the hash index: every item's hash is over 200 calls here
        sqlite_steps[0] = 0
        again = ix.update([lines])
        assert (again.added, again.copied, again.unchanged) == (0, 0, 2)
        assert sqlite_steps[0] < 40, sqlite_steps  # reading every item is over 200 calls here
        assert {h.path for h in ix.search_embedding(copy, 2)} == {"/p/a/5", f"{lines}:2"}  # the copied row, the same vector


def test_counts_read_no_slot_when_every_slot_is_an_item(tmp_path: Path, ckpt: Path, sqlite_steps: list[int]) -> None:
    """Index.counts (the summary line of every `uform index` run) read every item's slot into
    Python: 0.65-0.86 CPU s at a million items. When the items are as many as the slots, each slot
    is an item's (slots are unique and below meta.slots): the kind bytes are counted alone; a
    removed item's slot is still left out."""
    from uform.index.identity import Identity, checkpoint_digest
    from uform.index.records import Chunk, Insert
    from uform.index.store import Store

    n = 20_000
    rows = np.zeros((n, 32), np.float32)
    rows[:, 0] = 1
    store = Store(tmp_path / "idx", write=True, identity=Identity(checkpoint_digest(ckpt), "tiny", "bf16", 32, "f32"))
    store.commit(Chunk(rows, [Insert(f"/p/{i}", 1, 1, i.to_bytes(16, "big"), "x" if i < 5 else None, 1 if i >= 5 else 0) for i in range(n)], new_paths=True))
    store.close()
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        sqlite_steps[0] = 0
        assert ix.counts() == {"text": 5, "image": n - 5, "video": 0, "audio": 0}
        assert sqlite_steps[0] < 20, sqlite_steps  # reading every slot is over 200 calls here
        ix.remove(["/p/0", "/p/7"])
        sqlite_steps[0] = 0
        assert ix.counts() == {"text": 4, "image": n - 6, "video": 0, "audio": 0}
        assert len(ix) == n - 2
        assert sqlite_steps[0] < 20, sqlite_steps  # the removed slots read, not every item's (over 200 calls here)


def test_an_index_of_an_earlier_uform_is_upgraded_by_its_next_writer(tmp_path: Path, ckpt: Path, model: uform.Model, monkeypatch: pytest.MonkeyPatch,
                                                                     sqlite_steps: list[int]) -> None:  # fmt: skip
    """An index written before the hash index and the list of removed slots (as this one, with
    them dropped) is read as it is, and its first real write adds them, in that write's
    transaction (a writer stopped inside leaves the index as it was; a writer with nothing to
    write writes nothing): then new content finds a copy and counts read the removed slots
    alone. An earlier uform's compaction drops the trigger that lists them: what it left listed
    is not trusted, and listed again."""
    db = tmp_path / "idx" / "index.sqlite"
    with Index(tmp_path / "idx", checkpoint=ckpt, model=model) as ix:
        ix.update([Text(f"/k{i}", f"text {i}") for i in range(12)])
        ix.remove(["/k0", "/k5"])

    def earlier(*, compacted: bool = False) -> None:
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TRIGGER items_removed")
            if not compacted:
                conn.execute("DROP TABLE removed")
                conn.execute("DROP INDEX items_hash")
        conn.close()

    def names() -> set[str]:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}

    counts = {"text": 10, "image": 0, "video": 0, "audio": 0}
    earlier()
    assert {"removed", "items_hash", "items_removed"}.isdisjoint(names())
    with Index(tmp_path / "idx", checkpoint=ckpt, read_only=True) as ix:
        assert ix.counts() == counts and len(ix) == 10  # read as it is, every item counted
    assert {"removed", "items_hash", "items_removed"}.isdisjoint(names())
    before = db.read_bytes()
    with Index(tmp_path / "idx", checkpoint=ckpt, model=model) as ix:  # a writer with nothing to write
        assert ix.counts() == counts and ix.update([Text(f"/k{i}", f"text {i}") for i in (1, 2)]).touched == 2
        assert ix.remove(["/nothing"]) == 0 and ix.compact(only_if_worth=True) == 0
    assert db.read_bytes() == before and {"removed", "items_hash", "items_removed"}.isdisjoint(names())
    real = Store.state
    with Index(tmp_path / "idx", checkpoint=ckpt, model=model) as ix:
        monkeypatch.setattr(Store, "live", lambda self: (_ for _ in ()).throw(OSError("stopped inside the upgrade")))
        with pytest.raises(OSError, match="stopped inside"):
            ix.update([Text("/new", "text new")])
        monkeypatch.undo()
        assert Store.state is real and "removed" not in names() and ix.counts() == counts  # its transaction rolled back: nothing half-listed
        assert ix.update([Text("/new", "text new")]).added == 1  # the first real write: upgraded in its transaction
        assert ix.remove(["/new"]) == 1
        assert {"removed", "items_hash", "items_removed"} <= names()
        sqlite_steps[0] = 0
        assert ix.counts() == counts and len(ix) == 10
        assert sqlite_steps[0] < 20, sqlite_steps
        report = ix.update([Text("/copy", "text 3")])
        assert (report.added, report.copied) == (0, 1)
    earlier(compacted=True)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO removed VALUES (3)")  # stale: slot 3 is /k3's, which an earlier compaction may have moved there
    conn.close()
    with Index(tmp_path / "idx", checkpoint=ckpt, read_only=True) as ix:
        assert ix.counts() == {**counts, "text": 11}
    with Index(tmp_path / "idx", checkpoint=ckpt, model=model) as ix:
        assert ix.counts() == {**counts, "text": 11} and len(ix) == 11
        assert ix.remove(["/k3"]) == 1 and ix.counts() == counts
        assert ix.compact() == 4 and ix.counts() == counts and len(ix) == 10  # /k0, /k5, /new, /k3


def test_an_earlier_uforms_index_looks_new_content_up_without_a_scan_each(tmp_path: Path, ckpt: Path, model: uform.Model,
                                                                           sqlite_steps: list[int], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Since its upgrade waits for the first write, the first chunk of an update into an earlier
    uform's index looks its new content up with no hash index: each lookup scanned the table
    (0.13 s at a million items, 256 of them a chunk). Every hash is now read once for them
    (3.3 s at a million), and the hash index serves once the first write added it."""
    db = tmp_path / "idx" / "index.sqlite"
    with Index(tmp_path / "idx", checkpoint=ckpt, model=model) as ix:
        ix.update([Text(f"/k{i}", f"text {i}") for i in range(2000)])
    with sqlite3.connect(db) as conn:
        for drop in ("TRIGGER items_removed", "TABLE removed", "INDEX items_hash"):
            conn.execute(f"DROP {drop}")
    conn.close()
    from uform.index.store import Store

    looked: list[int] = []
    real = Store.slot_of
    with Index(tmp_path / "idx", checkpoint=ckpt, model=model) as ix:

        def slot_of(self: Store, digest: bytes) -> int | None:
            before = sqlite_steps[0]
            found = real(self, digest)
            looked.append(sqlite_steps[0] - before)
            return found

        monkeypatch.setattr(Store, "slot_of", slot_of)
        report = ix.update([Text(f"/new{i}", f"new text {i}") for i in range(40)] + [Text("/copy", "text 7")])
        assert (report.added, report.copied, len(ix)) == (40, 1, 2041)
    assert len(looked) == 41 and sum(looked[1:]) < 40, looked  # a scan of 2,000 items is over 40 steps' calls each


def test_an_earlier_uforms_index_finds_an_updates_paths_in_one_scan(tmp_path: Path, ckpt: Path, model: uform.Model,
                                                                      sqlite_steps: list[int]) -> None:  # fmt: skip
    """Without the path index (an earlier uform's, until its first write) each condition of an
    update's look at its paths (Store.known: three a root, one a text key) was a scan of the table:
    a million items, 1.0 s a root, 74 s for 256 text keys. They are now asked in one scan; what
    it finds is what the path index finds."""
    with Index(tmp_path / "idx", checkpoint=ckpt, model=model) as ix:
        ix.update([Text(f"/p/{i % 7}/k{i}", f"text {i}") for i in range(2000)] + [Text("/p/t.txt:1", "a line"), Text("/p/t.txtx:1", "not it")])
    roots, keys = ["/p/3", "/p/t.txt", "/nowhere"], [f"/p/{i % 7}/k{i}" for i in range(0, 600, 2)] + ["/absent"]
    store = Store(tmp_path / "idx", write=False)
    with store.snapshot():
        indexed = store.known(roots, keys)
    store.close()
    with sqlite3.connect(tmp_path / "idx" / "index.sqlite") as conn:
        for drop in ("TRIGGER items_removed", "TABLE removed", "INDEX items_hash", "INDEX items_path"):
            conn.execute(f"DROP {drop}")
    conn.close()
    store = Store(tmp_path / "idx", write=False)
    sqlite_steps[0] = 0
    with store.snapshot():
        found = store.known(roots, keys)
    store.close()
    every = [f"/p/{i % 7}/k{i}" for i in range(2000)]
    assert found == indexed and set(found) == {p for p in every if p.startswith("/p/3/") or p in keys} | {"/p/t.txt:1"}
    assert sqlite_steps[0] < 1500, sqlite_steps  # one scan of the 2,000 items: about 600 calls; a scan a condition: 18,800
