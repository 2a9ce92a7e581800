"""A search reads an index and leaves it as it found it: no file beside it, nothing a later writer
fails on, and an answer where SQLite's shared-memory file (``index.sqlite-shm``) cannot be made
(a full disk, a file size limit). docs/index.md ("Faults", "Limits")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from index_files import ckpt  # noqa: F401 (the fixture)
from uform.index import Index, Text

DROP = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
SEARCH = ["search", "text number 3", "--index", "idx", "--modalities", "text", "-k", "1"]
SIZE_LIMITED = """
import resource, sys
from uform.cli import main
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(main(sys.argv[2:]))
"""


def made(folder: Path, ckpt: Path) -> Path:
    with Index(folder, checkpoint=ckpt) as ix:
        ix.update([Text(f"k{i}", f"text number {i}") for i in range(50)])
    return folder


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def uform_cli(*args: str, cwd: Path, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_a_search_leaves_no_file_beside_the_index(tmp_path: Path, ckpt: Path) -> None:
    """A reader's read-only connection made SQLite's index.sqlite-shm (32 KiB) and -wal and could
    not remove them: every search left them. Now the last connection to close removes them, as a
    writer's does, and the folder is byte for byte as it was."""
    before = files(made(tmp_path / "idx", ckpt))
    with Index(tmp_path / "idx", checkpoint=ckpt, read_only=True) as ix:
        assert [h.path for h in ix.search("text number 3", k=1)] == ["k3"] and len(ix) == 50
    assert files(tmp_path / "idx") == before
    found = uform_cli("-m", "uform.cli", *SEARCH, "-m", str(ckpt), cwd=tmp_path)
    assert (found.returncode, found.stderr, found.stdout.split()[2:3]) == (0, "", ["k3"])
    assert files(tmp_path / "idx") == before


def test_a_search_of_a_database_it_may_not_write_leaves_the_index_writable(tmp_path: Path, ckpt: Path) -> None:
    """A search of an index whose index.sqlite is read-only (mode 444, the folder writable) left
    an index.sqlite-shm and -wal of mode 444 (SQLite gives them the database's mode); made
    writable again, every update failed: 'idx: cannot write the index (attempt to write a readonly
    database)', until those files were deleted by hand. Root runs without the capability that
    overrides permission bits (``setpriv``)."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to bind")
    prefix = DROP if os.geteuid() == 0 else []
    made(tmp_path / "idx", ckpt)
    (tmp_path / "idx" / "index.sqlite").chmod(0o444)
    found = uform_cli("-m", "uform.cli", *SEARCH, "-m", str(ckpt), cwd=tmp_path, prefix=prefix)
    assert (found.returncode, found.stderr, found.stdout.split()[2:3]) == (0, "", ["k3"])
    (tmp_path / "idx" / "index.sqlite").chmod(0o644)
    (tmp_path / "new.txt").write_text("a new text\n")
    added = uform_cli("-m", "uform.cli", "index", "new.txt", "--into", "idx", "-m", str(ckpt), cwd=tmp_path, prefix=prefix)
    assert (added.returncode, added.stderr) == (0, ""), added.stderr
    assert "index idx: 51 items (51 texts)" in added.stdout


def test_a_search_where_the_shared_memory_file_cannot_be_made_answers(tmp_path: Path, ckpt: Path) -> None:
    """Under a file size limit of 8 KiB the reader cannot grow index.sqlite-shm to SQLite's 32 KiB,
    as on a full disk: the search stopped with 'idx: cannot open the index (disk I/O error)'. With
    the -wal empty the database file holds every commit, and no writer can run without that -shm
    either: the search reads it ``immutable`` and answers; the index's own files are as they were."""
    before = files(made(tmp_path / "idx", ckpt))
    found = uform_cli("-c", SIZE_LIMITED, str(8 * 1024), *SEARCH, "-m", str(ckpt), cwd=tmp_path)
    assert (found.returncode, found.stderr, found.stdout.split()[2:3]) == (0, "", ["k3"]), found.stderr
    assert {k: v for k, v in files(tmp_path / "idx").items() if not k.endswith(("-shm", "-wal"))} == before
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:  # what that search began of the -shm is remade by the next connection
        assert ix.update([Text("new", "a new text")]).added == 1 and len(ix) == 51


def test_a_search_on_a_full_disk_answers(tmp_path: Path, ckpt: Path) -> None:
    """The same on a real full disk: a 1 MiB tmpfs filled to its last block, in a mount namespace of
    its own (root, ``unshare``): 'cannot open the index (disk I/O error)' before."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a tmpfs is mounted by root, through unshare")
    made(tmp_path / "idx", ckpt)
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=1m tmpfs {disk} && cp -a {tmp_path / 'idx'} {disk}/idx && "
              f"(dd if=/dev/zero of={disk}/fill bs=4k 2>/dev/null; true) && cd {disk} && "
              f"{sys.executable} -m uform.cli {' '.join(SEARCH[:1])} 'text number 3' {' '.join(SEARCH[2:])} -m {ckpt}")  # fmt: skip
    mounted = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=4k tmpfs {disk} && umount {disk}"], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"no mount namespace here ({mounted.stderr.decode().strip()})")
    found = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert (found.returncode, found.stderr, found.stdout.split()[2:3]) == (0, "", ["k3"]), found.stderr
