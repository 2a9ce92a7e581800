"""The e4m3 backend's loads: BF16 and E4M3 through the library, the kernels each class picks,
the fallback graphs, pins, the CPU backend serving when the library cannot be used, E4M3's
accuracy against BF16, file loads that keep no matrix, and a weight that overflows named.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import uform
from uform import Arena, CPUClass, Scalar
from uform.plugins import e4m3

from oplibrary import LIBRARY, WHY_NOT, needs_library
from captions import captions


TEXTS = [f"caption {i}: " + "a red circle moves left " * (i % 5 + 1) for i in range(40)]


def embeddings(model: uform.Model) -> np.ndarray:
    return np.array(model.text_encode(TEXTS, Arena()).embeddings)


@needs_library
def test_bf16_and_e4m3_loads_run_on_the_library(tiny_text: Path) -> None:
    f32 = uform.Model.load_ram(tiny_text, quantization=Scalar.F32)
    held = uform.Model.load_ram(tiny_text)  # bf16, as stored
    quantized = uform.Model.load_ram(tiny_text, quantization=Scalar.E4M3)
    variant = e4m3.variant_of(CPUClass(held.describe().cpu_class))
    if variant is None:
        pytest.skip(f"the library has no kernels for this machine's class {held.describe().cpu_class}")
    for model, scalar in ((held, Scalar.BF16), (quantized, Scalar.E4M3)):
        assert model.describe().quantization == scalar
        assert (model.backend, model.compute) == ("e4m3", e4m3.COMPUTE[variant])
    assert (f32.describe().quantization, f32.backend) == (Scalar.F32, "cpu")
    reference, got_bf16, got_e4m3 = embeddings(f32), embeddings(held), embeddings(quantized)
    assert np.sum(reference * got_bf16, axis=1).min() > 0.9999
    assert np.sum(got_bf16 * got_e4m3, axis=1).min() > 0.99
    # E4M3 holds half the bytes of BF16's matrices (on a tiny tower the float32 norms, their
    # copy in the session and the panels' padding outweigh the matrices: compare the small one)
    from ckpt import make_checkpoint

    small = make_checkpoint(tiny_text.parent / "small-text-memory.safetensors", "small", 0, ["text"])
    bf16_bytes = uform.Model.load_ram(small).describe().memory_usage
    assert uform.Model.load_ram(small, quantization=Scalar.E4M3).describe().memory_usage < 0.75 * bf16_bytes


@needs_library
def test_uform_plugins_names_the_kernels_this_machine_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from uform.cli import main
    from uform.plugins.cpu import machine_classes

    best = machine_classes()[-1]
    main(["plugins"])
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("e4m3 (ram)"))
    variant = e4m3.variant_of(best)
    expected = f"{e4m3.compute_of(best, variant)} for {best}" if variant else f"no kernels for {best}"
    assert line.strip().startswith(f"e4m3 (ram): available ({expected}") and str(LIBRARY.path) in line  # type: ignore[union-attr]


@needs_library
def test_every_class_the_machine_runs_picks_its_kernels(tiny_text: Path) -> None:
    from uform.plugins.cpu import machine_classes

    for cls in machine_classes():
        model = uform.Model.load_ram(tiny_text, cpu_class=cls)
        variant = e4m3.variant_of(cls)
        assert model.describe().cpu_class == cls
        if variant is None:  # no kernels for the class: the cpu backend serves, in float32
            assert (model.backend, model.describe().quantization) == ("cpu", Scalar.F32)
        else:
            assert (model.backend, model.compute) == ("e4m3", e4m3.compute_of(cls, variant))


@needs_library
def test_the_fallback_graphs_compute_what_the_kernels_do(tiny_text: Path) -> None:
    """E4M3 through standard DequantizeLinear (the cpu backend) against the library's FMA
    kernels: the same codes and scales, float32 products both."""
    from uform.plugins.cpu import machine_classes

    fma = next((c for c in machine_classes() if e4m3.variant_of(c) in ("avx2", "avx2-split", "avx512")), None)
    if fma is None:
        pytest.skip("this machine runs no class with float32 FMA kernels")
    kernels = uform.Model.load_ram(tiny_text, quantization=Scalar.E4M3, cpu_class=fma)
    assert kernels.backend == "e4m3"
    fallback = run_without_library(tiny_text, "e4m3")
    assert (fallback["backend"], fallback["quantization"]) == ("cpu", "e4m3")
    np.testing.assert_allclose(np.array(fallback["embeddings"]), embeddings(kernels), atol=2e-5)


PROBE = """
import json, sys
import numpy as np
import uform
from uform.core.host import get_host
model = uform.Model.load_ram(sys.argv[1], quantization=sys.argv[2])
texts = json.loads(sys.argv[3])
e = np.array(model.text_encode(texts, uform.Arena()).embeddings)
backends = {b.name: b.probe() for b in get_host().backends.values()}
print(json.dumps({"backend": model.backend, "quantization": model.describe().quantization.value,
                  "embeddings": e.tolist(), "e4m3": backends.get("e4m3")}))
