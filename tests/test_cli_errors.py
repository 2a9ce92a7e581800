"""Errors that name the file and line, never a traceback (issue 58): a damaged encode output, a
calibration file with a byte that is not UTF-8, file names that are not UTF-8 or hold a newline
(printed escaped, one line a hit, the same on stdout, stderr and in JSON), and Ctrl-C while the
command's modules load."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from ckpt import make_checkpoint
from uform.cli import main
from uform.cli.common import printable

ROOT = Path(__file__).resolve().parent.parent
NOT_UTF8 = os.fsdecode(b"r\xffd.png")  # a file name that is not UTF-8, as Python names it


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint and an encode output of three texts beside it, ``out``."""
    folder = tmp_path_factory.mktemp("saved")
    checkpoint = make_checkpoint(folder / "tiny.safetensors", "tiny", 0, ["text", "image"])
    assert main(["encode", "one", "two", "three", "--out", str(folder / "out"), "-m", str(checkpoint), "-q"]) == 0
    return folder


def damaged(saved: Path, tmp_path: Path, member: str, change: object) -> Path:
    """A copy of the output with ``member`` (``json`` or ``jsonl``) changed, the manifest's
    digests dropped so the reader reaches the fault itself."""
    for suffix in ("npy", "jsonl", "json"):
        (tmp_path / f"out.{suffix}").write_bytes((saved / f"out.{suffix}").read_bytes())
    manifest = json.loads((tmp_path / "out.json").read_text())
    del manifest["files"]
    (tmp_path / "out.json").write_text(json.dumps(manifest, indent=2))
    path = tmp_path / f"out.{member}"
    path.write_bytes(change(path.read_bytes()))  # type: ignore[operator]
    return tmp_path / "out"


def drop(key: str) -> object:
    return lambda data: json.dumps({k: v for k, v in json.loads(data).items() if k != key}).encode()


def set_field(key: str, value: object) -> object:
    return lambda data: json.dumps(json.loads(data) | {key: value}).encode()


ROWS = "{d}/out.npy: holds float32 rows of shape (3, 32), not the {scalar} rows of {n} dimensions that {d}/out.json says; encode again"


@pytest.mark.parametrize(
    ("member", "change", "message"),
    [
        ("json", drop("npy"), "{d}/out.json: the manifest's 'npy' is missing"),
        ("json", drop("index"), "{d}/out.json: the manifest's 'index' is missing"),
        ("json", lambda b: b.replace(b'"scalar"', b'"sc\xffalar"'), "{d}/out.json:4: not UTF-8 (byte 0xff, byte 6 of the line)"),
        ("json", lambda b: b.replace(b'"rows": 3,', b'"rows": 3,,'), "{d}/out.json: not JSON (Expecting property name enclosed in double quotes at line 3 column 13)"),
        ("jsonl", lambda b: b.replace(b'"text": "two"', b'"pth": "two"'), "{d}/out.jsonl:2: expected an object with a modality and a path (or a text)"),
        ("jsonl", lambda b: b.replace(b"three", b"thr\xffe"), "{d}/out.jsonl:3: not UTF-8 (byte 0xff, byte 60 of the line)"),
        ("jsonl", lambda b: b.replace(b'{"row": 1', b'{row: 1'), "{d}/out.jsonl:2: not JSON (Expecting property name enclosed in double quotes at column 2)"),
        ("json", lambda b: b.replace(b'"out.npy"', b'"../out.npy"'), "{d}/out.json: the manifest's 'npy' must name a file beside it; got '../out.npy'"),
        # a manifest whose scalar or dimensions are not its rows': numpy's matmul or bitwise_xor error, naming no file
        ("json", set_field("dimensions", 16), ROWS.format(d="{d}", scalar="f32", n=16)),
        ("json", set_field("dimensions", 1000), ROWS.format(d="{d}", scalar="f32", n=1000)),
        ("json", set_field("scalar", "b1"), ROWS.format(d="{d}", scalar="b1", n=32)),
    ],
)  # fmt: skip
def test_a_damaged_encode_output_names_the_file_and_line(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], member: str, change: object, message: str
) -> None:
    prefix = damaged(saved, tmp_path, member, change)
    code = main(["search", "a query", str(prefix), "-m", str(saved / "tiny.safetensors"), "-q"])
    assert (code, error_line(capsys)) == (2, "uform: error: " + message.format(d=tmp_path))


