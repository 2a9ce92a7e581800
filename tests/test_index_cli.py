"""``uform index`` and ``uform search --index`` (docs/cli.md), in-process through ``uform.cli.main``;
a read-only folder and a full disk stop a run with the index intact."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ckpt import make_checkpoint
from index_files import ckpt  # noqa: F401 (the fixture)
from uform.cli import main
from uform.index import Index
from uform.index.store import Store


def photos(root: Path, count: int = 4) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(root / f"p{i}.png")
    return root


def test_one_item_is_one_item(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "note.txt").write_text("a red circle\n")
    assert main(["index", str(tmp_path / "note.txt"), "--into", str(tmp_path / "idx"), "-m", str(ckpt)]) == 0
    assert f"index {tmp_path / 'idx'}: 1 item (1 text) of " in capsys.readouterr().out  # was '1 items'
    assert main(["encode", "a red circle", "--out", str(tmp_path / "one"), "-m", str(ckpt)]) == 0
    assert ": 1 row of 32 f32 (1 text)" in capsys.readouterr().out  # was '1 rows'
    if importlib.util.find_spec("pyarrow") is not None:
        assert main(["index", "--into", str(tmp_path / "idx"), "--export-parquet", str(tmp_path / "one.parquet"), "-m", str(ckpt)]) == 0
        assert capsys.readouterr().out.endswith(f"wrote {tmp_path / 'one.parquet'}: 1 row\n")


def test_index_then_search(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    photos(tmp_path / "photos")
    (tmp_path / "notes.txt").write_text("a red circle\nblue squares\n")
    index = ["--into", "idx", "-m", str(ckpt)]
    assert main(["index", "photos", "notes.txt", *index]) == 0
    out = capsys.readouterr().out
    assert "index idx: 6 items (2 texts, 4 images)" in out and "this run: 6 embedded, 0 unchanged" in out
    assert main(["index", "photos", "notes.txt", *index]) == 0
    assert "this run: 0 embedded, 6 unchanged" in capsys.readouterr().out
    assert main(["search", "blue squares", "--index", "idx", "-m", str(ckpt), "--modalities", "text", "--json", "-k", "1"]) == 0
    top = json.loads(capsys.readouterr().out)[0]
    assert (top["path"], top["text"], top["modality"]) == ("notes.txt:2", "blue squares", "text") and top["score"] == pytest.approx(1, abs=1e-5)
    assert main(["search", "--like", "photos/p2.png", "--index", "idx", "-m", str(ckpt), "-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].split() == ["1", "1.000", "photos/p2.png"]
    assert main(["index", "--into", "idx", "--export-parquet", "out.parquet", "-m", str(ckpt)]) == 0
    assert "wrote out.parquet: 6 rows" in capsys.readouterr().out


def test_failures_and_errors(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    photos(tmp_path / "photos", 2)
    (tmp_path / "photos" / "bad.jpg").write_bytes(b"junk")
    assert main(["index", "photos", "--into", "idx", "-m", str(ckpt)]) == 1
    captured = capsys.readouterr()
    assert f"uform: failed: file {tmp_path}/photos/bad.jpg: not a JPEG, PNG or WebP image" in captured.err
    assert "1 failed, 0 failed before" in captured.out
    assert main(["index", "photos", "--into", "idx", "-m", str(ckpt)]) == 1  # recorded: reported again, not retried
    assert "(unchanged since it failed; not tried again)" in capsys.readouterr().err
    other = make_checkpoint(tmp_path / "other.safetensors", "tiny", 1, ["text", "image"])
    assert main(["index", "photos", "--into", "idx", "-m", str(other)]) == 2
    assert "was made by" in capsys.readouterr().err
    assert main(["search", "--index", "idx", "-m", str(ckpt)]) == 2
    assert "give a QUERY or --like FILE" in capsys.readouterr().err
    assert main(["search", "x", "--index", "nowhere", "-m", str(ckpt)]) == 2
    assert "no such index" in capsys.readouterr().err
    (tmp_path / "empty.png").write_bytes(b"")
    for like, reason in (("missing.png", "no such file"), ("empty.png", "the file is empty")):  # not the API's "item 0 (PATH): ..."
        assert main(["search", "--like", like, "--index", "idx", "-m", str(ckpt)]) == 2
        assert capsys.readouterr().err == f"uform: error: --like {like}: {reason}\n"
    assert main(["index", "--into", "idx"]) == 2


def test_an_empty_path_is_not_the_current_folder(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``uform index --remove "$UNSET"`` removed every item under the current folder, and
    ``uform index "$UNSET"`` indexed it; an empty ``--into`` was named as "the index  or inside it"."""
    monkeypatch.chdir(tmp_path)
    photos(tmp_path / "photos", 3)
    index = ["--into", "idx", "-m", str(ckpt)]
    assert main(["index", "photos", *index]) == 0
    capsys.readouterr()
    assert main(["index", "--remove", "", *index]) == 2
    assert capsys.readouterr().err == "uform: error: a path to remove is empty; it names no item (pass '.' to remove every item under the current folder)\n"
    assert main(["index", "", *index]) == 1
    captured = capsys.readouterr()
    assert captured.err == "uform: failed: file : no such file or folder (the path is empty)\n"
    assert "index idx: 3 items (3 images)" in captured.out and "0 embedded, 0 unchanged" in captured.out  # photos/ untouched, nothing else walked
    assert main(["index", "photos", "--into", "", "-m", str(ckpt)]) == 2
    assert capsys.readouterr().err == "uform: error: --into is empty: name the index folder\n"
    assert main(["search", "x", "--index", "", "-m", str(ckpt)]) == 2
    assert capsys.readouterr().err == "uform: error: the index path is empty; name the index folder\n"
    with Index("idx", checkpoint=ckpt, read_only=True) as ix:
        assert len(ix) == 3


