"""Files the CLI writes: whole or not at all (uform.core.files), never over a file uform did not
write unless --force, and every refusal one line naming the file with exit status 2.

Each case is one of issue 58's reproductions: a file size limit (``ulimit -f``), a read-only
member, a member that links to /dev/full, ``--out x/captions.json`` beside the user's
``captions.jsonl``, ``uform new notes.txt``, and ``uform export`` of a bad checkpoint.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ckpt import make_checkpoint
from uform.cli import main
from uform.cli.saved import read_saved
from uform.core.files import OutputError, Outputs

ROOT = Path(__file__).resolve().parent.parent


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too: a temporary left behind shows) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("uform: error: ") and "Traceback" not in err, err
    return err.strip()


RUN_LIMITED = """
import contextlib, io, json, os, resource, sys
from uform.cli import main
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
results = []
for cwd, max_bytes, args in json.loads(sys.argv[1]):
    os.chdir(cwd)
    err = io.StringIO()
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, hard))
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(args)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def limited(runs: list[tuple[Path, int, list[str]]]) -> list[tuple[int, str]]:
    """Each ``uform ARGS`` in its folder under a file size limit of ``max_bytes`` (``ulimit -f``),
    in one process of its own (the limit is the process's): the exit status and stderr of each."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    given = json.dumps([[str(cwd), n, args] for cwd, n, args in runs])
    run = subprocess.run([sys.executable, "-c", RUN_LIMITED, given], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return [(code, err) for code, err in json.loads(run.stdout)]


@pytest.fixture(scope="module")
def under_limits(tmp_path_factory: pytest.TempPathFactory, tiny_text: Path, checkpoints: dict[str, Path]) -> dict[str, tuple[int, str, Path, dict[str, bytes]]]:
    """Issue 58's size-limit cases, run in one process: each case's exit status, stderr, folder,
    and the folder's files before the run."""
    root = tmp_path_factory.mktemp("limits")
    folders = {name: root / name for name in ("encode", "new", "export", "demo")}
    for folder in folders.values():
        folder.mkdir()
    assert encode(tiny_text, folders["encode"] / "x", "a red circle") == 0
    assert main(["new", str(folders["new"] / "partial.safetensors"), "-q"]) == 0
    assert main(["export", str(checkpoints["good"]), str(folders["export"] / "towers"), "-q"]) == 0
    before = {name: snapshot(folder) for name, folder in folders.items()}
    texts = [f"text number {i}" for i in range(40)]  # 40 rows of 32 float32: 5 KiB of .npy
    runs = {
        "encode": (1024, ["encode", *texts, "--out", "x", "-m", str(tiny_text), "-q"]),
        "new": (100 * 1024, ["new", "partial.safetensors", "--seed", "1", "-q"]),
        "export": (64 * 1024, ["export", str(checkpoints["good"]), "towers", "--quantization", "bf16", "-q"]),
        "demo": (8 * 1024, ["demo-media", "demo", "--per-modality", "1"]),
    }
    results = limited([(folders[name], n, args) for name, (n, args) in runs.items()])
    return {name: (code, err, folders[name], before[name]) for name, (code, err) in zip(runs, results)}


def encode(tiny_text: Path, out: Path, *texts: str, extra: tuple[str, ...] = ()) -> int:
    return main(["encode", *texts, "--out", str(out), "-m", str(tiny_text), "-q", *extra])


# -- the helper -------------------------------------------------------------------------


def test_a_set_that_fails_midway_leaves_the_old_set_and_no_temporary(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"old a")
    (tmp_path / "b").write_bytes(b"old b")
    before = snapshot(tmp_path)
    with pytest.raises(RuntimeError, match="the writer failed"), Outputs() as out:
        with out.open(tmp_path / "a") as f:
            f.write(b"new a")
        with out.open(tmp_path / "b") as f:
            f.write(b"half of b")
            raise RuntimeError("the writer failed")
    assert snapshot(tmp_path) == before
    with Outputs() as out:
        for name in ("a", "b"):
            with out.open(tmp_path / name) as f:
                f.write(b"new " + name.encode())
    assert snapshot(tmp_path) == {"a": b"new a", "b": b"new b"}


def test_ctrl_c_while_a_set_is_put_in_place_leaves_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replace = os.replace
    calls = []

    def interrupted(src: str, dst: str) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        replace(src, dst)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt), Outputs() as out:
        for name in ("a", "b", "manifest"):
            with out.open(tmp_path / name) as f:
                f.write(name.encode())
    assert snapshot(tmp_path) == {"a": b"a"}  # the first was in place; the manifest, last, never came


