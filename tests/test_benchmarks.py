"""Every benchmark script runs end to end on tiny inputs (numbers are not judged here: a
benchmark that no longer runs is what this catches). Results go to a temporary folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
RUNS = {  # script → (smallest arguments, keys its result file must have)
    "text": (["--presets", "tiny", "--seconds", "0.02", "--rounds", "1"], {"peak_gflops", "runs", "batch64_vs_batch1"}),
    "audio": (["--presets", "tiny", "--items", "4", "--threads", "1", "--seconds", "0.02"], {"items", "presets"}),
    "choose": (["--presets", "tiny", "--seconds", "0.02", "--examples", "200"], {"throughput", "calibration"}),
    "lowp": (
        ["--towers", "text:tiny,image:tiny", "--seconds", "0.02", "--parts", "towers,turns,queries,kernels,huge-pages,epilogues",
         "--runs", "uform f32,uform bf16,uform e4m3 dql,ort int8 nbits,torch bf16 autocast,torch fp32 [avx2]"],
        {"variant", "cpu_class", "runs", "turns", "queries", "queries_interleaved", "kernels", "huge_pages", "epilogues"},
    ),  # fmt: skip
    "attention": (["--preset", "tiny", "--seconds", "0.02"], {"cpu_class", "preset"}),
    "media": (["--preset", "tiny", "--seconds", "0.02", "--images", "4", "--clips", "1"], {"images_640x480", "video_gop30", "video_gop250"}),
}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_runs(script: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if script == "media":
        pytest.importorskip("transformers")
    args, keys = RUNS[script]
    env = {**os.environ, "UFORM_BENCHMARK_RESULTS": str(tmp_path)}
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / f"{script}.json").read_text())
    assert keys <= set(result), sorted(result)
