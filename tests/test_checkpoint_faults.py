"""Faults while reading a checkpoint: each ends in a named error or a correct result, never a crash or a hang."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import uform
from uform.core import checkpoint, safetensors

from ckpt import make_checkpoint

TEXTS = ["a cat", "a dog on a mat"]


def _embed(model: uform.Model) -> np.ndarray:
    return np.array(model.text_encode(TEXTS, uform.Arena()).embeddings)


# A load whose progress handler cuts the checkpoint to 64 bytes as soon as the weights are
# being converted: over a memory map the next page touched faults (SIGBUS kills the process).
# A load reads each tensor when a backend asks for it, so it either had every byte already
# (the e4m3 backend reads all before its first progress call) or stops with the reason.
SHRINK = """
import os, sys
import numpy as np
import uform
path = sys.argv[1]
shrunk = []
def progress(done, total):
    if not shrunk:
        os.truncate(path, 64)
        shrunk.append(done)
    return True
try:
    model = uform.Model.load_ram(path, progress=progress, progress_steps=16, quantization=sys.argv[3])
except uform.CheckpointError as exc:
    print(os.path.getsize(path), len(shrunk), "refused:", exc)
else:
    print(os.path.getsize(path), len(shrunk))
    np.save(sys.argv[2], np.array(model.text_encode(["a cat", "a dog on a mat"], uform.Arena()).embeddings))
"""


@pytest.mark.parametrize("quantization", ["bf16", "e4m3", "f32"])
def test_shrinking_the_file_during_a_load_cannot_fault(tmp_path: Path, quantization: str) -> None:
    whole = make_checkpoint(tmp_path / "whole.safetensors", "tiny", 0, ["text", "choose"])  # two towers: one read after the cut
    path = tmp_path / "shrinking.safetensors"
    path.write_bytes(whole.read_bytes())
    out = subprocess.run(
        [sys.executable, "-c", SHRINK, str(path), str(tmp_path / "got.npy"), quantization], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])  # -7 was SIGBUS
    assert out.stdout.split()[:2] == ["64", "1"]  # the file was cut during the load
    if "refused:" in out.stdout:  # a tensor was still to be read: the reason, naming the file once, first
        cut = f"the file ends at byte 64, before its stated size of {whole.stat().st_size} bytes"
        assert re.search(f"refused: {re.escape(str(path))}: (a matrix of the '\\w+' tower: )?{cut}", out.stdout), out.stdout
        assert out.stdout.count(str(path)) == 1, out.stdout
    else:
        reference = uform.Model.load_ram(whole, quantization=quantization)
        assert np.array_equal(np.load(tmp_path / "got.npy"), _embed(reference))


def test_a_file_that_ends_before_its_stated_size(tiny_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fstat answered the whole file's size, then the file lost its last 4 KiB (a tensor's
    bytes among them) before they were read."""
    path = tmp_path / "short.safetensors"
    path.write_bytes(tiny_text.read_bytes())
    stated = path.stat().st_size
    size = stated - 4096
    os.truncate(path, size)
    real = os.fstat

    def larger(fd: int) -> os.stat_result:  # the size fstat answered, before the file shrank
        st = real(fd)
        if st.st_size == size:
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, stated, *st[7:10]))
        return st

    monkeypatch.setattr(checkpoint, "READ_CHUNK", 4096)
    monkeypatch.setattr(os, "fstat", larger)
    message = rf"^{re.escape(str(path))}: (a matrix of the 'text' tower: )?the file ends at byte {size}, before its stated size of {stated} bytes"
    with pytest.raises(uform.CheckpointError, match=message):
        uform.Model.load_ram(path)


def test_a_checkpoint_file_reads_tensors_in_chunks(tiny_text: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "READ_CHUNK", 1000)  # many reads a tensor, the last one partial
    whole = safetensors.parse(memoryview(tiny_text.read_bytes()))
    with checkpoint.CheckpointFile(tiny_text) as source:
        assert source.metadata == whole.metadata and source.entries == whole.entries
        for name in whole.entries:
            assert np.array_equal(source.array(name).view(np.uint16), whole.array(name).view(np.uint16))
    assert np.array_equal(_embed(uform.Model.load_ram(tiny_text)), _embed(uform.Model.load_ram_buffer(tiny_text.read_bytes())))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            uform.Model.load_ram(fifo)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():  # blocked in open(): let it go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("load_ram blocked on a FIFO")
    assert isinstance(outcome[0], uform.CheckpointError), outcome
    assert str(outcome[0]) == f"{fifo}: is not a regular file (a FIFO); a checkpoint must be a regular file"