def test_a_folder_the_set_made_goes_when_the_set_fails(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="not a regular file"), Outputs() as out:
        out.folder(tmp_path / "new" / "deeper")
        with out.open(tmp_path / "new" / "deeper" / "x") as f:
            f.write(b"x")
        out.path(tmp_path)  # a folder: refused
    assert list(tmp_path.iterdir()) == []


# -- uform encode --out ------------------------------------------------------------------


def test_encode_under_a_file_size_limit_keeps_the_old_set(under_limits: dict[str, tuple[int, str, Path, dict[str, bytes]]]) -> None:
    code, err, folder, before = under_limits["encode"]
    assert code == 2 and err.startswith("uform: error: x.npy: not written") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert snapshot(folder) == before
    assert [r["text"] for r in read_saved(folder / "x").rows] == ["a red circle"]


def test_a_read_only_member_refuses_the_set_before_anything_is_written(
    tmp_path: Path, tiny_text: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert encode(tiny_text, tmp_path / "keep", "one", "two") == 0
    (tmp_path / "keep.jsonl").chmod(0o444)
    capsys.readouterr()
    before = snapshot(tmp_path)
    assert encode(tiny_text, tmp_path / "keep", "only a text") == 2
    assert one_error(capsys) == f"uform: error: {tmp_path}/keep.jsonl: read-only; left as it was (make it writable, or write elsewhere)"
    assert snapshot(tmp_path) == before
    assert len(read_saved(tmp_path / "keep").rows) == 2


def test_a_member_linking_to_a_device_is_refused(tmp_path: Path, tiny_text: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert encode(tiny_text, tmp_path / "b", "one") == 0
    (tmp_path / "b.jsonl").unlink()
    (tmp_path / "b.jsonl").symlink_to("/dev/full")
    capsys.readouterr()
    before = snapshot(tmp_path)
    assert encode(tiny_text, tmp_path / "b", "two") == 2
    assert one_error(capsys) == f"uform: error: {tmp_path}/b.jsonl: not a regular file (/dev/full); not replaced"
    assert snapshot(tmp_path) == before and (tmp_path / "b.jsonl").is_symlink()


def test_a_file_force_cannot_replace_is_refused_without_offering_force(
    tmp_path: Path, tiny_text: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link to /dev/full or a read-only file that encode did not write: the refusal said
    '(--force replaces it)', and --force then refused it for another reason."""
    (tmp_path / "dev.npy").symlink_to("/dev/full")
    (tmp_path / "mine.jsonl").write_text("my notes\n")
    (tmp_path / "mine.jsonl").chmod(0o444)
    before = snapshot(tmp_path)
    for extra in ((), ("--force",)):
        assert encode(tiny_text, tmp_path / "dev", "one", extra=extra) == 2
        assert one_error(capsys) == f"uform: error: {tmp_path}/dev.npy: not a regular file (/dev/full); not replaced"
        assert encode(tiny_text, tmp_path / "mine", "one", extra=extra) == 2
        assert one_error(capsys) == f"uform: error: {tmp_path}/mine.jsonl: read-only; left as it was (make it writable, or write elsewhere)"
    assert snapshot(tmp_path) == before and (tmp_path / "dev.npy").is_symlink()


def test_out_never_replaces_a_file_encode_did_not_write(tmp_path: Path, tiny_text: Path, capsys: pytest.CaptureFixture[str]) -> None:
    captions = b'{"path": "a.png", "caption": "mine"}\n'
    (tmp_path / "captions.jsonl").write_bytes(captions)
    assert encode(tiny_text, tmp_path / "captions.json", "a text") == 2
    assert one_error(capsys) == (f"uform: error: {tmp_path}/captions.jsonl: exists and is not a file of an earlier "
                                 f"`uform encode --out {tmp_path}/captions`; not replaced (--force replaces it)")  # fmt: skip
    assert snapshot(tmp_path) == {"captions.jsonl": captions}
    deep = ("[" * 100_000 + "]" * 100_000).encode()  # a manifest-named file nested past the stack: not ours, not a crash
    (tmp_path / "captions.json").write_bytes(deep)
    assert encode(tiny_text, tmp_path / "captions.json", "a text") == 2
    assert one_error(capsys).startswith(f"uform: error: {tmp_path}/captions.json")
    (tmp_path / "captions.json").unlink()
    assert encode(tiny_text, tmp_path / "captions.json", "a text", extra=("--force",)) == 0
    assert [r["text"] for r in read_saved(tmp_path / "captions").rows] == ["a text"]


@pytest.mark.parametrize("out", ["", ".", "..", "sub/", "sub/.."])
def test_out_must_name_a_file(out: str, tmp_path: Path, tiny_text: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    assert main(["encode", "a text", "--out", out, "-m", str(tiny_text), "-q"]) == 2
    assert one_error(capsys).startswith(f"uform: error: --out {out!r} names no file: give a name")
    assert os.listdir(tmp_path) == ["sub"] and os.listdir(tmp_path / "sub") == []


def test_a_new_set_replaces_the_old_whole(tmp_path: Path, tiny_text: Path) -> None:
    assert encode(tiny_text, tmp_path / "e", "one", "two", extra=("--outputs-scalar", "i8")) == 0
    assert (tmp_path / "e.scales.npy").exists()
    assert encode(tiny_text, tmp_path / "e", "three") == 0  # f32: the old set's scales leave with it
    assert sorted(os.listdir(tmp_path)) == ["e.json", "e.jsonl", "e.npy"]
    saved = read_saved(tmp_path / "e")
    assert saved.scales is None and [r["text"] for r in saved.rows] == ["three"]
    manifest = json.loads((tmp_path / "e.json").read_text())
    assert manifest["files"]["e.npy"]["bytes"] == (tmp_path / "e.npy").stat().st_size


def test_a_mixed_set_is_refused_naming_the_member(tmp_path: Path, tiny_text: Path) -> None:
    assert encode(tiny_text, tmp_path / "a", "one") == 0
    assert encode(tiny_text, tmp_path / "b", "two") == 0
    os.replace(tmp_path / "b.npy", tmp_path / "a.npy")  # a set caught mid-replacement: a's manifest, b's rows
    with pytest.raises(ValueError, match=f"^{tmp_path}/a.npy: does not match its manifest {tmp_path}/a.json"):
        read_saved(tmp_path / "a")


# -- uform new, calibrate --out ------------------------------------------------------------


def test_new_refuses_a_file_that_is_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert main(["new", str(notes), "-q"]) == 2
    assert one_error(capsys) == f"uform: error: {notes}: exists and is not a uform checkpoint; not replaced (--force replaces it)"
    assert notes.read_text() == "my notes\n"
    assert main(["new", str(notes), "-q", "--force"]) == 0
    assert main(["new", str(notes), "-q", "--seed", "1"]) == 0  # a checkpoint now: replaced without --force


def test_new_and_calibrate_refuse_what_force_cannot_replace_without_offering_force(
    tmp_path: Path, tiny_text: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A read-only file that is not a checkpoint: the refusal said '(--force replaces it)', and
    --force then refused it as read-only."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    notes.chmod(0o444)
    examples = tmp_path / "examples.jsonl"
    examples.write_text('{"text": "Answer:", "choices": "AB", "answer": 0}\n')
    read_only = f"uform: error: {notes}: read-only; left as it was (make it writable, or write elsewhere)"
    for extra in ([], ["--force"]):
        assert main(["new", str(notes), "-q", *extra]) == 2
        assert one_error(capsys) == read_only
        assert main(["calibrate", str(tiny_text), str(examples), "--out", str(notes), "-q", *extra]) == 2
        assert one_error(capsys) == read_only
    assert notes.read_text() == "my notes\n"


def test_new_and_calibrate_refuse_an_out_that_names_a_folder_or_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'out/' was written as the file 'out' (pathlib drops the slash); '' read as '.'."""
    folder = f"{tmp_path / 'out'}/"
    assert main(["new", folder, "-q"]) == 2
    assert one_error(capsys) == f"uform: error: {folder} names a folder (it ends in '/'): name the .safetensors file to write"
    assert main(["new", "", "-q"]) == 2
    assert one_error(capsys) == "uform: error: the checkpoint path is empty: name the .safetensors file to write"
    assert main(["calibrate", "examples.jsonl", "--out", folder, "-q"]) == 2
    assert "names a folder" in one_error(capsys)
    assert not (tmp_path / "out").exists()


def test_new_under_a_file_size_limit_keeps_the_old_checkpoint(under_limits: dict[str, tuple[int, str, Path, dict[str, bytes]]]) -> None:
    code, err, folder, before = under_limits["new"]
    assert (code, err) == (2, "uform: error: partial.safetensors: not written (File too large); the old file is as it was\n")
    assert snapshot(folder) == before


def test_calibrate_out_refuses_a_file_that_is_not_a_checkpoint(tmp_path: Path, tiny_text: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = tmp_path / "examples.jsonl"
    examples.write_text('{"text": "q", "choices": "ab", "answer": "a"}\n')
    out = tmp_path / "out.txt"
    out.write_text("keep\n")
    assert main(["calibrate", str(tiny_text), str(examples), "--out", str(out), "-q"]) == 2
    assert one_error(capsys) == f"uform: error: {out}: exists and is not a uform checkpoint; not replaced (--force replaces it)"
    assert out.read_text() == "keep\n"


# -- uform export ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A good tiny text checkpoint and three bad ones made from it: truncated, garbled, NaN."""
    folder = tmp_path_factory.mktemp("export")
    good = make_checkpoint(folder / "good.safetensors", "tiny", 0, ["text"])
    data = good.read_bytes()
    start = 8 + struct.unpack("<Q", data[:8])[0]
    (folder / "truncated.safetensors").write_bytes(data[: start + (len(data) - start) // 2])
    (folder / "garbled.safetensors").write_bytes(data[:start] + b"\xff" * 4096 + data[start + 4096 :])
    (folder / "nan.safetensors").write_bytes(data[:start] + b"\xc0\x7f" * ((len(data) - start) // 2))
    return {p.stem: p for p in folder.iterdir()}


@pytest.mark.parametrize(
    ("name", "reason"),
    [("truncated", "not a valid safetensors checkpoint"), ("garbled", "holds NaN or infinite values"),
     ("nan", "holds NaN or infinite values"), ("missing", "no such checkpoint file")],
)  # fmt: skip
def test_export_of_a_bad_checkpoint_is_one_line_and_leaves_no_folder(
    name: str, reason: str, checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = checkpoints["good"].parent / f"{name}.safetensors"
    assert main(["export", str(checkpoint), str(tmp_path / "DIR"), "-q"]) == 2
    err = one_error(capsys)
    assert err.startswith(f"uform: error: {checkpoint}: ") and reason in err, err
    assert list(tmp_path.iterdir()) == []


def test_export_replaces_only_an_earlier_export_whole(checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "towers"
    assert main(["export", str(checkpoints["good"]), str(out), "-q"]) == 0
    assert sorted(os.listdir(out)) == ["text.json", "text.onnx"]
    assert main(["export", str(checkpoints["good"]), str(out), "--quantization", "bf16", "-q"]) == 0
    assert json.loads((out / "text.json").read_text())["weights"] == "bf16"
    for description in ("{}", "[" * 100_000 + "]" * 100_000):  # not an export's description now: its tower's files are not ours
        (out / "text.json").write_text(description)
        capsys.readouterr()
        assert main(["export", str(checkpoints["good"]), str(out), "-q"]) == 2
        assert "text.onnx: exists and is not a file of an earlier `uform export`; not replaced (--force replaces it)" in one_error(capsys)
    assert main(["export", str(checkpoints["good"]), str(out), "-q", "--force"]) == 0


def test_export_under_a_file_size_limit_keeps_the_earlier_export(under_limits: dict[str, tuple[int, str, Path, dict[str, bytes]]]) -> None:
    code, err, folder, before = under_limits["export"]
    assert code == 2 and err.startswith("uform: error: towers/text.onnx: not written (File too large)"), err
    assert snapshot(folder) == before


def test_demo_media_under_a_file_size_limit_leaves_nothing(under_limits: dict[str, tuple[int, str, Path, dict[str, bytes]]]) -> None:
    code, err, folder, before = under_limits["demo"]
    assert code == 2 and err.startswith("uform: error: demo/") and "not written (File too large)" in err, err
    assert before == {} and list(folder.iterdir()) == []


def test_nothing_of_a_set_is_left_when_numpy_fails(tmp_path: Path) -> None:
    with pytest.raises(ValueError), Outputs() as out:
        with out.open(tmp_path / "x.npy") as f:
            np.save(f, np.zeros(3, object), allow_pickle=False)
    assert list(tmp_path.iterdir()) == []


def test_a_records_value_field_is_named_in_one_place() -> None:
    """``text`` for a text, ``path`` for a file or a folder: the rows encode writes, the failures
    it records and the rows read back ask uform.items.value_key (it was written three times:
    Item.record, Failure.record and cli.saved.row_key)."""
    from uform.cli.saved import row_key
    from uform.inputs import Failure, Item

    assert Item("text", "a cat").record() == {"kind": "text", "modality": "text", "text": "a cat"}
    assert Item("image", "x.png").record() == {"kind": "file", "modality": "image", "path": "x.png"}
    assert Failure("folder", "d", "cannot list the folder").record() == {"kind": "folder", "path": "d", "reason": "cannot list the folder"}
    assert [row_key({"kind": kind}) for kind in ("text", "file", None)] == ["text", "path", "path"]

