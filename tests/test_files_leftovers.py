"""What a writer killed with SIGKILL leaves in a folder, and who removes it (uform.core.files):
the next write into that folder removes the temporaries of a writer that is provably gone, and
never those of a writer still running, of another machine, or of a name uform does not make."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from uform.core import files

pytestmark = pytest.mark.skipif(files.writer() is None, reason="a writer is told only on Linux (/proc)")

WRITER = """
import sys
from pathlib import Path
from uform.core.files import Outputs

folder = Path(sys.argv[1])
with Outputs() as out:
    with out.open(folder / "big.bin") as f:
        f.write(b"x" * 1_000_000)
    scratch = out.scratch(folder)
    (scratch / "weights.data").write_bytes(b"w" * 1000)
    out.adopt(scratch / "weights.data", folder / "weights.data")
    print("written", flush=True)
    sys.stdin.readline()  # held here, its temporaries in the folder, until told to go on
print("renamed", flush=True)
"""


def _line(proc: subprocess.Popen[str]) -> str:
    """The writer's next line; a writer that says nothing in a minute fails the test (no hang)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    if not ready:
        proc.kill()
        proc.wait()
        pytest.fail("the writer said nothing in 60 s")
    return proc.stdout.readline().strip()


def _writing(folder: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert _line(proc) == "written"
    return proc


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


def test_a_killed_writers_temporaries_go_with_the_next_write_into_its_folder(tmp_path: Path) -> None:
    proc = _writing(tmp_path)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    left = sorted(_temporaries(tmp_path), key=lambda n: not n.startswith(".big.bin."))  # .big.bin.*.partial, then the scratch folder
    assert len(left) == 2 and (tmp_path / left[0]).stat().st_size == 1_000_000
    assert left[0].startswith(".big.bin.") and (tmp_path / left[1] / "weights.data").stat().st_size == 1000
    me = files.writer()
    assert me is not None
    other = "0" * 8 if me[0] != "0" * 8 else "f" * 8
    foreign = {
        ".big.bin.0badc0de.partial": b"no writer in its name",
        ".notes.partial": b"the user's",
        f".big.bin.{other}-{proc.pid}-1-0badc0de.partial": b"another machine's writer",
        f".big.bin.{me[0]}-{proc.pid}-1-0badc0de.txt": b"not a temporary's name",
    }
    for name, data in foreign.items():
        (tmp_path / name).write_bytes(data)
    files.write_bytes(tmp_path / "other.bin", b"y")
    assert (tmp_path / "other.bin").read_bytes() == b"y"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "other.bin"} == foreign
    assert not (tmp_path / "big.bin").exists() and not (tmp_path / "weights.data").exists()


def test_a_running_writers_temporaries_stay_and_both_writes_succeed(tmp_path: Path) -> None:
    proc = _writing(tmp_path)
    try:
        held = _temporaries(tmp_path)
        assert len(held) == 2
        with files.Outputs() as out:
            scratch = out.scratch(tmp_path)
            (scratch / "mine").write_bytes(b"m")
            out.adopt(scratch / "mine", tmp_path / "mine")
            with out.open(tmp_path / "big.bin") as f:
                f.write(b"z")
        assert (tmp_path / "big.bin").read_bytes() == b"z" and _temporaries(tmp_path) == held
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert _line(proc) == "renamed"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "big.bin").read_bytes() == b"x" * 1_000_000 and (tmp_path / "weights.data").read_bytes() == b"w" * 1000
    assert (tmp_path / "mine").read_bytes() == b"m" and _temporaries(tmp_path) == []


def test_a_temporary_whose_process_id_was_taken_again_goes(tmp_path: Path) -> None:
    me = files.writer()
    assert me is not None
    machine, pid, start = me
    reused = tmp_path / f".a.bin.{machine}-{pid}-{start - 1}-0badc0de.partial"  # this pid, another start: its writer is gone
    running = tmp_path / f".a.bin.{machine}-{pid}-{start}-0badc0de.partial"  # this very process's
    folder = tmp_path / f".{machine}-{pid}-{start - 1}-0badc0de.partial"  # a gone writer's scratch folder
    reused.write_bytes(b"r")
    running.write_bytes(b"s")
    (folder / "deep").mkdir(parents=True)
    (folder / "deep" / "x.data").write_bytes(b"d")
    assert sorted(files.sweep(tmp_path)) == sorted([reused, folder])
    assert not reused.exists() and not folder.exists() and running.read_bytes() == b"s"


def test_a_name_of_255_bytes_is_written(tmp_path: Path) -> None:
    name = "é" * 125 + "a.npy"  # 255 bytes: as long as a name may be
    files.write_bytes(tmp_path / name, b"whole")
    assert [p.name for p in tmp_path.iterdir()] == [name] and (tmp_path / name).read_bytes() == b"whole"


KILLED_LOAD = """
import os, signal, sys
import onnxruntime as ort
import uform

def killed(*args, **kwargs):  # the float32 weights are written: killed before a session reads them
    os.kill(os.getpid(), signal.SIGKILL)

ort.InferenceSession = killed
uform.Model.load_ram(sys.argv[1], quantization=uform.Scalar.F32)
"""


def test_a_killed_loads_float32_weights_go_with_the_next_load(tiny_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cpu backend's float32 weights (tempfile.mkdtemp's uform-text-XXXXXXXX) stayed in the
    temporary folder for good after a kill -9 (a base text tower: 329 MB per killed load)."""
    import tempfile

    import uform

    temp = tmp_path / "temp"
    temp.mkdir()
    run = subprocess.run([sys.executable, "-c", KILLED_LOAD, str(tiny_text)], env={**os.environ, "TMPDIR": str(temp)}, check=False)
    assert run.returncode == -signal.SIGKILL
    (left,) = _temporaries(temp)  # beside it, onnxruntime's own .ses file may be there
    assert left.startswith(".uform-text.")
    assert sorted(os.listdir(temp / left)) == ["tower.onnx", "weights.bin"]
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    model = uform.Model.load_ram(tiny_text, quantization=uform.Scalar.F32)
    assert model.backend == "cpu"
    assert _temporaries(temp) == [] and not [n for n in os.listdir(temp) if "uform" in n]


def test_an_own_folder_names_its_writer_and_sweeps_a_killed_ones(tmp_path: Path) -> None:
    gone = tmp_path / f".uform-text.{files.writer()[0]}-{2**22 + 1}-1-00000000{files.PARTIAL}"  # type: ignore[index]
    gone.mkdir()
    (gone / "weights.bin").write_bytes(b"w")
    made = files.own_folder(tmp_path, "uform-a/b c")
    assert os.listdir(tmp_path) == [made.name]
    assert made.name.startswith(".uform-a_b_c.") and files.sweep(tmp_path) == []
    assert made.stat().st_mode & 0o777 == 0o700


def test_own_folders_list_their_parent_once_a_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every own folder (each tower of a float32 load) listed the system's temporary folder again:
    with 100,000 names of others there a two-tower load took 190 ms, not 33 (a 2-core Zen 3). A
    killed writer's folder goes at the process's first own folder there; the next ones list nothing."""
    listed: list[str] = []
    scandir = os.scandir

    def counted(path: str | os.PathLike[str] | int) -> object:
        if not isinstance(path, int):  # shutil.rmtree lists the folder it removes by its descriptor
            listed.append(os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counted)
    gone = tmp_path / f".uform-text.{files.writer()[0]}-{2**22 + 1}-1-00000000{files.PARTIAL}"  # type: ignore[index]
    gone.mkdir()
    first = files.own_folder(tmp_path, "uform-text")
    assert not gone.exists() and listed == [str(tmp_path)]
    gone.mkdir()  # a writer killed since: left for the next process
    second = files.own_folder(tmp_path, "uform-image")
    assert listed == [str(tmp_path)] and gone.exists()
    assert sorted(os.listdir(tmp_path)) == sorted([gone.name, first.name, second.name])


def test_every_old_import_path_names_the_moved_names() -> None:
    """files.py (324 lines) gave OutputError to errors.py and own_folder, leftovers and target to
    leftovers.py; uform.core.files still answers each, the same object, and the error is an OSError."""
    from uform.core import errors, leftovers

    assert files.OutputError is errors.OutputError and issubclass(errors.OutputError, (errors.UformError, OSError))
    assert (files.own_folder, files.leftovers, files.target) == (leftovers.own_folder, leftovers.leftovers, leftovers.target)
    assert str(errors.OutputError("x: not written")) == "x: not written"
    assert errors.reason_of(PermissionError(13, "Permission denied")) == "Permission denied"
