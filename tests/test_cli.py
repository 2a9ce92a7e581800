"""The uform command: new, similarity, and errors as one line with exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from uform.cli import main


def test_new_then_similarity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.safetensors"
    assert main(["new", str(out), "--preset", "tiny", "--seed", "3", "--modalities", "text"]) == 0
    assert "preset tiny, seed 3, towers text, 88,704 parameters" in capsys.readouterr().out
    assert main(["similarity", str(out), "a cat", "a dog", "a cat"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("a cat") and lines[1].split()[2] == "1.000"  # the diagonal
    assert lines[1].split()[2:] == lines[3].split()[2:]  # the same text twice: the same row
    assert "3 texts, 32 dimensions" in lines[-1]


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    assert main(["similarity", str(bad), "a"]) == 2
    assert capsys.readouterr().err.strip() == "uform: error: not a valid safetensors checkpoint: header is not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
    assert main(["new", str(tmp_path / "x.safetensors"), "--modalities", "smell"]) == 2
    assert "no installed plugin provides the modalities ['smell']" in capsys.readouterr().err
