"""benchmarks/clap.py's speed table (docs/models-clap.md, "Speed and conversion"): every load is
timed beside the others in turns, so that a column's ratio to F32 is not the machine's load
moving between runs timed minutes apart, and the E4M3 load has its column."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "clap.py"


def benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("clap_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_turns_time_every_run_once_a_round_each_round_starting_one_further(monkeypatch: pytest.MonkeyPatch) -> None:
    module = benchmark()
    clock = iter(range(1000))
    monkeypatch.setattr(module.time, "perf_counter", lambda: float(next(clock)))
    order: list[str] = []
    spent = {"f32": [5, 1, 3], "bf16": [2, 2, 2], "e4m3": [4, 6, 1]}  # each run's extra ticks, round by round

    def run(key: str) -> Any:
        def called() -> None:
            order.append(key)
            for _ in range(spent[key][sum(k == key for k in order) - 1]):
                next(clock)

        return called

    seconds = module.turns({key: run(key) for key in spent}, 3)
    assert order == ["f32", "bf16", "e4m3", "bf16", "e4m3", "f32", "e4m3", "f32", "bf16"]
    assert seconds == {"f32": 2.0, "bf16": 3.0, "e4m3": 2.0}  # the least of each run's rounds (ticks + 1)


def test_the_table_has_the_three_loads_side_by_side_with_their_ratios_to_f32() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, str(SCRIPT), "--small", "--texts", "2", "--clips", "1", "--rounds", "1", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert rows[0].startswith("| items a second (1 threads, load ")
    assert rows[0].endswith("| uform F32 load | uform BF16 load | uform E4M3 load | transformers float32 |"), rows[0]
    assert [row.split(" (")[0] for row in rows[2:]] == ["| text", "| audio"]
    for row in rows[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 5 and all(" F32)" in cell for cell in cells[2:4]), row


def test_the_profile_table_has_each_towers_three_loads_and_their_products() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, str(SCRIPT), "--small", "--texts", "2", "--clips", "1", "--rounds", "1", "--threads", "1", "--profile"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in done.stdout.splitlines() if line.startswith("|")}
    header = rows.pop("ms a call (1 threads, each node's least of 1 calls)")
    assert header.endswith("| text F32 | text BF16 | text E4M3 | audio F32 | audio BF16 | audio E4M3 |"), header
    for name in ("products", "all"):
        cells = [float(cell) for cell in rows[name].strip(" |").split(" | ")[1:]]
        assert len(cells) == 6 and all(ms > 0 for ms in cells), rows[name]
