"""The cuda backend on the CPU: device and class detection from captured nvidia-smi outputs,
pins, replica scheduling over fake devices. Loads over fake devices, every error path and the
parity on a GPU: tests/test_cuda_loads.py."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uform
from uform import GPUClass, UnsupportedError
from uform.plugins import cuda
from uform.plugins.sessions import gpus as gpu_info
from uform.plugins.sessions.replicas import Replicas, rows_of
from nvidia_smi import DATA, SM80, SM86, SM89, SM90, SM100, gpus


MACHINES = {  # file → (devices, first device's name, capability, the class they all run)
    "a100-sxm4-80gb-x8.csv": (8, "NVIDIA A100-SXM4-80GB", (8, 0), SM80),
    "a10g.csv": (1, "NVIDIA A10G", (8, 6), SM86),
    "l4-x2.csv": (2, "NVIDIA L4", (8, 9), SM89),
    "rtx-4090.csv": (1, "NVIDIA GeForce RTX 4090", (8, 9), SM89),
    "h100-80gb-hbm3-x4.csv": (4, "NVIDIA H100 80GB HBM3", (9, 0), SM90),
    "h200-x1.csv": (1, "NVIDIA H200", (9, 0), SM90),
    "b200-x2.csv": (2, "NVIDIA B200", (10, 0), SM100),
    "mixed-a100-rtx3090.csv": (2, "NVIDIA A100 80GB PCIe", (8, 0), SM80),
}


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_devices_and_classes_from_nvidia_smi(name: str) -> None:
    count, first, capability, cls = MACHINES[name]
    found = gpus(name)
    assert [g.index for g in found] == list(range(count))
    assert (found[0].name, found[0].capability) == (first, capability)
    assert found[0].memory > 10 << 30 and found[0].uuid.startswith("GPU-")
    assert gpu_info.choose_class(None, found) == cls


def test_every_captured_file_is_tested() -> None:
    assert sorted(p.name for p in DATA.iterdir()) == sorted([*MACHINES, "tesla-t4.csv", "old-driver-no-compute-cap.txt"])


def test_class_order_and_runnable_sets() -> None:
    assert gpu_info.runnable((7, 5)) == []
    assert gpu_info.runnable((8, 7)) == [SM80, SM86]  # Orin runs what sm_86 runs
    assert gpu_info.runnable((12, 1)) == list(GPUClass)
    assert str(gpus("h200-x1.csv")[0]) == "0 (NVIDIA H200, sm_90)"


def test_pins_beyond_a_device_name_the_device_and_the_best_shared_class() -> None:
    h100 = gpus("h100-80gb-hbm3-x4.csv")
    assert gpu_info.choose_class(SM80, h100) == SM80 and gpu_info.choose_class("sm_90", h100) == SM90
    with pytest.raises(UnsupportedError, match=re.escape("gpu_class sm_100 is beyond CUDA device 0 (NVIDIA H100 80GB HBM3, sm_90), 1 (")):
        gpu_info.choose_class(SM100, h100)
    mixed = gpus("mixed-a100-rtx3090.csv")
    with pytest.raises(UnsupportedError, match=re.escape(
        "gpu_class sm_86 is beyond CUDA device 0 (NVIDIA A100 80GB PCIe, sm_80); the best class every chosen device runs is sm_80"
    )):  # fmt: skip
        gpu_info.choose_class(SM86, mixed)
    assert gpu_info.choose_class(None, mixed[1:]) == SM86
    with pytest.raises(UnsupportedError, match=re.escape("CUDA device 0 (Tesla T4, sm_75) is below sm_80, the lowest class uform runs")):
        gpu_info.choose_class(None, gpus("tesla-t4.csv"))
    with pytest.raises(ValueError, match="gpu_class 'sm_70' is not a GPUClass; choose one of sm_80, sm_86"):
        gpu_info.choose_class("sm_70", h100)


def test_old_driver_output_is_refused() -> None:
    with pytest.raises(ValueError, match="unexpected nvidia-smi output: 'Field \"compute_cap\" is not a valid field"):
        gpu_info.parse_nvidia_smi((DATA / "old-driver-no-compute-cap.txt").read_text())


def test_cuda_visible_devices_renumbers_like_cuda() -> None:
    h100 = gpus("h100-80gb-hbm3-x4.csv")
    assert gpu_info.visible(h100, None) == h100
    picked = gpu_info.visible(h100, "2,0")
    assert [(g.index, g.uuid) for g in picked] == [(0, h100[2].uuid), (1, h100[0].uuid)]
    assert [g.uuid for g in gpu_info.visible(h100, "GPU-7b9d1f3b,3")] == [h100[2].uuid, h100[3].uuid]
    assert [g.uuid for g in gpu_info.visible(h100, "1,9,2")] == [h100[1].uuid]  # stops at the first unknown entry
    assert gpu_info.visible(h100, "") == [] and [g.uuid for g in gpu_info.visible(h100, "1,1")] == [h100[1].uuid]


class FakeDriver:
    """libcuda as ctypes sees it: each call fills its by-reference arguments."""

    def __init__(self, init: int = 0, devices: tuple[tuple[bytes, int, int], ...] = ((b"NVIDIA H200", 9, 0),)) -> None:
        self.init, self.devices = init, devices

    def cuInit(self, flags: int) -> int:
        return self.init

    def cuDriverGetVersion(self, out: Any) -> int:
        out._obj.value = 12080
        return 0

    def cuDeviceGetCount(self, out: Any) -> int:
        out._obj.value = len(self.devices)
        return 0

    def cuDeviceGet(self, out: Any, i: int) -> int:
        out._obj.value = i
        return 0

    def cuDeviceGetName(self, buffer: Any, size: int, dev: Any) -> int:
        buffer.value = self.devices[dev.value][0]
        return 0

    def cuDeviceGetAttribute(self, out: Any, attribute: int, dev: Any) -> int:
        out._obj.value = self.devices[dev.value][1 if attribute == 75 else 2]
        return 0

    def cuDeviceTotalMem_v2(self, out: Any, dev: Any) -> int:
        out._obj.value = 141 << 30
        return 0


def test_detection_through_the_driver_library(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeDriver(devices=((b"NVIDIA H200", 9, 0), (b"NVIDIA L4", 8, 9))))
    found = gpu_info._from_driver()
    assert (found.driver, found.source, found.reason) == ("CUDA 12.8", "libcuda", None)
    assert [str(g) for g in found.gpus] == ["0 (NVIDIA H200, sm_90)", "1 (NVIDIA L4, sm_89)"] and found.gpus[0].memory == 141 << 30
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeDriver(init=100))
    assert gpu_info._from_driver() == gpu_info.Detected([], "", "libcuda")  # CUDA_ERROR_NO_DEVICE
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeDriver(init=999))
    assert gpu_info._from_driver().reason == "the CUDA driver did not initialise (cuInit error 999)"


def test_detection_falls_back_to_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes
    import subprocess

    def no_library(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    captured = (DATA / "h100-80gb-hbm3-x4.csv").read_text()
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, captured, ""))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    cuda.detect.cache_clear()
    try:
        found = cuda.detect()
    finally:
        cuda.detect.cache_clear()
    assert (found.driver, found.source) == ("driver 560.35.03", "nvidia-smi")
    assert [(g.index, g.uuid[:12]) for g in found.gpus] == [(0, "GPU-0c2e4a6c"), (1, "GPU-4d6f8b0d")]
    old = (DATA / "old-driver-no-compute-cap.txt").read_text()
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 2, old, ""))
    assert gpu_info._from_smi().reason == 'nvidia-smi failed: Field "compute_cap" is not a valid field to query.'

    def missing(*a: Any, **k: Any) -> None:
        raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")

    monkeypatch.setattr(subprocess, "run", missing)
    assert gpu_info._from_smi().reason == (
        "no CUDA driver found (libcuda does not load; nvidia-smi: [Errno 2] No such file or directory: 'nvidia-smi')"
    )


def test_devices_are_checked_against_what_exists() -> None:
    l4 = gpus("l4-x2.csv")
    assert gpu_info.check_devices(None, l4) == [0] and gpu_info.check_devices([1, 0], l4) == [1, 0]
    with pytest.raises(UnsupportedError, match=re.escape(
        "CUDA devices [5] do not exist; this process sees 2: 0 (NVIDIA L4, sm_89), 1 (NVIDIA L4, sm_89)"
    )):  # fmt: skip
        gpu_info.check_devices([0, 5], l4)
    with pytest.raises(UnsupportedError, match=re.escape("CUDA devices [0] do not exist; this process sees 0: none")):
        gpu_info.check_devices(None, [])
    with pytest.raises(ValueError, match=re.escape("devices [0, 0] names a device twice")):
        gpu_info.check_devices([0, 0], l4)
    with pytest.raises(ValueError, match="devices is empty"):
        gpu_info.check_devices([], l4)
    with pytest.raises(TypeError, match="devices must be a sequence of CUDA device ordinals"):
        gpu_info.check_devices(["cuda:0"], l4)  # type: ignore[list-item]


@pytest.mark.parametrize(("devices", "error", "message"), [
    ([], ValueError, "devices is empty; name one CUDA device at least, e.g. devices=[0]"),
    ([0, 0], ValueError, "devices [0, 0] names a device twice"),
    (["cuda:0"], TypeError, "devices must be a sequence of CUDA device ordinals (int), got ['cuda:0']"),
])  # fmt: skip
def test_a_devices_mistake_is_named_before_cuda_is_looked_for(devices: Any, error: type[Exception], message: str, tiny_text: Path) -> None:
    """docs/gpus.md: devices=[] and a device named twice are ValueError, ids not integers TypeError.
    On a machine without CUDA each was 'UnsupportedError: cannot place a model in VRAM: cuda:
    onnxruntime ... has no CUDAExecutionProvider', so the caller's mistake showed only on a GPU."""
    with pytest.raises(error) as caught:
        uform.Model.load_vram(tiny_text, devices=devices)
    assert str(caught.value) == message


# -- replica scheduling over fake devices -------------------------------------------------


class FakeDevice:
    """A session answering ``x * 2`` (embeddings) and ``x`` repeated (tokens); it records calls."""

    def __init__(self, i: int, delay: float = 0.0, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.i, self.delay, self.gate, self.fail = i, delay, gate, fail
        self.rows: list[int] = []

    def run(self, names: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.rows.append(rows_of(feed) or -1)
        if self.gate is not None:
            assert self.gate.wait(5)
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError(f"device {self.i} failed")
        x = feed["x"]
        return [x * 2, np.repeat(x[:, None, :], 3, axis=1)]


def feed(rows: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(rows * 2, dtype=np.float32).reshape(rows, 2), "lengths": np.arange(rows)}


def test_large_batches_split_in_order_over_every_replica() -> None:
    devices = [FakeDevice(i) for i in range(4)]
    replicas = Replicas(devices, min_rows=8)
    emb, tokens = replicas.run(None, feed(64))
    assert np.array_equal(emb, feed(64)["x"] * 2) and tokens.shape == (64, 3, 2)
    assert np.array_equal(tokens[:, 1], feed(64)["x"])
    assert [d.rows for d in devices] == [[16], [16], [16], [16]]
    replicas.run(None, feed(20))  # 20 rows: two parts of at least 8
    assert sorted(len(d.rows) for d in devices) == [1, 1, 2, 2] and sum(sum(d.rows) for d in devices) == 84
    assert replicas.busy == [0, 0, 0, 0]


def test_small_calls_go_whole_round_robin() -> None:
    devices = [FakeDevice(i) for i in range(3)]
    replicas = Replicas(devices, min_rows=8)
    for _ in range(6):
        replicas.run(None, feed(5))
    assert [d.rows for d in devices] == [[5, 5], [5, 5], [5, 5]]
    assert replicas.calls == [2, 2, 2]


def test_calls_go_to_the_least_busy_replica() -> None:
    gate = threading.Event()
    devices = [FakeDevice(0, gate=gate), FakeDevice(1), FakeDevice(2)]
    replicas = Replicas(devices, min_rows=8)
    held = threading.Thread(target=replicas.run, args=(None, feed(1)))
    held.start()
    while replicas.busy[0] == 0:
        time.sleep(0.001)
    for _ in range(4):  # device 0 is busy: every call lands on 1 or 2
        replicas.run(None, feed(1))
    gate.set()
    held.join()
    assert [len(d.rows) for d in devices] == [1, 2, 2]


def test_feeds_without_a_shared_batch_axis_are_not_split() -> None:
    devices = [FakeDevice(i) for i in range(2)]
    replicas = Replicas(devices, min_rows=1)
    ragged = {"x": np.zeros((32, 2), np.float32), "scale": np.float32(1)}
    replicas.run(None, ragged)
    assert [d.rows for d in devices] == [[-1], []]


def test_a_failing_part_fails_the_call_after_every_part_ended() -> None:
    devices = [FakeDevice(0, delay=0.05), FakeDevice(1, fail=True)]
    replicas = Replicas(devices, min_rows=4)
    with pytest.raises(RuntimeError, match="device 1 failed"):
        replicas.run(None, feed(16))
    assert devices[0].rows == [8] and replicas.busy == [0, 0]
    assert np.array_equal(replicas.run(None, feed(2))[0], feed(2)["x"] * 2)  # still serves
