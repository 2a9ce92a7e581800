"""describe().memory_usage is the bytes really held: measured as resident memory growth."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ckpt import make_checkpoint

PROBE = """
import json, sys
def anon():
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('RssAnon'))
import uform, onnxruntime  # imports first, so only the load is measured
before = anon()
model = uform.Model.load_ram(sys.argv[1])
print(json.dumps({"grew": anon() - before, "memory_usage": model.describe().memory_usage}))
"""


def test_resident_growth_matches_memory_usage(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "base-text.safetensors", "base", 0, ["text"])
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=True)
    measured = json.loads(out.stdout)
    file_size = path.stat().st_size
    # one float32 copy of the BF16 weights: twice the file, and nothing of the file itself
    assert abs(measured["memory_usage"] - 2 * file_size) < 0.01 * file_size
    assert abs(measured["grew"] - measured["memory_usage"]) < 0.08 * measured["memory_usage"], measured