NO_PYARROW = """
import sys
sys.modules["pyarrow"] = None  # as where it is not installed
from uform.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_parquet_export_that_cannot_be_written_is_refused_before_any_work(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str],
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The update ran whole, then the export was refused (status 2); without pyarrow, a traceback."""
    monkeypatch.chdir(tmp_path)
    photos(tmp_path / "photos", 2)
    assert main(["index", "photos", "--into", "idx", "-m", str(ckpt), "--export-parquet", "/dev/full"]) == 2
    assert capsys.readouterr() == ("", "uform: error: /dev/full: not a regular file (/dev/full); not replaced\n")
    assert not (tmp_path / "idx").exists()
    for option in ("--export-parquet", "--import-parquet"):
        assert main(["index", "--into", "idx", option, ""]) == 2
        assert capsys.readouterr().err.startswith(f"uform: error: {option} is empty: name the Parquet file")
    run = subprocess.run([sys.executable, "-c", NO_PYARROW, "index", "photos", "--into", "idx", "-m", str(ckpt), "--export-parquet", "x.parquet"],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert (run.returncode, run.stdout, run.stderr) == (2, "", "uform: error: Parquet needs pyarrow: pip install 'uform[index]' (or pyarrow)\n")
    assert not (tmp_path / "idx").exists()


def test_an_export_replaces_only_an_earlier_export_unless_forced(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """--export-parquet FILE replaced any file at FILE (a user's notes, their own Parquet data) without a word."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    monkeypatch.chdir(tmp_path)
    photos(tmp_path / "photos", 2)
    Path("notes.parquet").write_bytes(b"my notes")
    pq.write_table(pa.table({"x": [1, 2]}), "data.parquet")  # Parquet, but not an export
    data = Path("data.parquet").read_bytes()
    for name in ("notes.parquet", "data.parquet"):
        assert main(["index", "photos", "--into", "idx", "-m", str(ckpt), "--export-parquet", name]) == 2
        assert capsys.readouterr() == ("", f"uform: error: {name}: exists and is not a Parquet export of an index; not replaced (--force replaces it)\n")
    assert (Path("notes.parquet").read_bytes(), Path("data.parquet").read_bytes()) == (b"my notes", data)
    assert not Path("idx").exists()  # refused before any work
    assert main(["index", "photos", "--into", "idx", "-m", str(ckpt), "--export-parquet", "notes.parquet", "--force"]) == 0
    assert "wrote notes.parquet: 2 rows" in capsys.readouterr().out
    assert main(["index", "--into", "idx", "-m", str(ckpt), "--export-parquet", "notes.parquet"]) == 0  # an earlier export: replaced
    assert "wrote notes.parquet: 2 rows" in capsys.readouterr().out
    assert pq.read_table("notes.parquet").num_rows == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["data.parquet", "idx", "notes.parquet", "photos"]


def test_a_full_disk_stops_the_run_with_the_index_intact(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uform.index.update as update

    root = photos(tmp_path / "photos", 7)
    monkeypatch.setattr(update, "CHUNK", 3)
    appended = Store.append
    calls = []

    def append(self: Store, *args: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        appended(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "append", append)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix, pytest.raises(OSError, match="No space left"):
        ix.update([root])
    monkeypatch.undo()
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        assert len(ix) == 3  # the first chunk, committed before the disk filled
        assert ix.update([root]).added == 4 and len(ix) == 7


def test_a_read_only_folder_stops_the_run_with_the_index_intact(tmp_path: Path, ckpt: Path) -> None:
    """The index folder and its files lose their write bits; root runs the command without the
    capability that overrides them (``setpriv``), so the refusal is the one a user gets."""
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to bind")
    root = photos(tmp_path / "photos", 3)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
    photos(tmp_path / "photos", 5)  # two more for the refused run
    before = {p.name: p.read_bytes() for p in (tmp_path / "idx").iterdir()}
    for p in (tmp_path / "idx").iterdir():
        p.chmod(0o444)
    (tmp_path / "idx").chmod(0o555)
    try:
        prefix = drop if os.geteuid() == 0 else []

        def command(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*prefix, sys.executable, "-m", "uform.cli", *args], capture_output=True, text=True, cwd=tmp_path)

        refused = command("index", "photos", "--into", "idx", "-m", str(ckpt))
        assert refused.returncode == 2 and "cannot write the index" in refused.stderr and "left as it was" in refused.stderr, refused.stderr
        assert refused.stderr == "uform: error: idx: cannot write the index (Permission denied); it is left as it was\n", refused.stderr  # D14: no "[Errno 13]"
        found = command("search", "x", "--index", "idx", "-m", str(ckpt), "--modalities", "image", "--json")
        assert found.returncode == 0, found.stderr  # a reader needs no write permission
        assert len(json.loads(found.stdout)) == 3
        exported = command("index", "--into", "idx", "--export-parquet", "out.parquet", "-m", str(ckpt))  # export only reads (D14)
        assert exported.returncode == 0 and "wrote out.parquet: 3 rows" in exported.stdout, exported.stderr
    finally:
        (tmp_path / "idx").chmod(0o755)
        for p in (tmp_path / "idx").iterdir():
            p.chmod(0o644)
    assert {p.name: p.read_bytes() for p in (tmp_path / "idx").iterdir()} == before
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        assert len(ix) == 3 and ix.update([root]).added == 2


def test_a_folder_that_cannot_be_listed_keeps_its_items(tmp_path: Path, ckpt: Path) -> None:
    """Its files were not looked for, so they are not gone: a run while it was unreadable removed
    its items, and the next run embedded them all again. Root runs without the capability that
    overrides the folder's mode (``setpriv``), as above."""
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to bind")
    root = photos(tmp_path / "photos", 2)
    locked = root / "locked"
    locked.mkdir()
    for i in range(3):
        Image.fromarray(np.random.default_rng(10 + i).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(locked / f"q{i}.png")
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
    locked.chmod(0)
    try:
        run = subprocess.run([*(drop if os.geteuid() == 0 else []), sys.executable, "-m", "uform.cli", "index", "photos", "--into", "idx",
                              "-m", str(ckpt)], capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    finally:
        locked.chmod(0o755)
    assert (run.returncode, run.stderr) == (1, f"uform: failed: folder {locked}: cannot list the folder (Permission denied)\n")
    assert "index idx: 5 items (5 images)" in run.stdout and "0 embedded, 2 unchanged, 0 read again unchanged, 0 moved, 0 copied, 0 removed, 1 failed" in run.stdout
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        again = ix.update([root])
        assert (again.added, again.unchanged, again.removed, len(ix)) == (0, 5, 0, 5)


SIZE_LIMITED = """
import resource, sys
from uform.cli import main
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(main(sys.argv[2:]))
"""


def test_an_export_not_written_keeps_the_old_file_and_leaves_nothing(tmp_path: Path, ckpt: Path) -> None:
    """--export-parquet through uform.core.files: under a file size limit (``ulimit -f``), into a
    read-only folder, onto a link to /dev/full: one line naming the file, status 2, the old export
    byte for byte, no temporary file."""
    pytest.importorskip("pyarrow")
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    (tmp_path / "texts.txt").write_text("".join(f"text number {i}\n" for i in range(2000)))  # a Parquet file of 300 KB
    (tmp_path / "out").mkdir()
    old = tmp_path / "out" / "old.parquet"
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([tmp_path / "texts.txt"])
        ix.export_parquet(old)  # an earlier export: replaced without --force
    (tmp_path / "out" / "full.parquet").symlink_to("/dev/full")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if not p.is_symlink()}
    export = ["index", "--into", "idx", "-m", str(ckpt), "--export-parquet"]

    def run(args: list[str], prefix: list[str] = []) -> subprocess.CompletedProcess[str]:  # noqa: B006
        return subprocess.run([*prefix, sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)

    cases = [(run(["-c", SIZE_LIMITED, str(64 * 1024), *export, "out/old.parquet"]), "out/old.parquet: not written (File too large); the old file is as it was"),
             (run(["-m", "uform.cli", *export, "out/full.parquet"]), "out/full.parquet: not a regular file (/dev/full); not replaced")]  # fmt: skip
    if os.geteuid() != 0 or shutil.which("setpriv"):
        (tmp_path / "out").chmod(0o555)
        try:
            cases.append((run(["-m", "uform.cli", *export, "out/new.parquet"], drop if os.geteuid() == 0 else []),
                          "out/new.parquet: cannot be written (Permission denied)"))  # fmt: skip
        finally:
            (tmp_path / "out").chmod(0o755)
    for done, why in cases:
        assert (done.returncode, done.stderr) == (2, f"uform: error: {why}\n") and "wrote" not in done.stdout
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if not p.is_symlink()} == before
    assert len(list((tmp_path / "out").iterdir())) == 2  # nothing beside the old file and the link



def test_an_earlier_uforms_index_is_not_written_by_a_run_with_nothing_to_change(tmp_path: Path, ckpt: Path) -> None:
    """An index made before the hash index and the list of removed slots was upgraded when its
    writer opened it: an unchanged re-run on a full disk (here a file size limit the WAL's first
    frames pass: SQLite's 32 KiB shared memory fits, the upgrade's pages do not) stopped with
    'cannot write the index' where it had nothing to write. Now the upgrade goes with the first
    real write, in its transaction: the unchanged run and a search leave the database's bytes
    as they were, a run with something to write stops intact, and without the limit it writes."""
    import sqlite3

    (tmp_path / "texts.txt").write_text("".join(f"text number {i}\n" for i in range(500)))
    photos(tmp_path / "photos", 2)
    db = tmp_path / "idx" / "index.sqlite"
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([tmp_path / "texts.txt", tmp_path / "photos"])
    conn = sqlite3.connect(db)
    for drop in ("TRIGGER items_removed", "TABLE removed", "INDEX items_hash", "INDEX items_path"):
        conn.execute(f"DROP {drop}")
    conn.commit()
    conn.close()
    before = db.read_bytes()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", SIZE_LIMITED, str(32 * 1024), *args, "-m", str(ckpt)], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)  # fmt: skip

    same = run("index", "texts.txt", "photos", "--into", "idx")
    assert (same.returncode, same.stderr) == (0, ""), same.stderr
    assert "0 embedded, 502 unchanged" in same.stdout, same.stdout
    found = run("search", "text number 3", "--index", "idx", "--modalities", "text", "-k", "1")
    assert (found.returncode, found.stderr, len(found.stdout.splitlines())) == (0, "", 1), found.stderr
    assert db.read_bytes() == before
    photos(tmp_path / "photos", 3)  # something to write: the disk refuses it, what was committed stays
    full = run("index", "photos", "--into", "idx")
    # the rows' file named (it said '[Errno 27] File too large', from the close that flushed the refused write's buffer again)
    assert (full.returncode, full.stderr) == (2, "uform: error: idx: cannot write the index (vectors-0.bin: File too large); what was committed stays\n"), full.stderr
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        assert len(ix) == 502 and ix.update([tmp_path / "photos"]).added == 1 and len(ix) == 503
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert {"items_path", "items_hash", "removed", "items_removed"} <= {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()



def test_a_removal_inside_what_the_run_indexes_is_refused(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """'uform index photos --remove photos/sub' removed photos/sub's items, then indexed photos and
    embedded them again: 'this run: 1 embedded, ..., 1 removed' with the item still in the index.
    A removal at, under or over a PATH of the same run is refused before anything is written."""
    monkeypatch.chdir(tmp_path)
    photos(tmp_path / "photos", 2)
    photos(tmp_path / "photos" / "sub", 1)
    assert main(["index", "photos", "--into", "idx", "-m", str(ckpt)]) == 0
    capsys.readouterr()
    before = (tmp_path / "idx" / "index.sqlite").read_bytes()
    for paths, removed, where in ((["photos"], "photos/sub", "is under photos"), (["photos/sub"], "photos", "holds photos/sub"),
                                  (["photos/sub"], "photos/sub/", "is photos/sub")):  # fmt: skip
        assert main(["index", *paths, "--into", "idx", "-m", str(ckpt), "--remove", removed]) == 2
        assert capsys.readouterr() == ("", f"uform: error: --remove {removed}: {where}, which this run indexes: its items would be embedded again; "
                                           f"remove them in a run that does not index {paths[0]}, or move the files away first\n")  # fmt: skip
    assert (tmp_path / "idx" / "index.sqlite").read_bytes() == before
    assert main(["index", "--into", "idx", "-m", str(ckpt), "--remove", "photos/sub"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "this run: 1 removed"



def test_like_a_folder_or_a_text_file_names_the_option(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """--like a folder or a .txt said 'uform: error: photos: not a file of a known media type ...',
    where every other refusal of --like's file names the option ('--like FILE: no such file'):
    Index.search_file raised a bare ValueError. It is an InputError (a ValueError) naming item 0."""
    from uform import InputError

    monkeypatch.chdir(tmp_path)
    photos(tmp_path / "photos", 1)
    (tmp_path / "notes.txt").write_text("a red circle\n")
    assert main(["index", "photos", "--into", "idx", "-m", str(ckpt)]) == 0
    capsys.readouterr()
    for like in ("photos", "notes.txt"):
        assert main(["search", "--like", like, "--index", "idx", "-m", str(ckpt)]) == 2
        assert capsys.readouterr() == ("", f"uform: error: --like {like}: not a file of a known media type (image, video or audio by its extension)\n")
    with Index(tmp_path / "idx", checkpoint=ckpt, read_only=True) as ix, pytest.raises(InputError, match=r"^item 0 \(photos\): not a file of a known"):
        ix.search_file("photos")


def test_export_during_a_writers_run_and_search_lines(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """D14: an export was refused while another writer held the index; D15: a name with a newline
    printed across two lines, a 2.6 MB text line whole."""
    pytest.importorskip("pyarrow")
    monkeypatch.chdir(tmp_path)
    photos(tmp_path / "photos", 2)
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "photos" / "two\nlines.png")
    (tmp_path / "long.txt").write_text("a red circle " * 400 + "\n")
    assert main(["index", "photos", "long.txt", "--into", "idx", "-m", str(ckpt)]) == 0
    capsys.readouterr()
    with Index(tmp_path / "idx", checkpoint=ckpt):  # a writer holds the lock
        assert main(["index", "--into", "idx", "--export-parquet", "out.parquet", "-m", str(ckpt)]) == 0
        assert "wrote out.parquet: 4 rows" in capsys.readouterr().out
    assert main(["search", "a red circle", "--index", "idx", "-m", str(ckpt), "-k", "4", "--modalities", "text,image"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and any(line.endswith("  photos/two\\nlines.png") for line in lines), lines
    text = next(line for line in lines if "long.txt:1" in line)
    assert text.endswith(" circle a red… (5,200 characters)") and len(text) < 260, text


def test_names_that_are_not_utf8_print_escaped(tmp_path: Path, ckpt: Path) -> None:
    """An INDEX, FILE or checkpoint named in another encoding: the run embedded, then failed to print
    its summary on a strict UTF-8 stdout ('utf-8' codec can't encode ...; status 2), and a
    checkpoint so named made no index at all (the same error, from SQLite's meta)."""
    pytest.importorskip("pyarrow")
    photos(tmp_path / "photos", 1)
    shutil.copy(ckpt, tmp_path / os.fsdecode(b"m\xfe.safetensors"))
    args = ["index", "photos", "--into", os.fsdecode(b"i\xffdx"), "-m", os.fsdecode(b"m\xfe.safetensors"), "--export-parquet", os.fsdecode(b"e\xfd.parquet")]
    run = subprocess.run([sys.executable, "-m", "uform.cli", *args], capture_output=True, text=True, cwd=tmp_path,
                         env=os.environ | {"PYTHONIOENCODING": "utf-8"})  # fmt: skip
    assert (run.returncode, run.stderr) == (0, ""), run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"index i\\xffdx: 1 item (1 image) of {tmp_path}/m\\xfe.safetensors (sha256 ") and lines[-1] == "wrote e\\xfd.parquet: 1 row"  # not '1 rows'
    with Index(tmp_path / os.fsdecode(b"i\xffdx"), checkpoint=ckpt, read_only=True) as index:
        assert [e.path for e in index.entries()] == [str(tmp_path / "photos" / "p0.png")]


def test_search_prints_paths_that_open_from_the_current_folder(tmp_path: Path, ckpt: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``uform search`` prints each path as it opens from where it runs: relative to the current
    folder under it, else absolute; ``Index.search`` answers the stored absolute paths. An encode
    output's relative paths are relative to the folder encode ran in: searched from another
    folder they printed as stored ('photos/p0.png', no such file there)."""
    photos(tmp_path / "a" / "photos", 2)
    (tmp_path / "a" / "out").mkdir()
    (tmp_path / "b").mkdir()
    model = ["-m", str(ckpt), "-k", "0", "--json", "-q"]

    def printed(*args: str) -> list[str]:
        assert main(["search", "red", *args, *model]) == 0
        return sorted(r["path"] for r in json.loads(capsys.readouterr().out))

    monkeypatch.chdir(tmp_path / "a")
    assert main(["encode", "photos", "--out", "out/emb", "-m", str(ckpt), "-q"]) == 0
    assert main(["index", "photos", "--into", "idx", "-m", str(ckpt), "-q"]) == 0
    capsys.readouterr()
    here = ["photos/p0.png", "photos/p1.png"]
    assert printed("out/emb") == printed("--index", "idx") == printed("photos") == here
    with Index(tmp_path / "a" / "idx", checkpoint=ckpt, read_only=True) as index:
        assert sorted(h.path for h in index.search("red", 2)) == [str(tmp_path / "a" / p) for p in here]
    monkeypatch.chdir(tmp_path / "b")
    assert printed("../a/out/emb") == printed("--index", "../a/idx") == [str(tmp_path / "a" / p) for p in here]
    monkeypatch.chdir(tmp_path / "a" / "photos")
    assert printed("../out/emb") == printed("--index", "../idx") == ["p0.png", "p1.png"]
    for p in printed("../out/emb"):
        assert os.path.isfile(p)