def test_an_unreadable_file_is_a_permission_error_naming_it(tiny_text: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def refuse(path: str, flags: int, *args: int) -> int:
        if os.fspath(path) == os.fspath(tiny_text):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(PermissionError, match=rf"^{tiny_text}: permission denied, cannot read the checkpoint file \(Permission denied\)$"):
        uform.Model.load_ram(tiny_text)


# -- NaN and infinities ----------------------------------------------------------------


def _poisoned(path: Path, tensor: str, index: int, value: float) -> bytes:
    """The checkpoint at ``path`` with element ``index`` (flat) of ``tensor`` set to ``value``."""
    blob = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", blob[:8])
    begin = json.loads(blob[8 : 8 + n])[tensor]["data_offsets"][0]
    at = 8 + n + begin + 2 * index
    blob[at : at + 2] = np.array([value], ml_dtypes.bfloat16).tobytes()
    return bytes(blob)


@pytest.mark.parametrize(
    ("tensor", "index", "value", "shown"),
    [
        ("text.blocks.1.mlp.fc2.weight", 130, np.nan, "nan, at index [1, 2]"),
        ("text.cls", 0, np.inf, "inf, at index [0]"),
        ("text.ln_final.weight", 63, -np.inf, "-inf, at index [63]"),
    ],
)
def test_nonfinite_weights_are_refused_naming_the_tensor(
    tiny_text: Path, tmp_path: Path, tensor: str, index: int, value: float, shown: str
) -> None:
    blob = _poisoned(tiny_text, tensor, index, value)
    message = re.escape(f"tensor '{tensor}': holds NaN or infinite values (the first, {shown})")
    with pytest.raises(uform.CheckpointError, match=message):
        uform.Model.load_ram_buffer(blob)
    path = tmp_path / "poisoned.safetensors"
    path.write_bytes(blob)
    for quantization in ("bf16", "e4m3", "f32"):  # the file named first, whoever checks the weight
        with pytest.raises(uform.CheckpointError, match=f"^{re.escape(str(path))}: (a matrix of the 'text' tower: )?{message}"):
            uform.Model.load_ram(path, quantization=quantization)


def test_a_matrix_with_bad_weights_in_two_panels_is_refused_naming_the_first(tiny_text: Path, tmp_path: Path) -> None:
    """The e4m3 backend reads a file's BF16 matrices unchecked and lets the packing check their
    bits (on several threads, panel by panel): a refusal still names the tensor and its first
    bad weight, whichever thread met one first."""
    tensor = "text.blocks.0.mlp.fc1.weight"
    blob = tiny_text.read_bytes()
    rows, k = json.loads(blob[8 : 8 + struct.unpack("<Q", blob[:8])[0]])[tensor]["shape"]
    assert rows > 32  # the two bad weights lie in different panels of 16 rows
    path = tmp_path / "poisoned.safetensors"
    path.write_bytes(tiny_text.read_bytes())
    path.write_bytes(_poisoned(path, tensor, 40 * k + 1, np.inf))
    path.write_bytes(_poisoned(path, tensor, 3 * k + 2, np.nan))
    for quantization in ("bf16", "e4m3"):
        with pytest.raises(uform.CheckpointError, match=re.escape(f"tensor '{tensor}': holds NaN or infinite values (the first, nan, at index [3, 2])")):
            uform.Model.load_ram(path, quantization=quantization)


def test_nonfinite_check_reads_the_bits_of_every_float_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safetensors, "FINITE_CHUNK", 7)  # the bad value lies in a later chunk
    for dtype in ("BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"):
        np_dtype = safetensors.DTYPES[dtype]
        finfo = ml_dtypes.finfo(np_dtype)  # type: ignore[no-untyped-call]
        fine = np.array([0.0, -0.0, 1.0, -2.0, float(finfo.max), float(finfo.min), float(finfo.tiny)] * 3, np_dtype)
        safetensors.check_finite(safetensors.parse(_container({"ok": fine})))
        for bad in (np.nan, np.inf, -np.inf):
            poisoned = fine.copy()
            poisoned[15] = bad
            if dtype == "F8_E4M3" and np.isinf(bad):
                continue  # no infinities in E4M3FN (a cast gives NaN)
            with pytest.raises(uform.CheckpointError, match=r"tensor 'w': holds NaN or infinite values .* at index \[15\]"):
                safetensors.parse(_container({"w": poisoned}))
    ints = np.array([-1, 0x7FFF, -32768], np.int16)  # integer tensors are never judged
    safetensors.parse(_container({"i": ints}))


