"""benchmarks/serve.py runs end to end on tiny settings (its numbers are not judged here:
docs/benchmarks.md has a full run's), with the asyncio load generator so that wrk is not needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "serve.py"


def test_serve_benchmark_runs(tmp_path: Path) -> None:
    env = {**os.environ, "UFORM_BENCHMARK_RESULTS": str(tmp_path)}
    args = ["--seconds", "0.3", "--clients", "1,32", "--memory-requests", "200", "--client", "asyncio", "--paired-rounds", "2"]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / "serve.json").read_text())
    assert {"in_process", "texts", "images_640x480_jpeg", "memory", "texts_batching_off", "frameworks", "goals"} <= set(result)
    assert [row["clients"] for row in result["texts"]] == [1, 32]
    assert all(row["errors"] == 0 and row["requests"] > 0 for row in result["texts"] + result["images_640x480_jpeg"])
    assert result["memory"]["requests"] == 200 and len(result["memory"]["rss_mib"]) == 10
    assert result["goals"]["clients"] == 32 and result["goals"]["throughput_vs_batching_off"] > 0
    assert [row["clients"] for row in result["paired_rounds"]] == [32, 32] and result["goals"]["throughput_vs_batching_off_paired_median"] > 0
    assert all(row["in_process_cpu_ms_per_text_batch64"] > 0 and row["server_cpu_vs_in_process_batch64"] > 0 for row in result["paired_rounds"])
    assert result["goals"]["server_cpu_vs_in_process_batch64_paired_median"] > 0 and "server_cpu_goal_met_paired" in result["goals"]


def test_serve_benchmark_guard_rounds_run(tmp_path: Path) -> None:
    """``--texts-only --guard-rounds``: the server with its guard and without it, in turns."""
    env = {**os.environ, "UFORM_BENCHMARK_RESULTS": str(tmp_path)}
    args = ["--seconds", "0.3", "--clients", "32", "--client", "asyncio", "--texts-only", "--guard-rounds", "1"]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    guard = json.loads((tmp_path / "serve-guard.json").read_text())["guard"]
    assert [row["round"] for row in guard["rounds"]] == [0]
    assert all(row[f"{name}_errors"] == 0 and row[f"{name}_rps"] > 0 for row in guard["rounds"] for name in ("guard", "no_guard"))
    assert guard["median_ratios"]["cpu_guard_over_no_guard"] > 0
