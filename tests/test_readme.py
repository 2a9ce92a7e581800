"""The README's examples run as written: its Python example, and its first set-up command's
search on the default model gives the output the README shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import uform
from uform.cli import main

README = Path(__file__).parents[1] / "README.md"


def blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language`` ("" for a fence without one), in order."""
    found, current, open_as = [], [], None
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            if open_as is None:
                open_as, current = line[3:].strip(), []
            else:
                if open_as == language:
                    found.append("\n".join(current) + "\n")
                open_as = None
        elif open_as is not None:
            current.append(line)
    return found


def test_the_python_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = blocks("python")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "ModelDescription(" in out and "TextEncodeStats(" in out
    assert (tmp_path / "demo" / "captions.jsonl").is_file()


def test_the_first_command_shows_what_it_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    command = blocks("sh")[0].strip()
    assert command == 'pip install -e . && uform demo-media demo && uform search "a red circle" demo -k 5'
    shown = blocks("")[0].strip().splitlines()
    monkeypatch.chdir(tmp_path)
    assert main(["demo-media", "demo"]) == 0
    demo = (Path(__file__).parents[1] / "docs" / "demo.md").read_text()
    named = re.findall(r"`((?:image|video|audio)-\d\d-[a-z-]+\.\w+)`", demo.split("File names say what a file holds")[1][:200])
    assert len(named) == 3 and all((tmp_path / "demo" / n).is_file() for n in named), named  # the names it gives are written
    assert main(["search", "a red circle", "demo", "-k", "5"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[0] == shown[0] and len(printed) == len(shown) == 6
    got = {row.split()[2]: (int(row.split()[0]), float(row.split()[1])) for row in printed[1:]}
    want = {row.split()[2]: (int(row.split()[0]), float(row.split()[1])) for row in shown[1:]}
    assert got.keys() == want.keys()
    for path, (rank, score) in got.items():  # the kernels of another CPU round a little differently:
        assert score == pytest.approx(want[path][1], abs=0.01)  # scores within 0.01, and ranks
        assert rank == want[path][0] or abs(score - next(s for r, s in got.values() if r == want[path][0])) < 0.02  # but near ties


def test_the_evaluation_shows_what_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert blocks("sh")[2].strip() == "uform evaluate --suite both"
    shown = blocks("")[1].strip().splitlines()
    assert main(["evaluate", "--suite", "both"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == len(shown) == 17
    held = uform.Model.load_ram().describe().quantization.value  # bf16, or f32 where the op library cannot serve
    assert printed[0].split("/")[-1].split(",")[0] == shown[0].split("/")[-1].split(",")[0].replace("(bf16", f"({held}")  # the model and its weights' scalar
    for got, want in zip(printed[1:], shown[1:]):
        assert got.split()[:1] == want.split()[:1]
        if got.endswith(" s"):  # the suite, items and seed; not the seconds
            assert got.split(",")[:3] == want.split(",")[:3]
        elif got.startswith(("text", "direction")):
            assert got.split()[-1] == want.split()[-1]  # queries, questions, clips
            # figures: the kernels of another CPU may round a few embeddings differently; and the
            # own suite's clips are re-encoded to MP4 on every run, by an encoder whose bytes differ
            # from run to run for some clips, which can move near ties of text→video
            slack = 0.1 if got.startswith(("text→video", "direction")) else 0.03
            numbers = [float(v) for v in got.split()[1:-1]]
            assert numbers == pytest.approx([float(v) for v in want.split()[1:-1]], abs=slack)
