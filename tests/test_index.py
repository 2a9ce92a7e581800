"""uform.index: the incremental index (docs/index.md). A tiny checkpoint and pictures made on the
spot; nothing is downloaded. Each behaviour is checked against the model's own verbs."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import uform
import uform.index.update as update
from ckpt import make_checkpoint
from uform.index import Index, IndexBusyError, IndexFormatError, IndexModelError, Text
from uform.index.store import Store


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.safetensors", "tiny", 0, ["text", "image"])


@pytest.fixture(scope="module")
def other_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "other.safetensors", "tiny", 1, ["text", "image"])


@pytest.fixture(scope="module")
def model(ckpt: Path) -> Iterator[uform.Model]:
    with uform.Model.load_ram(ckpt) as m:
        yield m


def picture(seed: int, size: int = 24) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))


def photos(root: Path, count: int = 6, start: int = 0) -> Path:
    (root / "sub").mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        picture(i).save(root / ("sub" if i % 2 else "") / f"p{i}.png")
    return root


def embedding(model: uform.Model, path: Path) -> np.ndarray:
    return np.array(model.image_encode([str(path)], uform.Arena()).embeddings[0])


def stored(index: Index) -> dict[str, np.ndarray]:
    return {e.path: e.embedding for e in index.entries()}


class Reads:
    """Counts the files an update opens (``uform.index.update.read``), optionally acting first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, before: Any = None) -> None:
        self.paths: list[str] = []
        real = update.read

        def read(path: str) -> Any:
            self.paths.append(path)
            if before is not None:
                before(path)
            return real(path)

        monkeypatch.setattr(update, "read", read)


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


def test_remove_and_compact(tmp_path: Path, ckpt: Path, model: uform.Model) -> None:
    root = photos(tmp_path / "photos", 6)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root], compact=False)
        assert ix.remove([root / "sub"]) == 3 and len(ix) == 3
        kept = stored(ix)
        assert ix.compact() == 3 and stored(ix).keys() == kept.keys()
        assert sorted(p.name for p in (tmp_path / "idx").glob("*.bin")) == ["kinds-1.bin", "vectors-1.bin"]
        for path, row in stored(ix).items():
            np.testing.assert_array_equal(row, kept[path])
        hits = ix.search_embedding(embedding(model, root / "p0.png"), 1)
        assert hits[0].path == str(root / "p0.png")


@pytest.mark.parametrize("scalar", ["f16", "bf16", "i8", "b1"])
def test_every_scalar_searches(tmp_path: Path, ckpt: Path, model: uform.Model, scalar: str) -> None:
    root = photos(tmp_path / "photos", 4)
    with Index(tmp_path / "idx", checkpoint=ckpt, outputs_scalar=scalar) as ix:
        ix.update([root])
        assert ix.search_embedding(embedding(model, root / "p2.png"), 1)[0].path == str(root / "p2.png")


def test_ivf_agrees_with_exact_and_finds_rows_added_after_it(tmp_path: Path, ckpt: Path, model: uform.Model) -> None:
    root = photos(tmp_path / "photos", 40)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
        assert ix.build_ivf(force=True)
        query = embedding(model, root / "p4.png")
        assert ix.search_embedding(query, 5, nprobe=16) == ix.search_embedding(query, 5, exact=True)
        picture(500).save(root / "late.png")
        ix.update([root])  # below MIN_ROWS the lists are not extended: the new row is past them, searched exactly
        late = ix.search_embedding(embedding(model, root / "late.png"), 1, nprobe=1)
        assert late[0].path == str(root / "late.png")


def test_parquet_export_and_import(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    root = photos(tmp_path / "photos", 3)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root, Text("t1", "a red circle")])
        assert ix.export_parquet(tmp_path / "out.parquet") == 4
        rows = stored(ix)
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["path", "modality", "hash", "model", "quantization", "embedding", "text"]
    assert str(table.schema.field("embedding").type) == "fixed_size_list<element: float>[32]"
    first = table.slice(0, 1).to_pylist()[0]
    assert first["model"] == ix.identity.checkpoint_sha256 and len(first["hash"]) == 32
    with Index(tmp_path / "copy", checkpoint=ckpt) as copy:
        assert copy.import_parquet(tmp_path / "out.parquet") == 4
        for path, row in stored(copy).items():
            np.testing.assert_array_equal(row, rows[path])
        reads = Reads(monkeypatch)
        result = copy.update([root])  # imported rows carry no stamp: read and hashed once, not embedded
        assert (result.touched, result.added, len(reads.paths)) == (3, 0, 3)


