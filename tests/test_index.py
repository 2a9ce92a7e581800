"""uform.index: the incremental index (docs/index.md), what an update embeds and records: each
item once, renames matched by hash, changes embedded again, failures recorded, texts and text
files, items by path. A tiny checkpoint and pictures made on the spot; nothing is downloaded.
Each behaviour is checked against the model's own verbs. The index's file, writers and
upgrades: tests/test_index_store.py; search and exports: tests/test_index_search.py."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

import uform
import uform.index.update as update
from uform.index import Index, Text
from index_files import Reads, ckpt, embedding, model, photos, picture, stored  # noqa: F401 (fixtures)


def test_update_embeds_once_then_reads_nothing(tmp_path: Path, ckpt: Path, model: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    root = photos(tmp_path / "photos")
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        first = ix.update([root])
        assert (first.added, len(ix)) == (6, 6)
        rows = stored(ix)
        for p in root.rglob("*.png"):
            np.testing.assert_allclose(rows[str(p)], embedding(model, p), atol=1e-6)
        reads = Reads(monkeypatch)
        again = ix.update([root])
    assert (again.added, again.unchanged, reads.paths) == (0, 6, [])


def test_rename_is_matched_by_hash_and_deletion_leaves(tmp_path: Path, ckpt: Path, model: uform.Model) -> None:
    root = photos(tmp_path / "photos")
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
        before = stored(ix)
        os.rename(root / "p0.png", root / "sub" / "renamed.png")
        (root / "p2.png").unlink()
        shutil.copy(root / "p4.png", root / "copy.png")
        result = ix.update([root])
        assert (result.moved, result.removed, result.copied, result.added) == (1, 1, 1, 0)
        after = stored(ix)
        assert str(root / "p0.png") not in after and str(root / "p2.png") not in after
        np.testing.assert_array_equal(after[str(root / "sub" / "renamed.png")], before[str(root / "p0.png")])
        np.testing.assert_array_equal(after[str(root / "copy.png")], before[str(root / "p4.png")])
        hits = ix.search_embedding(embedding(model, root / "sub" / "renamed.png"), 1)
        assert hits[0].path == str(root / "sub" / "renamed.png") and hits[0].score == pytest.approx(1.0, abs=1e-5)


def test_changed_content_is_embedded_again(tmp_path: Path, ckpt: Path, model: uform.Model) -> None:
    root = photos(tmp_path / "photos")
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
        picture(99).save(root / "p0.png")
        assert ix.update([root]).added == 1
        np.testing.assert_allclose(stored(ix)[str(root / "p0.png")], embedding(model, root / "p0.png"), atol=1e-6)


def test_file_changed_between_stat_and_read(tmp_path: Path, ckpt: Path, model: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk stats a file, then it changes before it is read: the row holds what was read
    (hash and vector of the same bytes) and the stamp of those bytes, so the next run reads nothing."""
    root = photos(tmp_path / "photos", 2)
    target = root / "p0.png"

    def rewrite(path: str) -> None:
        if path == str(target):
            picture(77, 30).save(target)

    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        Reads(monkeypatch, rewrite)
        ix.update([root])
        entry = next(e for e in ix.entries() if e.path == str(target))
        assert entry.hash == update.digest(target.read_bytes()).hex()
        assert entry.size == target.stat().st_size and entry.mtime_ns == target.stat().st_mtime_ns
        np.testing.assert_allclose(entry.embedding, embedding(model, target), atol=1e-6)
        monkeypatch.undo()
        reads = Reads(monkeypatch)
        assert ix.update([root]).unchanged == 2 and reads.paths == []