@pytest.mark.parametrize("query", ["", " \t"])
def test_an_empty_query_is_refused(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], query: str) -> None:
    """``uform search "$UNSET" photos/`` ranked every item by an empty text's embedding, scores that mean nothing."""
    model = ["-m", str(saved / "tiny.safetensors"), "-q"]
    Image.fromarray(np.full((32, 32, 3), 200, np.uint8)).save(tmp_path / "grey.png")
    assert main(["index", str(tmp_path / "grey.png"), "--into", str(tmp_path / "idx"), *model]) == 0
    capsys.readouterr()
    expected = f"uform: error: QUERY '{printable(query)}' is empty: give the text to search for"
    assert (main(["search", query, str(tmp_path / "grey.png"), *model]), error_line(capsys)) == (2, expected)
    assert (main(["search", query, "--index", str(tmp_path / "idx"), *model]), error_line(capsys)) == (2, expected)


def test_a_query_that_is_not_utf8_is_named(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A QUERY in another encoding was "item 0: text is not encodable as UTF-8 (surrogates not allowed at 2)"."""
    model = ["-m", str(saved / "tiny.safetensors"), "-q"]
    Image.fromarray(np.full((32, 32, 3), 200, np.uint8)).save(tmp_path / "grey.png")
    query = os.fsdecode(b"ab\xffc")  # as Python gives such an argument
    expected = "uform: error: QUERY 'ab\\xffc' is not valid UTF-8 (a command-line argument in another encoding)"
    assert (main(["search", query, str(tmp_path / "grey.png"), *model]), error_line(capsys)) == (2, expected)


def test_calibrate_names_the_line_of_a_byte_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = tmp_path / "examples.jsonl"
    line = '{"text": "q", "choices": "ab", "answer": "a"}\n'
    examples.write_bytes((line * 2 + line.replace("q", "\udcff")).encode("utf-8", "surrogateescape"))
    assert main(["calibrate", str(examples), "--out", str(tmp_path / "out.safetensors"), "-q"]) == 2
    assert error_line(capsys) == f"uform: error: {examples}:3: not UTF-8 (byte 0xff, byte 11 of the line)"
    assert not (tmp_path / "out.safetensors").exists()


def test_calibrate_names_the_line_of_json_nested_too_deeply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = tmp_path / "examples.jsonl"
    examples.write_text('{"text": "q", "choices": "ab", "answer": "a"}\n' + "[" * 100_000 + "\n")
    assert main(["calibrate", str(examples), "--out", str(tmp_path / "out.safetensors"), "-q"]) == 2
    assert error_line(capsys) == f"uform: error: {examples}:2: not JSON (nested too deeply)"


def test_printable_names() -> None:
    assert printable("demo/a red circle.png") == "demo/a red circle.png"
    assert printable(NOT_UTF8) == "r\\xffd.png"
    assert printable("two\nlines\r\t.png") == "two\\nlines\\r\\t.png"
    assert printable("back\\slash") == "back\\\\slash"
    assert printable("\x85\x7f\u2028é") == "\\u0085\\x7f\\u2028é"  # C1 and DEL and a line separator; é is printable
    names = ["\x85", os.fsdecode(b"\x85"), "\\x85", "\n", "\\n"]
    assert len({printable(n) for n in names}) == len(names)


@pytest.fixture(scope="module")
def oddly_named(saved: Path) -> Path:
    folder = saved / "odd"
    folder.mkdir()
    for name, rgb in ((NOT_UTF8, (220, 20, 20)), ("two\nlines.png", (20, 20, 220)), ("plain.png", (20, 200, 20))):
        Image.fromarray(np.full((32, 32, 3), rgb, np.uint8)).save(folder / name, format="PNG")
    (folder / "bad\nname.png").write_bytes(b"not a picture")
    return folder


SEARCH_TWICE = """
import sys
from uform.cli import main
args = ["search", "red", "odd", "-m", "tiny.safetensors", "-k", "0", "-q"]
codes = [main(args)]
print("-- json --", flush=True)
codes.append(main([*args, "--json"]))
print(codes, file=sys.stderr)
"""


def test_search_prints_odd_names_escaped_one_line_a_hit(saved: Path, oddly_named: Path) -> None:
    """Under a strict UTF-8 stdout (PYTHONIOENCODING=utf-8), as issue 58 ran it."""
    env = os.environ | {"PYTHONIOENCODING": "utf-8", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", SEARCH_TWICE], cwd=saved, env=env, capture_output=True)
    assert run.returncode == 0, run.stderr
    plain, as_json = run.stdout.decode().split("-- json --\n")
    err = run.stderr.decode().splitlines()
    assert err[-1] == "[1, 1]"  # the bad picture failed, both times
    lines = plain.splitlines()
    assert len(lines) == 3
    assert sorted(line.split("  ")[-1] for line in lines) == ["odd/plain.png", "odd/r\\xffd.png", "odd/two\\nlines.png"]
    assert err[0].startswith("uform: failed: file odd/bad\\nname.png: not a ") and err[1] == "uform: 1 failed (reported above)", err
    assert sorted(r["path"] for r in json.loads(as_json)) == ["odd/plain.png", "odd/r\\xffd.png", "odd/two\\nlines.png"]


# A command started in the background by a non-interactive shell (`pytest ... &` in a script, as
# CI runners and nohup'd runs start it) inherits SIGINT ignored, and Python keeps it so: the
# kill below then did nothing and the test failed ('uform 4.0.0rc1', status 0). Ctrl-C reaches a
# command run at a terminal, whose SIGINT is Python's own handler: the hook sets it so.
HOOK = """
import os, runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, arriving while this module loads
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["uform", "--version"]
runpy.run_module({entry!r}, run_name="__main__")
"""


@pytest.mark.parametrize(("entry", "module"), [("uform_command", "numpy"), ("uform_command", "onnx"), ("uform.cli", "uform.cli.checkpoints")])
def test_ctrl_c_while_the_command_loads(entry: str, module: str) -> None:
    run = subprocess.run([sys.executable, "-c", HOOK.format(module=module, entry=entry)], cwd=ROOT, capture_output=True, text=True,
                         env=os.environ | {"PYTHONPATH": str(ROOT)})  # fmt: skip
    assert (run.returncode, run.stderr, run.stdout) == (130, "uform: interrupted\n", "")


def strict_json(data: bytes) -> Any:
    """``data`` parsed as a reader other than Python's takes it: UTF-8, and no string holding a
    lone surrogate (which Rust's serde_json refuses and jq turns into U+FFFD)."""
    value = json.loads(data.decode("utf-8"))
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate
    return value


def test_encode_writes_names_that_are_not_utf8_as_valid_json_that_reads_back(saved: Path, oddly_named: Path, capsys: pytest.CaptureFixture[str],
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """OUT.jsonl and OUT.json held such a name as the lone surrogate "\\udcff": JSON no other reader
    could take back to the file."""
    monkeypatch.chdir(saved)
    odd = saved / "odd-more"
    odd.mkdir()
    (odd / os.fsdecode(b"\xfe.txt")).write_text("passed over")
    (odd / os.fsdecode(b"\xfdbad.png")).write_bytes(b"not a picture")
    text = os.fsdecode(b"caf\xe9")  # a Latin-1 argument
    out = saved / "odd-emb"
    assert main(["encode", "odd", "odd-more", text, "--out", str(out), "-m", str(saved / "tiny.safetensors"), "-q"]) == 1
    capsys.readouterr()
    rows = [strict_json(line) for line in Path(f"{out}.jsonl").read_bytes().splitlines()]
    named = [r for r in rows if "path_hex" in r]
    assert named == [{"row": named[0]["row"], "kind": "file", "modality": "image", "path": "odd/r\\xffd.png", "path_hex": b"odd/r\xffd.png".hex()}]
    manifest = strict_json(Path(f"{out}.json").read_bytes())
    assert isinstance(manifest, dict)
    failed = {f.get("path", f.get("text")): f for f in manifest["failed"]}
    assert failed["odd-more/\\xfdbad.png"]["path_hex"] == b"odd-more/\xfdbad.png".hex()
    assert failed["caf\\xe9"]["text_hex"] == b"caf\xe9".hex() and failed["caf\\xe9"]["kind"] == "text"
    assert manifest["skipped"] == [{"path": "odd-more/\\xfe.txt", "path_hex": b"odd-more/\xfe.txt".hex(), "reason": "unknown extension"}]
    from uform.cli.encode import read_saved

    back = [r["path"] for r in read_saved(out).rows if r["kind"] == "file"]
    assert sorted(back) == sorted(["odd/plain.png", "odd/two\nlines.png", "odd/" + NOT_UTF8]) and os.path.isfile(saved / back[back.index("odd/" + NOT_UTF8)])
    assert main(["search", "red", str(out), "-m", str(saved / "tiny.safetensors"), "-k", "0", "--json", "-q"]) == 0
    assert sorted(r["path"] for r in json.loads(capsys.readouterr().out)) == ["odd/plain.png", "odd/r\\xffd.png", "odd/two\\nlines.png"]


def test_describe_names_a_checkpoint_that_is_not_utf8_escaped(saved: Path) -> None:
    """describe printed such a path as the lone surrogate "\\udcfe" in --json, and failed on a strict stdout ('utf-8' codec can't encode)."""
    (saved / os.fsdecode(b"m\xfe.safetensors")).write_bytes((saved / "tiny.safetensors").read_bytes())
    env = os.environ | {"PYTHONIOENCODING": "utf-8", "PYTHONPATH": str(ROOT)}
    describe = [sys.executable, "-m", "uform.cli", "describe", "-m", os.fsdecode(b"m\xfe.safetensors")]
    plain = subprocess.run(describe, cwd=saved, env=env, capture_output=True, text=True)
    assert (plain.returncode, plain.stderr, plain.stdout.splitlines()[0].split()) == (0, "", ["model", "m\\xfe.safetensors"])
    as_json = subprocess.run([*describe, "--json"], cwd=saved, env=env, capture_output=True)
    assert as_json.returncode == 0 and strict_json(as_json.stdout)["model"] == "m\\xfe.safetensors"


def test_an_output_named_in_another_encoding_is_written_read_and_replaced(saved: Path, capsys: pytest.CaptureFixture[str],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """--out of a name that is not UTF-8: the manifest names its members as they print, with their
    bytes beside them, and search, read_saved and the next encode find them by those bytes."""
    monkeypatch.chdir(saved)
    out, model = os.fsdecode(b"\xffemb"), ["-m", "tiny.safetensors", "-q"]
    assert main(["encode", "one", "two", "--out", out, "--outputs-scalar", "i8", *model]) == 0
    manifest = strict_json(Path(f"{out}.json").read_bytes())
    assert (manifest["npy"], manifest["npy_hex"], manifest["scales"], manifest["index_hex"]) == ("\\xffemb.npy", b"\xffemb.npy".hex(), "\\xffemb.scales.npy", b"\xffemb.jsonl".hex())
    assert sorted(manifest["files"]) == ["\\xffemb.jsonl", "\\xffemb.npy", "\\xffemb.scales.npy"]
    capsys.readouterr()
    assert main(["encode", "one", "two", "--out", out, *model]) == 0  # its own earlier output: replaced without --force
    assert capsys.readouterr().out.startswith("wrote \\xffemb.npy, \\xffemb.jsonl, \\xffemb.json: 2 rows")
    assert not Path(f"{out}.scales.npy").exists()
    from uform.cli.encode import read_saved

    back = read_saved(out)
    assert (back.manifest["npy"], [r["text"] for r in back.rows], back.embeddings.shape[0]) == (f"{out}.npy", ["one", "two"], 2)
    bad = Path(f"{out}.json").read_text().replace(b"\xffemb.npy".hex(), "2e2e2f656d622e6e7079")  # ../emb.npy
    Path(f"{out}.json").write_text(bad)
    with pytest.raises(ValueError, match=r"the manifest's 'npy' must name a file beside it; got '\.\./emb\.npy'"):
        read_saved(out)


@pytest.mark.parametrize(
    "argv",
    [["describe", "--model", ""], ["similarity", "a", "b", "--model", ""], ["index", "notes.txt", "--into", "idx", "--model", ""],
     ["export", "", "out"], ["calibrate", "", "examples.jsonl", "--out", "new.safetensors"]],
    ids=["describe", "similarity", "index", "export", "calibrate"],
)  # fmt: skip
def test_an_empty_model_path_is_refused_by_name(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # Path('') is the current folder: nothing here may be read as a checkpoint
    assert main(argv) == 2
    assert re.search(r"argument (-m/--model|checkpoint): the checkpoint path is empty", capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []
