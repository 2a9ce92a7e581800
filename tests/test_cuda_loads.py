"""The cuda backend's loads: every error path (no provider, no device, an old driver, missing
libraries, a provider that does not start), the whole path over fake devices (CPU sessions
under CUDA's name), the experimental float16 products, benchmarks/gpu_check.py end to end, and
on a GPU, parity for real (``pytest -m gpu``). Detection, pins and replica scheduling:
tests/test_cuda_backend.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uform
from uform import Arena, Executor, Outputs, UnsupportedError
from uform.model import runtime_of
from uform.plugins import cuda
from uform.plugins.sessions import gpus as gpu_info
from uform.plugins.sessions.replicas import Replicas
from nvidia_smi import SM80, SM86, SM89, SM90, gpus


# -- loading: every error path, and the whole path over fake devices -----------------------


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Two L4s whose "CUDA" sessions are CPU sessions; yields the devices sessions started on."""
    import onnxruntime as ort

    started: list[int] = []

    def start(model: Path | bytes, options: Any, device: int) -> Any:
        started.append(device)
        return ort.InferenceSession(model if isinstance(model, bytes) else str(model), options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(cuda, "onnxruntime_providers", lambda: ("1.32.0", [cuda.PROVIDER, "CPUExecutionProvider"]))
    monkeypatch.setattr(cuda, "built_for", lambda: None)  # the libraries a real wheel needs are not looked for
    monkeypatch.setattr(cuda, "detect", lambda: gpu_info.Detected(gpus("l4-x2.csv"), "CUDA 12.4", "test"))
    monkeypatch.setattr(cuda, "start_session", start)
    yield started


@pytest.fixture(scope="module")
def tiny_model(tiny_text: Path) -> uform.Model:
    """The CPU's float32 path, which the fake devices (the CPU provider under CUDA's name) must match."""
    return uform.Model.load_ram(tiny_text, quantization=uform.Scalar.F32)


TEXTS = [("a caption %d " % i) * (i % 4 + 1) for i in range(100)]


def test_load_vram_over_fake_devices_matches_load_ram(fake_cuda: list[int], tiny_text: Path, tiny_model: uform.Model) -> None:
    model = uform.Model.load_vram(tiny_text, devices=[1, 0], executor=Executor(threads=2))
    assert fake_cuda == [1, 0]
    d = model.describe()
    assert (d.gpu_class, d.cpu_class) == (SM89, None)
    assert d.memory_usage == 2 * tiny_model.describe().memory_usage
    runner = runtime_of(model).placement.runners["text"]
    assert isinstance(runner, Replicas) and len(runner.sessions) == 2
    both = Outputs.EMBEDDINGS | Outputs.TOKENS
    got, want = model.text_encode(TEXTS, Arena(), outputs=both), tiny_model.text_encode(TEXTS, Arena(), outputs=both)
    np.testing.assert_allclose(np.array(got.embeddings), np.array(want.embeddings), rtol=1e-6, atol=1e-7)
    assert got.tokens is not None and want.tokens is not None
    np.testing.assert_allclose(np.array(got.tokens.values), np.array(want.tokens.values), rtol=1e-6, atol=1e-7)
    assert min(runner.calls) > 0
    one = uform.Model.load_vram_buffer(tiny_text.read_bytes(), gpu_class=SM80)
    assert one.describe().gpu_class == SM80 and not isinstance(runtime_of(one).placement.runners["text"], Replicas)


def test_vram_batches_hold_more_rows_split_over_the_devices(fake_cuda: list[int], tiny_text: Path, tiny_model: uform.Model) -> None:
    model = uform.Model.load_vram(tiny_text, devices=[0, 1])
    assert runtime_of(model).placement.batch_scale == 2 * cuda.BATCH_SCALE == 8
    texts = [f"caption {i}" for i in range(600)]
    on_gpu, on_cpu = uform.TextEncodeStats(), uform.TextEncodeStats()
    got = np.array(model.text_encode(texts, Arena(), stats=on_gpu).embeddings)
    want = np.array(tiny_model.text_encode(texts, Arena(), stats=on_cpu).embeddings)
    assert (on_cpu.batches, on_gpu.batches) == (10, 2)  # 64 rows a batch on the CPU, 8 x 64 on two devices
    runner = runtime_of(model).placement.runners["text"]
    assert isinstance(runner, Replicas) and runner.calls == [2, 2]  # each batch split over both devices
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_e4m3_on_fake_fp8_devices_dequantizes_on_the_device(
    fake_cuda: list[int], tiny_text: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uform.core.host import reset_host

    model = uform.Model.load_vram(tiny_text, devices=[1], quantization=uform.Scalar.E4M3)
    d = model.describe()
    assert (d.quantization, d.gpu_class, model.backend) == (uform.Scalar.E4M3, SM89, "cuda")
    assert "DequantizeLinear" in model.compute
    wide = uform.Model.load_vram(tiny_text, devices=[1])
    assert wide.describe().quantization == uform.Scalar.F32  # what TF32 products hold, never a false BF16
    assert d.memory_usage < 0.6 * wide.describe().memory_usage
    got = np.array(model.text_encode(TEXTS, Arena()).embeddings)
    monkeypatch.setenv("UFORM_BLOCK_PLUGINS", "e4m3")  # the cpu backend's DequantizeLinear graphs: the same graph
    reset_host()
    try:
        on_cpu = uform.Model.load_ram(tiny_text, quantization=uform.Scalar.E4M3)
    finally:
        monkeypatch.delenv("UFORM_BLOCK_PLUGINS")
        reset_host()
    assert on_cpu.backend == "cpu"
    np.testing.assert_allclose(got, np.array(on_cpu.text_encode(TEXTS, Arena()).embeddings), rtol=1e-6, atol=1e-7)
    assert fake_cuda == [1, 1]


def test_e4m3_is_refused_on_a_class_without_fp8(fake_cuda: list[int], tiny_text: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "detect", lambda: gpu_info.Detected(gpus("a10g.csv"), "CUDA 12.4", "test"))
    message = "quantization e4m3 needs FP8 on the GPU (sm_89 and later: Ada, Hopper, Blackwell); devices [0] run as sm_86: load bf16 instead"
    with pytest.raises(UnsupportedError, match=f"^{re.escape(message)}$"):
        uform.Model.load_vram(tiny_text, quantization=uform.Scalar.E4M3)
    with monkeypatch.context() as patch:  # an L4 pinned to Ampere's class has no FP8 either
        patch.setattr(cuda, "detect", lambda: gpu_info.Detected(gpus("l4-x2.csv"), "CUDA 12.4", "test"))
        with pytest.raises(UnsupportedError, match="devices \\[0\\] run as sm_86"):
            uform.Model.load_vram(tiny_text, devices=[0], gpu_class=SM86, quantization=uform.Scalar.E4M3)
    assert fake_cuda == []


def test_load_vram_errors_name_what_is_available(fake_cuda: list[int], tiny_text: Path) -> None:
    with pytest.raises(UnsupportedError, match=re.escape("CUDA devices [2] do not exist; this process sees 2: 0 (NVIDIA L4, sm_89)")):
        uform.Model.load_vram(tiny_text, devices=[0, 2])
    with pytest.raises(UnsupportedError, match=re.escape("gpu_class sm_90 is beyond CUDA device 0 (NVIDIA L4, sm_89)")):
        uform.Model.load_vram(tiny_text, gpu_class=SM90)
    with pytest.raises(UnsupportedError, match="cannot place a model in VRAM: cuda: holds weights in f32, bf16 \\(as f32\\) or e4m3, not e5m2"):
        uform.Model.load_vram(tiny_text, quantization=uform.Scalar.E5M2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cuda, "COMPUTE", "bf16")
        with pytest.raises(ValueError, match="uform.plugins.cuda.COMPUTE must be 'tf32' or 'f16', not 'bf16'"):
            uform.Model.load_vram(tiny_text)
    assert fake_cuda == []  # nothing started


def test_no_cuda_provider_is_an_error_never_a_cpu_fallback(monkeypatch: pytest.MonkeyPatch, tiny_text: Path) -> None:
    monkeypatch.setattr(cuda, "onnxruntime_providers", lambda: ("1.32.0", ["AzureExecutionProvider", "CPUExecutionProvider"]))
    monkeypatch.setattr(cuda, "_both_wheels", lambda: False)
    message = (
        "cannot place a model in VRAM: cuda: onnxruntime 1.32.0 has no CUDAExecutionProvider (it has AzureExecutionProvider, "
        "CPUExecutionProvider); install onnxruntime-gpu[cuda,cudnn] in place of onnxruntime (docs/gpus.md, \"Installing for GPUs\")"
    )
    with pytest.raises(UnsupportedError, match=f"^{re.escape(message)}$"):
        uform.Model.load_vram(tiny_text)
    monkeypatch.setattr(cuda, "_both_wheels", lambda: True)
    with pytest.raises(UnsupportedError, match="onnxruntime and onnxruntime-gpu are both installed and overwrite each other"):
        uform.Model.load_vram(tiny_text)


def test_no_device_or_no_driver(monkeypatch: pytest.MonkeyPatch, tiny_text: Path) -> None:
    monkeypatch.setattr(cuda, "onnxruntime_providers", lambda: ("1.32.0", [cuda.PROVIDER]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(cuda, "detect", lambda: gpu_info.Detected([], "CUDA 12.4", "test"))
    with pytest.raises(UnsupportedError, match=re.escape("cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES='')")):
        uform.Model.load_vram(tiny_text)
    monkeypatch.setattr(cuda, "detect", lambda: gpu_info.Detected(reason="no CUDA driver found (libcuda does not load; nvidia-smi: x)"))
    with pytest.raises(UnsupportedError, match=re.escape("cuda: no CUDA driver found")):
        uform.Model.load_vram(tiny_text)


def test_a_driver_older_than_the_wheel_is_named(monkeypatch: pytest.MonkeyPatch, tiny_text: Path) -> None:
    monkeypatch.setattr(cuda, "onnxruntime_providers", lambda: ("1.31.1", [cuda.PROVIDER, "CPUExecutionProvider"]))
    monkeypatch.setattr(cuda, "built_for", lambda: (13, 0))
    monkeypatch.setattr(cuda, "detect", lambda: gpu_info.Detected(gpus("a10g.csv"), "CUDA 12.4", "libcuda", cuda=(12, 4)))
    message = (
        "cuda: onnxruntime 1.31.1 (built for CUDA 13.0) needs a driver for CUDA 13, and this one runs CUDA 12.4 at most; "
        "upgrade the NVIDIA driver or install an onnxruntime-gpu built for your CUDA (docs/gpus.md, \"Installing for GPUs\")"
    )
    with pytest.raises(UnsupportedError, match=re.escape(message)):
        uform.Model.load_vram(tiny_text)


def test_missing_cuda_libraries_are_named_after_preloading(monkeypatch: pytest.MonkeyPatch, tiny_text: Path) -> None:
    monkeypatch.setattr(cuda, "onnxruntime_providers", lambda: ("1.31.1", [cuda.PROVIDER, "CPUExecutionProvider"]))
    monkeypatch.setattr(cuda, "built_for", lambda: (13, 0))
    monkeypatch.setattr(cuda, "detect", lambda: gpu_info.Detected(gpus("h200-x1.csv"), "CUDA 13.0", "libcuda", cuda=(13, 0)))
    present = {"libcudart.so.13", "libcurand.so.10"}
    preloaded: list[bool] = []
    monkeypatch.setattr(cuda, "loads", lambda name: name in present)
    monkeypatch.setattr(cuda, "_preload", lambda: preloaded.append(True) or present.add("libcublas.so.13"))
    message = (
        "cuda: onnxruntime 1.31.1 (built for CUDA 13.0) cannot load libcublasLt.so.13, libcudnn.so.9; install them with "
        "pip install 'onnxruntime-gpu[cuda,cudnn]' or put CUDA 13 and cuDNN 9 on the library path (docs/gpus.md, \"Installing for GPUs\")"
    )
    with pytest.raises(UnsupportedError, match=re.escape(message)):
        uform.Model.load_vram(tiny_text)
    assert preloaded == [True]  # pip's nvidia-* libraries were given their chance first
    present.update(cuda.needed_libraries((13, 0)))
    assert cuda.probe() is None


def test_the_page_the_refusals_name_tells_how_to_install_for_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each refusal that says what to install names the page and section that tell it. They named
    docs/backends.md, whose CUDA section is a pointer to docs/gpus.md: a reader sent there found no
    word of onnxruntime-gpu's wheels, CUDA versions or libraries."""
    docs = Path(__file__).parents[1] / "docs"
    monkeypatch.setattr(cuda, "_both_wheels", lambda: False)
    monkeypatch.setattr(cuda, "built_for", lambda: (13, 0))
    reasons = []
    monkeypatch.setattr(cuda, "onnxruntime_providers", lambda: ("1.32.0", ["CPUExecutionProvider"]))
    reasons.append(cuda.probe())
    monkeypatch.setattr(cuda, "onnxruntime_providers", lambda: ("1.31.1", [cuda.PROVIDER]))
    monkeypatch.setattr(cuda, "detect", lambda: gpu_info.Detected(gpus("a10g.csv"), "CUDA 12.4", "libcuda", cuda=(12, 4)))
    reasons.append(cuda.probe())
    monkeypatch.setattr(cuda, "detect", lambda: gpu_info.Detected(gpus("h200-x1.csv"), "CUDA 13.0", "libcuda", cuda=(13, 0)))
    monkeypatch.setattr(cuda, "loads", lambda name: False)
    monkeypatch.setattr(cuda, "_preload", lambda: None)
    reasons.append(cuda.probe())
    named = [re.search(r'docs/([a-z-]+\.md), "([^"]+)"', reason or "") for reason in reasons]
    assert all(named), reasons
    for found in named:
        assert found is not None
        page = (docs / found.group(1)).read_text()
        section = page.partition(f"\n## {found.group(2)}\n")[2].partition("\n## ")[0]
        assert "onnxruntime-gpu[cuda,cudnn]" in section and "libcudnn" in section, found.group(0)  # the wheel, and the libraries it needs


def test_the_libraries_each_cuda_build_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxruntime import capi

    assert cuda.needed_libraries((12, 8)) == ["libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12", "libcurand.so.10", "libcudnn.so.9"]
    assert cuda.needed_libraries((13, 0))[:3] == ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"]
    assert cuda.needed_libraries(None) == cuda.needed_libraries((11, 8)) == []
    for recorded, read in [("13.0", (13, 0)), ("12.8", (12, 8)), ("12", (12, 0)), ("", None), ("cpu", None)]:
        monkeypatch.setattr(capi, "build_and_package_info", type("Build", (), {"cuda_version": recorded}), raising=False)
        assert cuda.built_for() == read


def test_real_machine_without_cuda_refuses(tiny_text: Path) -> None:
    if cuda.probe() is None:
        pytest.skip("this machine has CUDA")
    with pytest.raises(UnsupportedError, match="^cannot place a model in VRAM: cuda: "):
        uform.Model.load_vram(tiny_text)


class _Session:
    def __init__(self, providers: list[str]) -> None:
        self.providers = providers
        self.fallback = True

    def get_providers(self) -> list[str]:
        return self.providers

    def disable_fallback(self) -> None:
        self.fallback = False


def test_a_provider_that_does_not_start_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import onnxruntime as ort

    asked: list[Any] = []

    def fell_back(path: str, options: Any, providers: list[Any]) -> _Session:
        asked.append(providers)
        return _Session(["CPUExecutionProvider"])

    monkeypatch.setattr(ort, "InferenceSession", fell_back)
    monkeypatch.setattr(cuda, "provider_load_error", lambda: "libcuda.so.1: cannot open shared object file: No such file or directory")
    with pytest.raises(UnsupportedError, match=re.escape(
        "the CUDA execution provider did not start on device 1 (the session got CPUExecutionProvider): "
        "libcuda.so.1: cannot open shared object file: No such file or directory; docs/gpus.md, \"Installing for GPUs\", lists what onnxruntime-gpu needs"
    )):  # fmt: skip
        cuda.start_session(tmp_path / "t.onnx", None, 1)
    monkeypatch.setattr(cuda, "provider_load_error", lambda: None)
    with pytest.raises(UnsupportedError, match=re.escape("(the session got CPUExecutionProvider): ONNX Runtime's log above says why;")):
        cuda.start_session(tmp_path / "t.onnx", None, 1)
    assert asked[0] == [(cuda.PROVIDER, {"device_id": "1", "use_tf32": "1", "cudnn_conv_algo_search": "HEURISTIC"}), "CPUExecutionProvider"]

    def broken(path: str, options: Any, providers: list[Any]) -> _Session:
        raise RuntimeError("CUDA failure 2: out of memory")

    monkeypatch.setattr(ort, "InferenceSession", broken)
    with pytest.raises(UnsupportedError, match="cannot start on device 0: CUDA failure 2: out of memory"):
        cuda.start_session(tmp_path / "t.onnx", None, 0)
    monkeypatch.setattr(ort, "InferenceSession", lambda *a, **k: _Session([cuda.PROVIDER, "CPUExecutionProvider"]))
    session = cuda.start_session(tmp_path / "t.onnx", None, 0)
    assert isinstance(session, _Session) and not session.fallback  # a failing run is never retried on the CPU


# -- the experimental float16 products ----------------------------------------------------


def text_graph() -> tuple[Any, dict[str, np.ndarray]]:
    from uform.core import checkpoint
    from uform.core.host import get_host
    from uform.core.runtime import build_graph

    host = get_host()
    config, tensors = checkpoint.new(host, "tiny", 0, ["text"])
    modality = host.tower_owner("text")
    assert modality is not None
    parsed = modality.tower.read(config.towers["text"], config)
    specs = dict(modality.tower.tensors(parsed, config))
    return build_graph("text", modality, parsed, config, specs), {k: tensors[k] for k in specs}


def test_half_products_cast_around_every_weight_gemm() -> None:
    import onnx

    graph, weights = text_graph()
    half, halves = cuda.half_products(graph, list(weights))
    gemms = [n for n in graph.graph.node if n.op_type == "Gemm"]
    assert halves == {w for n in gemms for w in n.input[1:]} and all(w.endswith((".weight", ".bias")) for w in halves)
    assert len(half.graph.node) == len(graph.graph.node) + 2 * len(gemms)
    casts = [n for n in half.graph.node if n.op_type == "Cast" and n.name.endswith(("_to16", "_to32"))]
    assert len(casts) == 2 * len(gemms)
    assert [(i.name, i.type.tensor_type.elem_type) for i in half.graph.input] == [
        (i.name, i.type.tensor_type.elem_type) for i in graph.graph.input
    ]
    assert [o.type.tensor_type.elem_type for o in half.graph.output] == [onnx.TensorProto.FLOAT] * len(graph.graph.output)
    assert "text.embed.weight" not in halves and "text.ln_final.weight" not in halves  # Gather, LayerNorm stay float32


def test_half_products_leave_shared_or_computed_operands_float32() -> None:
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2", "y3")]
    table = numpy_helper.from_array(np.full((3, 4), 70000, np.float32), "table")  # an embedded constant
    nodes = [
        helper.make_node("Gemm", ["x", "W"], ["y1"], name="g1", transB=1),
        helper.make_node("Add", ["b", "b"], ["b2"], name="computed"),
        helper.make_node("Gemm", ["x", "W", "b2"], ["y2"], name="g2", transB=1),  # computed bias: stays float32
        helper.make_node("Gemm", ["x", "table"], ["y3"], name="g3", transB=1),
    ]
    graph = helper.make_model(helper.make_graph(nodes, "t", [x], outs, [table]))
    half, halves = cuda.half_products(graph, ["W", "b"])
    assert halves == set()  # W is shared with g2, which cannot be float16, so g1 stays float32 too
    assert [n.name for n in half.graph.node] == ["g1", "computed", "g2", "g3_to16", "g3", "g3_to32"]
    clamped = numpy_helper.to_array(half.graph.initializer[0])
    assert clamped.dtype == np.float16 and clamped.max() == 65504


def test_half_products_compute_in_float16_close_to_float32() -> None:
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    from uform.core.weights import embed

    graph, weights = text_graph()
    half, halves = cuda.half_products(graph, list(weights))
    ids = {id(weights[w]) for w in halves}
    model16 = embed(half, weights, lambda a: cuda._halve(a) if id(a) in ids else a.astype(np.float32))
    model32 = embed(graph, weights, lambda a: a.astype(np.float32))
    rng = np.random.default_rng(0)
    feeds = {"bytes": rng.integers(0, 256, (4, 20)), "lengths": np.array([20, 5, 1, 12])}
    got = ReferenceEvaluator(model16).run(["embeddings"], feeds)[0]  # numpy: float16 products for real
    want = ort.InferenceSession(model32.SerializeToString(), providers=["CPUExecutionProvider"]).run(["embeddings"], feeds)[0]
    assert got.dtype == np.float32
    assert 1e-6 < np.abs(got - want).max() < 2e-3 and np.sum(got * want, axis=1).min() > 0.9999


def test_f16_load_holds_half_the_bytes(fake_cuda: list[int], tiny_text: Path, tiny_model: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "COMPUTE", "f16")
    model = uform.Model.load_vram(tiny_text)
    full = tiny_model.describe().memory_usage
    assert full // 2 < model.describe().memory_usage < full  # Gemm weights float16, embeddings and norms float32
    got = np.array(model.text_encode(TEXTS, Arena()).embeddings)
    want = np.array(tiny_model.text_encode(TEXTS, Arena()).embeddings)
    np.testing.assert_allclose(got, want, atol=2e-3)


@pytest.mark.parametrize("fails", [False, True])
def test_the_float_weights_file_is_written_as_the_cpu_backends_and_removed(
    fake_cuda: list[int], tiny_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    """The cuda backend's float32 weights go where and as the cpu backend's do (one rule,
    uform.plugins.sessions.widened): a folder named after its writer in the temporary folder,
    removed once the sessions have read it, or failed to start over it."""
    import os
    import tempfile

    from uform.core import files

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    seen: list[tuple[str, list[str]]] = []
    fake = cuda.start_session

    def start(model: Path | bytes, options: Any, device: int) -> Any:
        folder = Path(str(model)).parent
        seen.append((folder.name, sorted(os.listdir(folder))))
        if fails:
            raise UnsupportedError(f"the CUDA execution provider cannot start on device {device}: a test's refusal")
        return fake(model, options, device)

    monkeypatch.setattr(cuda, "start_session", start)
    if fails:
        with pytest.raises(UnsupportedError, match="on device 0: a test's refusal"):
            uform.Model.load_vram(tiny_text, devices=[0])
    else:
        uform.Model.load_vram(tiny_text, devices=[0]).close()
    (name, listed), *_ = seen
    assert name.startswith(".uform-text.") and name.endswith(files.PARTIAL) and listed == ["tower.onnx", "weights.bin"]
    assert [n for n in os.listdir(temp) if "uform" in n] == []


# -- on a GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(cuda.probe() is not None, reason=f"needs CUDA: {cuda.probe()}")
@pytest.mark.parametrize("compute", ["tf32", "f16"])
def test_gpu_parity_with_the_reference(compute: str, tiny_text: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from uform.exporters.reference import ReferenceModel

    monkeypatch.setattr(cuda, "COMPUTE", compute)
    devices = list(range(min(2, len(cuda.detect().gpus))))
    model = uform.Model.load_vram(tiny_text, devices=devices)
    assert model.describe().gpu_class == gpu_info.choose_class(None, [cuda.detect().gpus[d] for d in devices])
    texts = [t.encode() for t in TEXTS]
    got = np.array(model.text_encode(texts, Arena()).embeddings)
    with torch.no_grad():
        want = ReferenceModel.from_checkpoint(tiny_text).towers["text"].encode(texts)[0].numpy()
    np.testing.assert_allclose(got, want, atol=3e-3)  # TF32 or float16 matrix products
    assert np.sum(got * want, axis=1).min() > 0.9999


@pytest.mark.gpu
@pytest.mark.skipif(cuda.probe() is not None, reason=f"needs CUDA: {cuda.probe()}")
def test_gpu_e4m3_runs_on_fp8_classes_and_is_refused_elsewhere(tiny_text: Path) -> None:
    gpu_class = gpu_info.choose_class(None, [cuda.detect().gpus[0]])
    if gpu_class not in cuda.FP8_CLASSES:
        with pytest.raises(UnsupportedError, match=f"quantization e4m3 needs FP8 on the GPU .* run as {gpu_class}"):
            uform.Model.load_vram(tiny_text, devices=[0], quantization=uform.Scalar.E4M3)
        return
    model = uform.Model.load_vram(tiny_text, devices=[0], quantization=uform.Scalar.E4M3)
    assert (model.describe().quantization, model.backend) == (uform.Scalar.E4M3, "cuda")
    got = np.array(model.text_encode(TEXTS, Arena()).embeddings)
    want = np.array(uform.Model.load_ram(tiny_text, quantization=uform.Scalar.F32).text_encode(TEXTS, Arena()).embeddings)
    assert np.sum(got * want, axis=1).min() > 0.98


# -- benchmarks/gpu_check.py, end to end over fake devices ---------------------------------


@pytest.fixture
def gpu_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The prepared GPU script as a module, writing its results under ``tmp_path``."""
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    common = importlib.import_module("common")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    yield importlib.import_module("gpu_check")
    sys.modules.pop("gpu_check", None)


def test_gpu_check_runs_every_step_over_fake_devices(fake_cuda: list[int], gpu_check: Any, tmp_path: Path) -> None:
    """The script the GPU machine runs, run here with CPU sessions standing in for devices:
    every tower's parity row, every throughput row, both compute settings, the result file."""
    import json

    pytest.importorskip("torch")
    args = ["--preset", "tiny", "--devices", "0,1", "--seconds", "0.01", "--batches", "1,20"]
    assert gpu_check.main(args) == 0
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["status"] == "ok" and result["devices"] == [0, 1] and list(result["runs"]) == ["tf32", "f16", "e4m3"]
    towers = ["audio", "decoder", "image", "text", "video"]
    for compute, run in result["runs"].items():
        assert run["description"]["gpu_class"] == "sm_89" and run["load_vram_s"] >= 0
        assert run["description"]["quantization"] == {"tf32": "f32", "f16": "f16", "e4m3": "e4m3"}[compute]
        assert [(r["tower"], r["ok"]) for r in run["parity"]] == [(t, True) for t in towers]
        assert all(float(r["max_abs_error"]) < (0.1 if compute == "e4m3" else 1e-3) for r in run["parity"])
        measured = [(r["what"], r["batch"]) for r in run["throughput"]]
        verbs = ["text_encode", "image_encode_pixels"]
        assert measured == [(f"{t} tower", b) for t in towers for b in (1, 20)] + [(v, b) for v in verbs for b in (1, 20)]
        assert all(isinstance(r["items/s"], float) and r["items/s"] > 0 for r in run["throughput"])
    assert fake_cuda == [0, 1] * 15  # 5 towers x 2 devices, three times


def test_gpu_check_stops_without_cuda_and_writes_nothing(gpu_check: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if cuda.probe() is None:
        pytest.skip("this machine has CUDA")
    assert gpu_check.main(["--preset", "tiny"]) == 2
    assert "GPU CHECK CANNOT RUN: " in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_the_provider_library_reason_is_the_loaders() -> None:
    import onnxruntime as ort

    reason = cuda.provider_load_error()
    if cuda.PROVIDER not in ort.get_available_providers():
        assert reason is not None and reason.endswith("libonnxruntime_providers_cuda.so does not exist")
    elif cuda.probe() is not None:  # onnxruntime-gpu on a machine without a driver: the loader names a library
        assert reason is not None and ".so" in reason