"""


def run_without_library(path: Path, quantization: str, library: str = "/nonexistent/libuform_ops.so") -> dict:  # type: ignore[type-arg]
    env = dict(os.environ, UFORM_OPS_LIBRARY=library)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), quantization, json.dumps(TEXTS)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["missing", "corrupt", "foreign", "older abi"])
def test_an_unusable_library_is_reported_and_the_cpu_backend_serves(tiny_text: Path, tmp_path: Path, kind: str) -> None:
    path = tmp_path / "libuform_ops.so"
    if kind == "corrupt":
        path.write_bytes(b"\x7fELF" + bytes(range(256)) * 8)
    elif kind == "foreign":  # a real shared library that is not uform's
        import _ctypes

        path = Path(_ctypes.__file__)
    elif kind == "older abi":
        if LIBRARY is None:
            pytest.skip(f"the op library is not usable here: {WHY_NOT}")
        path.write_bytes(LIBRARY.path.read_bytes().replace(b"uform_ops_abi", b"uform_ops_abX"))
    reason = {
        "missing": "no such file",
        "corrupt": "does not load",
        "foreign": "is not uform's op library",
        "older abi": "is not uform's op library",
    }[kind]
    for quantization, held in (("bf16", "f32"), ("e4m3", "e4m3")):
        got = run_without_library(tiny_text, quantization, str(path))
        assert got["backend"] == "cpu" and got["quantization"] == held
        assert reason in got["e4m3"]
    listed = subprocess.run(
        [sys.executable, "-m", "uform.cli", "plugins"], env=dict(os.environ, UFORM_OPS_LIBRARY=str(path)),
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "e4m3 (ram): unavailable" in listed and reason in listed


def test_a_pinned_class_beyond_the_machine_is_refused_by_name(
    tiny_text: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused by name, and no backend is logged as a plugin with a bug for it."""
    from uform.plugins import cpu

    monkeypatch.setattr(cpu, "CPUINFO", str(Path(__file__).parent / "data" / "cpuinfo" / "zen3-epyc-7r13.txt"))
    for quantization in (Scalar.BF16, Scalar.E4M3):
        with pytest.raises(uform.UnsupportedError, match="cpu_class x86-64-v4 is beyond this machine; the best class it runs is x86-64-v3"):
            uform.Model.load_ram(tiny_text, cpu_class=CPUClass.X86_64_V4, quantization=quantization)
    assert "has a bug" not in caplog.text


@needs_library
def test_e4m3_embeddings_stay_close_to_bf16(tmp_path: Path) -> None:
    """The accuracy floor of issue 10 on the small preset's text tower: mean cosine >= 0.995
    and minimum >= 0.98 between E4M3 and BF16 embeddings of 300 captions."""
    from ckpt import make_checkpoint

    path = make_checkpoint(tmp_path / "small-text.safetensors", "small", 0, ["text"])
    texts = captions(300)
    held = np.array(uform.Model.load_ram(path).text_encode(texts, Arena()).embeddings)
    quantized = np.array(uform.Model.load_ram(path, quantization=Scalar.E4M3).text_encode(texts, Arena()).embeddings)
    cosine = np.sum(held * quantized, axis=1)
    assert cosine.mean() >= 0.995 and cosine.min() >= 0.98, (cosine.mean(), cosine.min())


