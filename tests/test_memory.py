"""describe().memory_usage is the bytes really held: measured as resident memory growth.

Each load runs in a fresh process so that nothing else grows or shrinks the heap. Which
backend serves bf16 and e4m3 depends on the machine (the op library, its kernels for the
CPU class); describe().quantization says what is held, and the bounds follow it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt import make_checkpoint

PROBE = """
import json, sys
def anon():
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('RssAnon'))
import uform, onnxruntime  # imports first, so only the load is measured
before = anon()
model = uform.Model.load_ram(sys.argv[1], quantization=sys.argv[2])
d = model.describe()
print(json.dumps({"grew": anon() - before, "memory_usage": d.memory_usage, "held": d.quantization.value}))
"""

# bytes held per stored (BF16) byte, by the scalar the weights are held in, and the most the
# process may grow by per byte of the file (docs/op-library.md, "What it holds"; docs/backends.md, "CPU backend")
HELD_PER_BYTE = {"f32": 2.0, "bf16": 1.0, "e4m3": 0.5}
GROWTH_BOUND = {"f32": 2.1, "bf16": 1.1, "e4m3": 0.6}
# bf16 is held as stored by the e4m3 backend, widened to f32 by the cpu backend without the op library
SERVED_AS = {"f32": ("f32",), "bf16": ("bf16", "f32"), "e4m3": ("e4m3",)}


@pytest.fixture(scope="module")
def base_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("memory") / "base-text.safetensors", "base", 0, ["text"])


@pytest.mark.parametrize("quantization", ["f32", "bf16", "e4m3"])
def test_resident_growth_matches_memory_usage(base_text: Path, quantization: str) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, str(base_text), quantization], capture_output=True, text=True, check=True)
    measured = json.loads(out.stdout)
    file_size = base_text.stat().st_size
    held = measured["held"]
    assert held in SERVED_AS[quantization]
    # the weights in the scalar they are held in (plus the float32 norms and biases, and
    # E4M3's scales), and nothing of the file itself
    expected = HELD_PER_BYTE[held] * file_size
    assert abs(measured["memory_usage"] - expected) < 0.06 * file_size, measured
    assert abs(measured["grew"] - measured["memory_usage"]) < 0.08 * measured["memory_usage"], measured
    assert measured["grew"] <= GROWTH_BOUND[held] * file_size, measured
