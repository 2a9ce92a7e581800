"""An index never loses a user's file and names the damage it finds (issue 57): it deletes only
files it recorded as its own, is made only in a new or empty folder apart from what it indexes,
and a damaged index raises ``IndexFormatError`` naming the file, without writing to it."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from index_files import ckpt  # noqa: F401 (the fixture)
from uform.cli import main
from uform.index import Index, IndexFormatError, Text


def photos(root: Path, count: int = 4, start: int = 0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(root / f"p{i}.png")
    return root


def contents(folder: Path) -> dict[str, bytes]:
    """The folder's files (SQLite's own -wal and -shm aside: a connection's close empties them into the database)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.name.endswith(("-wal", "-shm"))}


def edit(index: Path, statement: str) -> None:
    c = sqlite3.connect(index / "index.sqlite")
    with c:
        c.execute(statement)
    c.close()


def test_an_index_is_never_made_in_a_folder_of_other_files(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """D1: ``uform index m4 --into m4`` deleted ivf-scan.png and firmware-v2.bin."""
    m4 = photos(tmp_path / "m4", 2)
    (m4 / "ivf-scan.png").write_bytes((m4 / "p0.png").read_bytes())
    (m4 / "firmware-v2.bin").write_bytes(b"x\n")
    before = contents(m4)
    assert main(["index", str(m4), "--into", str(m4), "-m", str(ckpt)]) == 2
    assert "is the index" in capsys.readouterr().err
    other = photos(tmp_path / "in", 2)
    assert main(["index", str(other), "--into", str(m4), "-m", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert f"{m4}: not a uform index, and not empty (it holds 'firmware-v2.bin', 'ivf-scan.png', 'p0.png' and 1 more)" in err
    with pytest.raises(IndexFormatError, match="not empty"):
        Index(m4, checkpoint=ckpt)
    assert contents(m4) == before  # not a byte written, not a file added or lost
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix, pytest.raises(ValueError, match="is the index .* or inside it"):
        ix.update([tmp_path / "idx" / "sub"])
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "index.sqlite.new").write_bytes(b"a file of the user's, by chance of that name")
    with pytest.raises(IndexFormatError, match=r"not empty \(it holds 'index.sqlite.new'\)"):
        Index(tmp_path / "theirs", checkpoint=ckpt)
    (tmp_path / "cut").mkdir()  # what a creation killed before its rename leaves: taken over
    (tmp_path / "cut" / "index.sqlite.new").write_bytes(b"")
    (tmp_path / "cut" / "lock").write_bytes(b"")
    with Index(tmp_path / "cut", checkpoint=ckpt) as ix:
        assert len(ix) == 0 and "index.sqlite.new" not in {p.name for p in (tmp_path / "cut").iterdir()}


def test_a_creation_stopped_before_its_rename_is_made_again(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A creation stopped after its database was whole but before the rename left
    index.sqlite.new with the index's tables and its path index: the check that the file is the
    index's own took the path index's name (sqlite_master names indexes too) for another's, and
    the folder was refused for ever ("not empty (it holds 'index.sqlite.new')"). Every name the
    schema makes is now the index's own: the next run makes the index."""
    import uform.index.store as store

    def stopped(src: Path, dst: Path) -> None:
        raise KeyboardInterrupt  # as a kill between the commit and the rename

    monkeypatch.setattr(store, "move", stopped)
    with pytest.raises(KeyboardInterrupt):
        Index(tmp_path / "idx", checkpoint=ckpt)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == ["index.sqlite.new", "lock"]
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([Text("/k", "a text")])
        assert [e.path for e in ix.entries()] == ["/k"]


def test_a_writer_deletes_only_the_files_it_recorded(tmp_path: Path, ckpt: Path) -> None:
    root = photos(tmp_path / "photos", 4)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root], compact=False)
        ix.remove([root / "p0.png"])
        ix.compact()  # generation 1; meta.next records it
    mine = {"vectors-7.bin": b"mine", "ivf-scan.png": b"png", "kinds-x.bin": b"k", "ivf-0.npz-notes": b"n", "vectors-0.bin.bak": b"b"}
    for name, data in mine.items():
        (tmp_path / "idx" / name).write_bytes(data)
    (tmp_path / "idx" / "vectors-0.bin").write_bytes(b"a compaction's old generation, left by a kill")
    (tmp_path / "idx" / ".ivf-0.npz.0badc0de.partial").write_bytes(b"its lists, half written (core.files' temporary)")
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        assert len(ix) == 3
    left = contents(tmp_path / "idx")
    assert "vectors-0.bin" not in left and all(left[n] == d for n, d in mine.items())
    assert not [p for p in (tmp_path / "idx").iterdir() if p.name.endswith(".partial")]


def test_lowered_slots_are_named_not_cut(tmp_path: Path, ckpt: Path) -> None:
    """D8: meta.slots below the slots items use: the vectors file was cut (rows lost), then IndexError."""
    root = photos(tmp_path / "photos", 4)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
    edit(tmp_path / "idx", "UPDATE meta SET value = '1' WHERE key = 'slots'")
    before = contents(tmp_path / "idx")
    for read_only in (False, True):
        with pytest.raises(IndexFormatError, match=r"idx: the index is damaged: index.sqlite.s items use slots 0-3, outside the 1 rows meta.slots says"):
            with Index(tmp_path / "idx", checkpoint=ckpt, read_only=read_only) as ix:
                ix.search_embedding(np.ones(32, np.float32), 1)
    assert contents(tmp_path / "idx") == before


def test_the_slot_check_does_not_read_every_item(tmp_path: Path, ckpt: Path) -> None:
    """Store.state refuses items that point past meta.slots. Its SELECT max(slot), min(slot) read
    every item (one query with two aggregates is not optimised): the first search after opening
    or after a commit paid 0.2 s at a million items. ``slot`` is the rowid, so the least and the
    greatest are each one B-tree descent: checked on every call, in a bounded number of SQLite's
    steps whatever the items, and damage after a commit is still refused by name."""
    from uform.index.identity import Identity
    from uform.index.records import Chunk, Insert
    from uform.index.store import Store

    n = 20_000
    rows = np.zeros((n, 8), np.float32)
    rows[:, 0] = 1
    writer = Store(tmp_path / "idx", write=True, identity=Identity("0" * 64, "m", "bf16", 8, "f32"))
    writer.commit(Chunk(rows, [Insert(f"/p/{i}", 1, 1, i.to_bytes(16, "big"), None, 1) for i in range(n)], new_paths=True))
    writer.close()
    store = Store(tmp_path / "idx", write=False)
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    assert store.conn is not None
    store.conn.set_progress_handler(step, 100)  # called every 100 SQLite virtual-machine steps
    try:
        assert [store.state() for _ in range(3)] == [(0, n)] * 3
        assert steps[0] < 10, steps  # a read of every item is over 200 calls here (20,000 items)
        edit(tmp_path / "idx", "UPDATE items SET slot = 20007 WHERE slot = 0")
        with pytest.raises(IndexFormatError, match=r"items use slots 1-20007, outside the 20000 rows meta.slots says"):
            store.state()
    finally:
        store.close()


def test_an_empty_or_missing_file_is_named_and_left_as_it_is(tmp_path: Path, ckpt: Path) -> None:
    """D4: an emptied index.sqlite ended in an AssertionError and was rewritten; D5: a missing
    vectors file was made again, empty, and a search said the index kept changing generation."""
    root = photos(tmp_path / "photos", 3)
    for name in ("empty", "novectors", "nokinds", "shortkinds"):
        with Index(tmp_path / name, checkpoint=ckpt) as ix:
            ix.update([root])
    (tmp_path / "empty" / "index.sqlite").write_bytes(b"")
    (tmp_path / "novectors" / "vectors-0.bin").unlink()
    (tmp_path / "nokinds" / "kinds-0.bin").unlink()
    with open(tmp_path / "shortkinds" / "kinds-0.bin", "r+b") as f:  # D6: was reported as "the vectors are shorter"
        f.truncate(2)
    for name, why in (("empty", "index.sqlite is empty"), ("novectors", "vectors-0.bin is missing"), ("nokinds", "kinds-0.bin is missing"),
                      ("shortkinds", "kinds-0.bin holds 2 rows, the database says 3")):  # fmt: skip
        before = contents(tmp_path / name)
        for read_only in (False, True):
            with pytest.raises(IndexFormatError, match=f"{name}: the index is damaged: {why}"):
                with Index(tmp_path / name, checkpoint=ckpt, read_only=read_only) as ix:
                    ix.search_embedding(np.ones(32, np.float32), 1)
        assert contents(tmp_path / name) == before


STORE = {"store.py", "schema.py", "database.py", "reading.py"}  # the store: its rule and writes, tables, connection, reads


def test_every_sql_statement_of_the_index_is_the_stores() -> None:
    """Issue 56: the store owns every statement and the commit rule; no other module of
    uform/index calls execute/executemany/executescript or holds SQL text."""
    import ast
    import re

    sql = re.compile(r"\b(SELECT\b.*\bFROM|INSERT (OR \w+ )?INTO|UPDATE \w+ SET|DELETE FROM|CREATE (TEMP )?TABLE|DROP TABLE|ALTER TABLE|PRAGMA|BEGIN|COMMIT|ROLLBACK)\b")
    folder = Path(__file__).parents[1] / "uform" / "index"
    offences = []
    for path in sorted(folder.glob("*.py")):
        if path.name in STORE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in {"execute", "executemany", "executescript"}:
                offences.append(f"{path.name}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and sql.search(node.value):
                offences.append(f"{path.name}:{node.lineno}: {node.value[:40]!r}")
    assert offences == []


def test_a_new_an_upgraded_and_a_compacted_database_hold_the_same_schema(tmp_path: Path, ckpt: Path) -> None:
    """schema.py makes each table, index and trigger in one place: a new database, one an
    earlier uform wrote (without the hash index and the removed slots' table and trigger) once
    its next write upgraded it, and one a compaction rewrote (items made again) hold the same
    objects by the same statements, and those are the names a creation's leftover may hold."""
    from uform.index.schema import OWN_NAMES

    def objects(index: Path) -> set[tuple[str, str, str]]:
        with sqlite3.connect(f"file:{index / 'index.sqlite'}?mode=ro", uri=True) as conn:
            query = "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL"
            found = {(t, n, " ".join(q.replace('"', "").split())) for t, n, q in conn.execute(query)}  # ALTER TABLE RENAME quotes the name
        conn.close()
        return found

    with Index(tmp_path / "new", checkpoint=ckpt) as ix:
        ix.update([Text("/a", "a text"), Text("/b", "b text")])
    made = objects(tmp_path / "new")
    assert {n for _, n, _ in made} == OWN_NAMES
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    for statement in ("DROP TRIGGER items_removed", "DROP TABLE removed", "DROP INDEX items_hash", "DROP INDEX items_path"):
        edit(tmp_path / "old", statement)
    with Index(tmp_path / "old", checkpoint=ckpt) as ix:
        assert len(ix) == 2 and ix.update([Text("/c", "c text")]).added == 1 and ix.remove(["/c"]) == 1  # upgraded by its first write
    assert objects(tmp_path / "old") == made
    with Index(tmp_path / "new", checkpoint=ckpt) as ix:
        assert ix.remove(["/a"]) == 1 and ix.compact() == 1
    assert objects(tmp_path / "new") == made


def test_every_page_and_byte_garbled_in_turn(tmp_path: Path, ckpt: Path) -> None:
    """Each page of index.sqlite garbled in turn (random bytes), each kind byte and each vector
    byte flipped in turn: opening, reading, searching and updating either work (every undamaged
    item still found by its own vector) or raise IndexFormatError naming the file, never another
    error; a refused writer leaves every file as it was."""
    root = photos(tmp_path / "photos", 4)
    (tmp_path / "notes.txt").write_text("a red circle\nblue squares\n")
    pristine = tmp_path / "pristine"
    with Index(pristine, checkpoint=ckpt) as ix:
        ix.update([root, tmp_path / "notes.txt"])
        own = {e.path: np.asarray(e.embedding, np.float32) for e in ix.entries()}
    rng = np.random.default_rng(0)
    names = ("index.sqlite", "vectors-0.bin", "kinds-0.bin")
    size = (pristine / "index.sqlite").stat().st_size
    cases = [("index.sqlite", page * 4096, 4096) for page in range(size // 4096)] + [("kinds-0.bin", at, 1) for at in range(len(own))]
    outcomes: dict[tuple[str, int], list[str]] = {}

    def refused(exc: IndexFormatError, name: str, at: int, named: str = "") -> None:
        assert "the index is damaged" in str(exc) and (named or name) in str(exc), (name, at, str(exc))
        outcomes[name, at].append("refused")

    def read(ix: Index, damaged: int | None) -> None:
        len(ix), ix.failures(), list(ix.entries())
        for slot, (path, vector) in enumerate(own.items()):  # a changed row still of unit length may outrank one: in the first 2
            hits = ix.search_embedding(vector, 2)
            assert slot == damaged or path in [h.path for h in hits], (damaged, path, hits)

    for name, at, length in cases:
        case = tmp_path / "case"
        shutil.rmtree(case, ignore_errors=True)
        shutil.copytree(pristine, case)
        with open(case / name, "r+b") as f:
            f.seek(at)
            old = f.read(length)
            f.seek(at)
            f.write(rng.integers(0, 256, length, dtype=np.uint8).tobytes() if length > 1 else bytes([old[0] ^ 0xFF]))
        outcomes[name, at] = []
        try:
            with Index(case, checkpoint=ckpt, read_only=True) as ix:
                read(ix, None)
            outcomes[name, at].append("read")
        except IndexFormatError as exc:
            refused(exc, name, at)
        before = {n: (case / n).read_bytes() for n in names}
        try:
            with Index(case, checkpoint=ckpt) as ix:
                ix.update([root, tmp_path / "notes.txt"], compact=False)
            outcomes[name, at].append("updated")
        except IndexFormatError as exc:
            refused(exc, name, at)
            assert {n: (case / n).read_bytes() for n in names} == before, (name, at)
    # the writer looks at every page (quick_check) and kind byte before it writes: each such garble is refused
    assert all(outcomes[c[:2]][-1] == "refused" for c in cases), outcomes
    # a vector row is not read by a writer (that would cost a re-run the whole file): the search or read that meets it names it.
    # Every byte flipped in turn under one reader (its mapping sees the file as it is now), then flipped back.
    width = 128
    with Index(pristine, checkpoint=ckpt, read_only=True) as ix, open(pristine / "vectors-0.bin", "r+b") as f:
        for at in range(len(own) * width):
            f.seek(at)
            old = f.read(1)
            f.seek(at)
            f.write(bytes([old[0] ^ 0xFF]))
            f.flush()
            outcomes["vectors-0.bin", at] = []
            try:
                read(ix, at // width)
                outcomes["vectors-0.bin", at].append("read")
            except IndexFormatError as exc:
                refused(exc, "vectors-0.bin", at, f"vectors-0.bin: the row of slot {at // width}")
            f.seek(at)
            f.write(old)
            f.flush()
        read(ix, None)  # whole again
    flips = [outcomes["vectors-0.bin", at][0] for at in range(len(own) * width)]
    assert flips.count("refused") > len(flips) // 4, flips.count("refused")  # an exponent byte's flip is never a unit vector


def test_a_name_that_is_not_utf8_is_one_failed_item(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """D2: ``bad-\\xff\\xfe.png`` made the whole run exit 2 naming no file, its chunk rolled back, every re-run alike."""
    root = photos(tmp_path / "in", 3)
    bad = os.fsencode(root) + b"/bad-\xff\xfe.png"
    with open(bad, "wb") as f:
        f.write((root / "p0.png").read_bytes())
    index = ["--into", str(tmp_path / "X"), "-m", str(ckpt)]
    assert main(["index", str(root), *index]) == 1
    out, err = capsys.readouterr()
    assert f"uform: failed: file {root}/bad-\\xff\\xfe.png: its name is not valid UTF-8" in err and "3 embedded" in out and "1 failed" in out
    assert main(["index", str(root), *index]) == 1
    out, err = capsys.readouterr()
    assert "(unchanged since it failed; not tried again)" in err and "3 unchanged" in out and "1 failed before" in out
    with Index(tmp_path / "X", checkpoint=ckpt, read_only=True) as ix:
        assert len(ix) == 3 and ix.failures() == [(f"{root}/bad-\\xff\\xfe.png", "its name is not valid UTF-8, and an index stores names as "
                                                   "UTF-8: rename it to index it")]  # fmt: skip
    os.unlink(bad)  # gone: its record leaves with it
    assert main(["index", str(root), *index]) == 0
    capsys.readouterr()
    with Index(tmp_path / "Y", checkpoint=ckpt) as ix:
        result = ix.update([Text("k\udcff", "a text"), Text("fine", "a lone \ud800 surrogate"), Text("ok", "a text")])
        assert [f.value for f in result.failed] == ["k\udcff", "fine"] and len(ix) == 1


def test_bad_lines_of_an_unchanged_text_file_are_reported_again(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """D13: a bad .jsonl line was reported once; the unchanged re-run said 0 failed before and exited 0."""
    lines = tmp_path / "c.jsonl"
    lines.write_text('{"text": "a red circle"}\n{"nope": 1}\n"\\ud800"\n"blue"\n')
    index = ["--into", str(tmp_path / "X"), "-m", str(ckpt)]
    assert main(["index", str(lines), *index]) == 1
    assert "2 embedded" in capsys.readouterr().out
    assert main(["index", str(lines), *index]) == 1
    out, err = capsys.readouterr()
    assert "2 unchanged" in out and "2 failed before" in out and f"{lines}:2" in err and f"{lines}:3" in err
    lines.write_text('{"text": "a red circle"}\n"fixed"\n')  # changed: read again; its fixed lines leave the failures
    assert main(["index", str(lines), *index]) == 0
    with Index(tmp_path / "X", checkpoint=ckpt, read_only=True) as ix:
        assert ix.failures() == [] and len(ix) == 2


def test_a_garbled_kind_byte_or_nan_row_is_named_by_search_and_export(tmp_path: Path, ckpt: Path) -> None:
    """D7: a kind byte of 0xC8 left its item out of searches silently and ended an export in an
    IndexError with a 0-row file left; a row of NaN bytes was dropped from results silently."""
    pytest.importorskip("pyarrow")
    root = photos(tmp_path / "photos", 3)
    for name in ("kind", "nan"):
        with Index(tmp_path / name, checkpoint=ckpt) as ix:
            ix.update([root])
    with open(tmp_path / "kind" / "kinds-0.bin", "r+b") as f:
        f.seek(1)
        f.write(b"\xc8")
    with open(tmp_path / "nan" / "vectors-0.bin", "r+b") as f:
        f.seek(128 * 2)
        f.write(b"\xff" * 128)
    for name, why in (("kind", "kinds-0.bin holds 200 at slot 1, which is no modality"), ("nan", "vectors-0.bin: the row of slot 2 .*is not a unit vector")):
        with Index(tmp_path / name, checkpoint=ckpt, read_only=True) as ix:
            with pytest.raises(IndexFormatError, match=f"{name}: the index is damaged: {why}"):
                ix.search_embedding(np.ones(32, np.float32), 3)
            with pytest.raises(IndexFormatError, match=f"{name}: the index is damaged: {why}"):
                ix.export_parquet(tmp_path / f"{name}.parquet")
        assert sorted(p.name for p in tmp_path.iterdir() if "parquet" in p.name) == []  # no file left, whole or partial


def test_hostile_or_ordinary_parquet(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """D9-D12: what pandas and Spark write (list<float>) imports; a missing column, a null, a
    wrong width, NaN / inf / zero / 1e30 rows, bad hashes, an int path column, a path twice, a
    missing file: each refused naming file, row and column, before anything is added."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    root = photos(tmp_path / "photos", 3)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
        ix.export_parquet(tmp_path / "good.parquet")
    good = pq.read_table(tmp_path / "good.parquet")
    plain = good.set_column(5, "embedding", pa.array(good.column("embedding").to_pylist(), pa.list_(pa.float32())))
    pq.write_table(plain, tmp_path / "plain.parquet")  # list<float>, as pandas writes it

    def bad(name: str, table: Any) -> Path:
        pq.write_table(table, tmp_path / f"{name}.parquet")
        return tmp_path / f"{name}.parquet"

    rows = good.column("embedding").to_pylist()

    def with_row(value: Any, at: int = 1) -> Any:
        changed = [*rows[:at], value, *rows[at + 1 :]]
        return good.set_column(5, "embedding", pa.array(changed, pa.list_(pa.float32())))

    hashes = good.column("hash").to_pylist()
    cases = {
        "missing": (good.drop_columns(["hash"]), "no column 'hash'"),
        "nullpath": (good.set_column(0, "path", pa.array([None, *good.column("path").to_pylist()[1:]], pa.string())), "row 0: path is null"),
        "nullemb": (with_row(None), "row 1: embedding is null"),
        "narrow": (with_row([0.25] * 16), "row 1: embedding has 16 values; the index's rows have 32"),
        "nan": (with_row([float("nan")] * 32), "row 1: embedding is not finite"),
        "inf": (with_row([float("inf")] + [0.0] * 31), "row 1: embedding is not finite"),
        "zero": (with_row([0.0] * 32), r"row 1: embedding is not a unit vector \(norm 0\)"),
        "huge": (with_row([x * 1e30 for x in rows[1]]), r"row 1: embedding is not a unit vector \(norm 1e\+30\)"),
        "hash1": (good.set_column(2, "hash", pa.array(["ab", *hashes[1:]])), "row 0: hash 'ab' is not 32 hexadecimal digits"),
        "hashx": (good.set_column(2, "hash", pa.array([hashes[0], "zz" * 16, hashes[2]])), "row 1: hash 'zz"),
        "intpath": (good.set_column(0, "path", pa.array([1, 2, 3], pa.int64())), "column 'path' holds int64, not strings"),
        "twice": (pa.concat_tables([good, good.slice(1, 1)]), "row 3: path '.*p1.png' again \\(first at .*twice.parquet row 1\\)"),
        "modality": (good.set_column(1, "modality", pa.array(["image", "picture", "image"])), "row 1: modality 'picture' is none of"),
    }
    for name, (table, why) in cases.items():
        path = bad(name, table)
        with Index(tmp_path / f"into-{name}", checkpoint=ckpt) as ix:
            with pytest.raises(ValueError, match=f"{path}: {why}"):
                ix.import_parquet(path)
            assert len(ix) == 0, name
    folder = tmp_path / "mixed"
    folder.mkdir()
    pq.write_table(good, folder / "a.parquet")
    pq.write_table(cases["nan"][0], folder / "b.parquet")
    assert main(["index", "--into", str(tmp_path / "m"), "--import-parquet", str(folder), "-m", str(ckpt)]) == 2
    assert f"uform: error: {folder}/b.parquet: row 1: embedding is not finite" in capsys.readouterr().err
    with Index(tmp_path / "m", checkpoint=ckpt, read_only=True) as ix:
        assert len(ix) == 0  # the good file's rows were not added either
    assert main(["index", "--into", str(tmp_path / "m"), "--import-parquet", str(tmp_path / "nowhere.parquet"), "-m", str(ckpt)]) == 2
    assert f"{tmp_path}/nowhere.parquet: no such file or folder" in capsys.readouterr().err
    with Index(tmp_path / "plain-into", checkpoint=ckpt) as ix:
        assert ix.import_parquet(tmp_path / "plain.parquet") == 3
        assert {e.path for e in ix.entries()} == set(good.column("path").to_pylist())


def test_an_index_folder_of_any_name_reads(tmp_path: Path, ckpt: Path) -> None:
    """A reader opens the database by URI: a folder named with ?, #, % or a byte that is not UTF-8 is itself."""
    root = photos(tmp_path / "photos", 2)
    folder = os.fsdecode(os.fsencode(tmp_path) + b"/odd?#%20\xff")
    with Index(folder, checkpoint=ckpt) as ix:
        ix.update([root])
    with Index(folder, checkpoint=ckpt, read_only=True) as ix:
        assert len(ix) == 2


def test_the_commands_on_a_garbled_page_say_one_line(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """D3: ``dd ... seek=3 count=1`` into index.sqlite: ``sqlite3.DatabaseError`` tracebacks, exit 1, for search and index."""
    root = photos(tmp_path / "photos", 3)
    index = ["--into", str(tmp_path / "I"), "-m", str(ckpt)]
    assert main(["index", str(root), *index]) == 0
    with open(tmp_path / "I" / "index.sqlite", "r+b") as f:
        f.seek(4096 * 3)
        f.write(np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    before = contents(tmp_path / "I")
    capsys.readouterr()
    assert main(["index", str(root), *index]) == 2
    assert main(["search", "x", "--index", str(tmp_path / "I"), "-m", str(ckpt)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith(f"uform: error: {tmp_path}/I: the index is damaged: index.sqlite ") for line in err), err
    assert contents(tmp_path / "I") == before