def _container(tensors: dict[str, np.ndarray]) -> memoryview:
    import io

    buf = io.BytesIO()
    safetensors.write(buf, tensors, {})
    return memoryview(buf.getvalue())



def test_weights_the_machine_cannot_hold_are_refused_before_any_is_read(tiny_text: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a sparse file as large as its header claims costs no disk, and was read until memory ran out
    from uform.core import runtime

    with checkpoint.CheckpointFile(tiny_text) as source:
        values = sum(int(np.prod(e.shape)) for e in source.entries.values())
    monkeypatch.setattr(runtime, "machine_memory", lambda: values + 1, raising=False)  # E4M3's one byte a value fits, BF16's two do not
    with monkeypatch.context() as m:
        m.setattr(checkpoint.CheckpointFile, "read_into", lambda *a, **k: pytest.fail("a weight was read"))
        for quantization in ("bf16", "f32"):
            message = (
                f"{tiny_text}: its {values:,} weight values take at least {2 * values:,} bytes at {quantization.upper()}, "
                f"more than this machine's {values + 1:,} bytes of RAM and swap: it cannot be loaded here"
            )
            with pytest.raises(uform.UnsupportedError, match=f"^{re.escape(message)}$"):
                uform.Model.load_ram(tiny_text, quantization=quantization)
    assert _embed(uform.Model.load_ram(tiny_text, quantization="e4m3")).shape == (2, 32)


@pytest.mark.parametrize("fault", [OSError(12, "Cannot allocate memory"), MemoryError("Unable to allocate 256. MiB")])
def test_running_out_of_memory_while_loading_is_unsupported_naming_the_file(
    tiny_text: Path, monkeypatch: pytest.MonkeyPatch, fault: BaseException
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:  # a ulimit or a cgroup refusing what the check let through
        raise fault

    monkeypatch.setattr(checkpoint.CheckpointFile, "read_into", refuse)
    for quantization in ("bf16", "e4m3", "f32"):
        message = f"{tiny_text}: ran out of memory while placing its weights ({fault}): it cannot be loaded here"
        with pytest.raises(uform.UnsupportedError, match=f"^{re.escape(message)}$"):
            uform.Model.load_ram(tiny_text, quantization=quantization)


@pytest.mark.parametrize("tensor, index", [("text.cls", [5]), ("text.blocks.0.mlp.fc1.weight", [0, 5])])
def test_a_finite_f32_weight_beyond_bf16s_range_is_refused_naming_it(tiny_text: Path, tmp_path: Path, tensor: str, index: list[int]) -> None:
    # float32's largest value rounds to infinity in BF16: stored bits that pass the finiteness
    # check became an infinite weight (text.cls: every text_encode then failed as the input's fault)
    container = safetensors.parse(memoryview(tiny_text.read_bytes()))
    tensors = {name: container.array(name) for name in container.entries}
    weight = tensors[tensor].astype(np.float32)
    weight[tuple(index)] = np.finfo(np.float32).max
    tensors[tensor] = weight
    config = json.loads(container.metadata["uform"]) | {"format_version": 2}
    path = tmp_path / "f32.safetensors"
    safetensors.write(path, tensors, {"uform": json.dumps(config)})
    message = (
        f"tensor '{tensor}': its value 3.4028235e+38 at index {index} is beyond BF16's range and rounds to infinity "
        "in a BF16 or E4M3 load, which holds it in BF16; load it with quantization f32"
    )
    for quantization in ("bf16", "e4m3"):
        with pytest.raises(uform.CheckpointError, match=f"^{re.escape(str(path))}: (a matrix of the 'text' tower: )?{re.escape(message)}$"):
            uform.Model.load_ram(path, quantization=quantization)
        with pytest.raises(uform.CheckpointError, match=f"^(a matrix of the 'text' tower: )?{re.escape(message)}$"):
            uform.Model.load_ram_buffer(path.read_bytes(), quantization=quantization)
    uform.Model.load_ram(path, quantization="f32").close()  # held as stored, the value is finite