def test_file_changed_while_read_is_read_again(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = photos(tmp_path / "photos", 2)
    real = update.read
    monkeypatch.setattr(update, "read", lambda p: (lambda r: (r[0], r[1], -1) if isinstance(r, tuple) else r)(real(p)))
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
        monkeypatch.undo()
        reads = Reads(monkeypatch)
        result = ix.update([root])
        assert (len(reads.paths), result.touched, result.added) == (2, 2, 0)  # read again, same hash: not embedded
        monkeypatch.undo()
        assert ix.update([root]).unchanged == 2


def test_failed_item_is_recorded_not_retried_and_not_lost(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = photos(tmp_path / "photos", 2)
    (root / "broken.jpg").write_bytes(b"not a picture at all")
    (root / "empty.png").write_bytes(b"")
    seen: list[str] = []
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        first = ix.update([root], report=lambda f: seen.append(f.line()))
        reasons = {Path(f.value).name: f.reason for f in first.failed}
        assert reasons["empty.png"] == "the file is empty" and reasons["broken.jpg"].startswith("not a JPEG, PNG or WebP image")
        assert len(seen) == 2 and len(ix) == 2 and {Path(p).name for p, _ in ix.failures()} == {"broken.jpg", "empty.png"}
        reads = Reads(monkeypatch)
        again = ix.update([root])
        assert reads.paths == [] and {Path(f.value).name for f in again.still_failed} == {"broken.jpg", "empty.png"}
        picture(5).save(root / "broken.jpg", format="JPEG")
        third = ix.update([root])
        assert third.added == 1 and [Path(p).name for p, _ in ix.failures()] == ["empty.png"]
        (root / "p0.png").write_bytes(b"now broken")  # an indexed file that no longer decodes leaves the index
        assert [Path(f.value).name for f in ix.update([root]).failed] == ["p0.png"]
        assert str(root / "p0.png") not in stored(ix) and len(ix) == 2


def test_texts_index_the_same_way(tmp_path: Path, ckpt: Path, model: uform.Model) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("a red circle\n\nthree blue squares\n")
    lines = tmp_path / "captions.jsonl"
    deep = "[" * 100_000 + "]" * 100_000  # deeper than the interpreter's stack: a bad line, not a crash
    lines.write_text('{"text": "a green triangle"}\n"a bare string"\n{"caption": "from a caption"}\n{"nothing": 1}\n' + deep + "\n")
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        first = ix.update([notes, lines, Text("mine-1", "a text of my own")])
        assert first.added == 6 and [(f.value, f.reason) for f in first.failed][1:] == [(f"{lines}:5", "not a JSON line (nested too deeply)")]
        assert first.failed[0].value == f"{lines}:4"
        query = np.array(model.text_encode(["three blue squares"], uform.Arena()).embeddings[0])
        top = ix.search_embedding(query, 1)[0]
        assert (top.path, top.modality, top.text) == (f"{notes}:3", "text", "three blue squares")
        notes.write_text("a new first line\na red circle\n\nthree blue squares\n")
        second = ix.update([notes])
        # the lines moved down, matched by hash: line 1's row is replaced (its text copied to line 2), line 3's moved to 4
        assert (second.added, second.copied, second.moved, second.touched) == (1, 1, 1, 0)
        assert ix.counts()["text"] == 7


def test_a_text_file_s_bad_line_fails_alone_and_one_not_readable_says_why(tmp_path: Path, ckpt: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"a red circle\nnot \xff utf-8\r\nthree blue squares\r\n")
    fifo, gone = tmp_path / "fifo.txt", tmp_path / "gone.jsonl"
    os.mkfifo(fifo)
    gone.symlink_to(tmp_path / "nowhere.jsonl")
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        got = ix.update([notes, fifo, gone])
        assert [(f.kind, f.value, f.reason) for f in got.failed] == [
            ("file", str(fifo), "is not a regular file"),  # not "unknown file type '.txt'"
            ("file", str(gone), "no such file"),
            ("text", f"{notes}:2", "not UTF-8 (byte 0xff, byte 5 of the line)"),  # the line, not the whole file; as it is read
        ]
        assert sorted((e.path, e.text) for e in ix.entries()) == [(f"{notes}:1", "a red circle"), (f"{notes}:3", "three blue squares")]
        again = ix.update([notes])
        assert (again.added, again.unchanged) == (0, 2) and [f.value for f in again.still_failed] == [f"{notes}:2"]


def test_a_file_and_a_text_file_that_cannot_be_read_say_why_in_the_same_words(tmp_path: Path, ckpt: Path) -> None:
    """A file's read and a text file's look before it (update.py's stat, sources.py's opens and
    reads) each wrote 'no such file' or 'cannot read the file (REASON)' themselves: they say it
    through sources.unreadable now, in one wording. (A media file named but gone is found so by
    encode's walker first, in its words.)"""
    loops = [tmp_path / "loop.png", tmp_path / "loop.txt"]
    for link in loops:
        link.symlink_to(link)  # a link to itself: ELOOP when it is opened or looked at
    gone = [tmp_path / "gone.png", tmp_path / "gone.txt"]
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        got = ix.update([*loops, *gone])
    assert sorted((f.value, f.reason) for f in got.failed) == sorted(
        [(str(p), "cannot read the file (Too many levels of symbolic links)") for p in loops]
        + [(str(gone[0]), "no such file or folder"), (str(gone[1]), "no such file")]
    )


def test_items_are_found_by_path_through_an_index_of_paths(tmp_path: Path, ckpt: Path) -> None:
    """Each insert, move and removal looks its path up: without an index on ``items.path`` that
    was a scan of the table, so a run grew quadratic (40,000 texts took 110 s; now 4.7 s). The first
    write gives an index made before this its path index; a compaction keeps it."""
    db = tmp_path / "idx" / "index.sqlite"

    def plan() -> str:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            step = str(conn.execute("EXPLAIN QUERY PLAN DELETE FROM items WHERE path = ?", ("k",)).fetchall()[-1][-1])
            return step.replace("COVERING INDEX", "INDEX")  # covering once the trigger of removed slots reads only the slot

    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([Text(f"/k{i}", f"text {i}") for i in range(8)])
    assert plan() == "SEARCH items USING INDEX items_path (path=?)"
    conn = sqlite3.connect(db)
    conn.execute("DROP INDEX items_path")  # as an index made before it
    conn.close()
    assert plan() == "SCAN items"
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        assert plan() == "SCAN items"  # opened, nothing written yet
        assert ix.remove(["/k0"]) == 1 and plan() == "SEARCH items USING INDEX items_path (path=?)"  # its first write added it
        assert ix.remove(["/k1", "/k2", "/k3", "/k4"]) == 4 and ix.compact() == 5
        assert [e.path for e in ix.entries()] == ["/k5", "/k6", "/k7"]
    assert (tmp_path / "idx" / "vectors-1.bin").exists() and plan() == "SEARCH items USING INDEX items_path (path=?)"


def test_a_text_file_is_read_a_chunk_at_a_time(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .txt/.jsonl file was read whole, every line held in memory, before the first chunk was
    committed (a file of gigabytes took as much memory again); its lines now go in as they are
    read: the first chunk is committed before a bad line past it is reached, and its keys alone
    are gathered first."""
    monkeypatch.setattr(update, "CHUNK", 4)
    notes = tmp_path / "notes.jsonl"
    notes.write_bytes(b"".join(b'{"text": "line %d"}\n' % i for i in range(1, 7)) + b"\n{not json\n" + b'"line 9"\n')
    events: list[object] = []
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        got = ix.update([notes], progress=lambda done, total: events.append((done, total)), report=lambda f: events.append(f.value))
        assert events == [(4, 8), f"{notes}:8", (8, 8)] and (got.added, len(got.failed)) == (7, 1)
        assert sorted(e.path for e in ix.entries()) == sorted(f"{notes}:{n}" for n in (1, 2, 3, 4, 5, 6, 9))
        notes.write_bytes(notes.read_bytes().replace(b"line 3", b"line three"))  # one line changed: the rest read again, not embedded
        again = ix.update([notes])
        assert (again.added, again.touched, [f.value for f in again.failed]) == (1, 6, [f"{notes}:8"])


def test_a_text_item_is_removed_by_its_key(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """remove(["note-1"]) of Text("note-1", ...) removed nothing (the key was made a path under the
    current folder), so such an item could not be removed at all; a file of that name's items stay."""
    monkeypatch.chdir(tmp_path)
    photos(tmp_path / "note-2", 1)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([Text("note-1", "a red circle"), Text("note-2", "blue squares"), "note-2"])
        assert ix.remove(["note-1"]) == 1 and sorted(e.path for e in ix.entries()) == sorted(["note-2", str(tmp_path / "note-2" / "p0.png")])
        assert ix.remove(["note-2"]) == 2 and len(ix) == 0


def test_content_met_twice_in_one_chunk_is_encoded_once(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new path whose content another new path of the same chunk holds was encoded again (its
    copy is found only once that row is committed): 3 copies of a picture, another picture and 2
    copies of a text in a first run embedded 6 where 3 are new content. Now the chunk's first path is encoded and the
    others copy its row; where that path is refused (here: a recording, for a model with no audio
    tower, named by the caller), each is tried as its own and fails with its own reason."""
    import wave

    encoded: list[int] = []
    real = getattr(update.Updater, "_encode", None)
    monkeypatch.setattr(update.Updater, "_encode", lambda self, todo, pending: (encoded.append(len(todo)), real(self, todo, pending))[1], raising=False)
    root = tmp_path / "photos"
    root.mkdir()
    for name in ("a.png", "b.png", "c.png"):
        picture(1).save(root / name)
    picture(2).save(root / "d.png")
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        got = ix.update([root, Text("/t1", "a red circle"), Text("/t2", "a red circle")])
        assert (got.added, got.copied, len(ix)) == (3, 3, 6) and sum(encoded) == 3
        rows = stored(ix)
        for a, b in ((f"{root}/a.png", f"{root}/b.png"), (f"{root}/a.png", f"{root}/c.png"), ("/t1", "/t2")):
            np.testing.assert_array_equal(rows[a], rows[b])
        for name in ("x.wav", "y.wav"):
            with wave.open(str(tmp_path / name), "wb") as w:
                w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(b"\x00\x01" * 16000)
        got = ix.update([tmp_path / "x.wav", tmp_path / "y.wav"])
        assert (got.added, got.copied, sorted(os.path.basename(f.value) for f in got.failed)) == (0, 0, ["x.wav", "y.wav"])
        assert got.failed[0].reason == got.failed[1].reason and len(ix) == 6