def test_an_index_built_by_ray_opens_here(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``uform.ray``'s rows (its Encoder's output through the batch ``index_rows`` maps) are the
    export's schema: imported, they are the rows this machine's update would have made."""
    pytest.importorskip("ray.data")
    pq = pytest.importorskip("pyarrow.parquet")
    from uform.index.parquet import ray_batch
    from uform.ray import Encoder

    root = photos(tmp_path / "photos", 3)
    paths = np.array([str(p) for p in sorted(root.rglob("*.png"))] + [str(root / "missing.png")], dtype=object)
    encoder = Encoder(str(ckpt), "image", "path", threads=1)
    try:
        out = encoder({"path": paths})
    finally:
        encoder.close()
    with Index(tmp_path / "mine", checkpoint=ckpt) as mine:
        mine.update([root])
        sha = mine.identity.checkpoint_sha256
        rows = stored(mine)
    table = ray_batch(out, path_column="path", column="path", modality="image", model=sha, quantization="bf16",
                      output_column="embedding", error_column="error")  # fmt: skip
    assert table.num_rows == 3  # the missing file's row carries an error: left out
    pq.write_table(table, tmp_path / "ray.parquet")
    with Index(tmp_path / "theirs", checkpoint=ckpt) as theirs:
        assert theirs.import_parquet(tmp_path / "ray.parquet") == 3
        for path, row in stored(theirs).items():
            np.testing.assert_allclose(row, rows[path], atol=1e-6)
        assert theirs.update([root]).added == 0
    with Index(tmp_path / "other", checkpoint=ckpt, quantization="e4m3") as other, pytest.raises(IndexModelError, match="bf16 weights"):
        other.import_parquet(tmp_path / "ray.parquet")


def test_an_index_opened_without_a_quantization_uses_its_own(tmp_path: Path, ckpt: Path) -> None:
    root = photos(tmp_path / "photos", 2)
    with Index(tmp_path / "idx", checkpoint=ckpt, quantization="e4m3") as ix:
        ix.update([root])
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        assert ix.quantization == "e4m3" and ix.model.describe().quantization is uform.Scalar.E4M3
        assert ix.search_file(root / "p0.png", 1)[0].path == str(root / "p0.png")


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


class _NoBlas(np.ndarray):
    """Rows that count the BLAS products (``@``) taken of them."""

    products = 0

    def __matmul__(self, other: Any) -> Any:
        type(self).products += 1
        return np.asarray(self) @ other


@pytest.mark.parametrize("scalar", ["f32", "f16", "i8"])
def test_probed_lists_are_scored_without_blas(scalar: str) -> None:
    """A clustered search scored each probed list (about 1,000 rows; 62 of them a query at a
    million rows) by a threaded BLAS product, which wakes its threads each call: 68-84 CPU ms
    and 134-170 ms a search on two busy cores. Blocks under scoring.BLOCK rows are now scored by
    numpy's own loop (11-14 CPU ms, 13-29 ms), the hits the same as an exact search's."""
    from uform.core.types import Scalar
    from uform.index import scoring
    from uform.index.update import store_rows

    from types import SimpleNamespace

    kind = Scalar(scalar)
    dtype = np.dtype([("q", np.int8, (16,)), ("s", np.float32)]) if kind is Scalar.I8 else np.dtype((np.float32 if kind is Scalar.F32 else np.float16, (16,)))
    store = SimpleNamespace(dtype=dtype, scalar=kind)

    rng = np.random.default_rng(0)
    unit = rng.standard_normal((3000, 16)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    stored = store_rows(unit, store)  # type: ignore[arg-type]
    rows = stored.view(_NoBlas)
    kinds = np.ones(len(rows), np.uint8)
    q = scoring.prepare(unit[7], kind, 16)
    resolve = lambda slots: {s: (f"/p/{s}", None) for s in slots}  # noqa: E731
    _NoBlas.products = 0
    probed = scoring.search(resolve, rows, kinds, kind, 16, q, 5, None, [(0, 1000), (1000, 2000), (2000, 3000)])
    assert _NoBlas.products == 0
    everything = scoring.search(resolve, np.asarray(stored), kinds, kind, 16, q, 5, None, None)
    assert probed == everything and probed[0].path == "/p/7"


def test_an_exact_search_of_many_rows_takes_no_blas_product() -> None:
    """An exact search of F32 rows scored them by one BLAS product from scoring.BLOCK rows on, its
    threads woken for a memory-bound pass: 100-145 CPU ms at a million rows, where numpy's own
    loop a block at a time takes 79-111 (docs/index.md). Now every block is numpy's, the hits
    those of the rows' own arithmetic."""
    from uform.core.types import Scalar
    from uform.index import scoring

    rng = np.random.default_rng(0)
    unit = rng.standard_normal((scoring.BLOCK + 1000, 16)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    rows = unit.view(_NoBlas)
    _NoBlas.products = 0
    hits = scoring.search(lambda slots: {s: (f"/p/{s}", None) for s in slots}, rows, np.ones(len(rows), np.uint8), Scalar.F32, 16,
                          scoring.prepare(unit[scoring.BLOCK + 7], Scalar.F32, 16), 3, None, None)  # fmt: skip
    assert _NoBlas.products == 0
    assert [h.path for h in hits] == [f"/p/{i}" for i in np.argsort(-(unit @ unit[scoring.BLOCK + 7]))[:3]]
    assert hits[0].score == pytest.approx(1, abs=1e-6)


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