def test_e4m3_keeps_the_nearest_neighbours_of_the_default_model() -> None:
    """Issue 10's accuracy goals on a trained model (the shipped default) and realistic
    inputs: 1,000 distinct questions of its own domain, E4M3 against BF16 weights, on
    whichever backend serves here: mean cosine >= 0.995, minimum >= 0.98, and the same
    nearest neighbour (among the other 999) for >= 98 % (measured: 98.7 % with the
    avx512-bf16 kernels, 99.1 % with the avx2 kernels and without the library)."""
    from uform.demo import generate

    rng = np.random.default_rng(7)
    texts = list(dict.fromkeys(generate.question(rng).text for _ in range(3000)))[:1000]
    assert len(texts) == 1000
    held, quantized = (
        np.array(uform.Model.load_ram(quantization=q).text_encode(texts, Arena()).embeddings) for q in (Scalar.BF16, Scalar.E4M3)
    )
    cosine = np.sum(held * quantized, axis=1)
    assert cosine.mean() >= 0.995 and cosine.min() >= 0.98, (cosine.mean(), cosine.min())

    def nearest(e: np.ndarray) -> np.ndarray:
        s = e @ e.T
        np.fill_diagonal(s, -np.inf)
        return s.argmax(1)

    assert (nearest(held) == nearest(quantized)).mean() >= 0.98


@needs_library
@pytest.mark.parametrize("quantization", [Scalar.BF16, Scalar.E4M3])
def test_a_file_load_reads_each_matrix_into_scratch_and_keeps_none(
    quantization: Scalar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The e4m3 backend packs every matrix from one reused scratch buffer: no matrix is read
    into an array of its own (only the small tensors the standard ops take are), and the
    Stored mapping answers membership, shapes and sizes without reading."""
    from ckpt import make_checkpoint

    from uform.core.checkpoint import CheckpointFile
    from uform.core.weights import Stored

    path = make_checkpoint(tmp_path / "small-text.safetensors", "small", 0, ["text"])
    with CheckpointFile(path) as source:
        stored = Stored(source, list(source.entries))
        name = next(n for n in source.entries if n.endswith(".fc1.weight"))
        assert name in stored and "nope" not in stored and len(stored.shape(name)) == 2
        assert stored.nbytes == sum(e.end - e.begin for e in source.entries.values())
        assert stored._read == {}  # nothing read yet
    kept: list[str] = []
    whole = CheckpointFile.array
    monkeypatch.setattr(CheckpointFile, "array", lambda self, n: kept.append(n) or whole(self, n))
    model = uform.Model.load_ram(path, quantization=quantization)
    assert model.backend == "e4m3" and kept
    assert not [n for n in kept if n.endswith(("qkv.weight", "out.weight", "fc1.weight", "fc2.weight"))], kept
    monkeypatch.undo()
    want = uform.Model.load_ram_buffer(path.read_bytes(), quantization=quantization)
    assert np.array_equal(np.array(model.text_encode(["a cat"], Arena()).embeddings), np.array(want.text_encode(["a cat"], Arena()).embeddings))


@pytest.mark.parametrize("tower, modalities", [("text", ["text"]), ("decoder", ["text", "choose"])])
def test_a_weight_at_bf16s_largest_value_is_blamed_on_the_tower_not_the_input(tmp_path: Path, tower: str, modalities: list[str]) -> None:
    # 3.3895314e38 is finite in BF16 and passes the load; times an activation above 1 it overflows.
    # The text tower's error said 'item 0: the encoder's output for it is not finite' (the caller's
    # input, token ids); text_choose answered NaN probabilities without an error.
    from ckpt import make_checkpoint
    from uform.core import safetensors

    source = make_checkpoint(tmp_path / "source.safetensors", "tiny", 0, modalities)
    container = safetensors.parse(memoryview(source.read_bytes()))
    tensors = {name: container.array(name) for name in container.entries}
    name = f"{tower}.blocks.0.mlp.fc1.weight"
    weight = tensors[name].astype(np.float32)
    weight[0, 5] = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    tensors[name] = weight
    path = tmp_path / "big.safetensors"
    safetensors.write(path, tensors, {"uform": json.dumps(json.loads(container.metadata["uform"]) | {"format_version": 2})})
    message = (
        f"the '{tower}' tower's outputs for item 0 are not finite (NaN or infinity) and its input is token ids, which cannot "
        "overflow: the checkpoint's weights overflow float32 arithmetic; nothing was written (use a checkpoint whose weights are in range)"
    )
    for quantization in ("e4m3", "bf16", "f32"):
        with uform.Model.load_ram(path, quantization=quantization) as model:
            arena = Arena()
            with pytest.raises(uform.CheckpointError, match=f"^{re.escape(message)}$"):
                if tower == "text":
                    model.text_encode(["hello world"], arena)
                else:
                    model.text_choose(["the sky is"], ["AB"], arena)
