"""A Model loaded before os.fork, in the child (docs/api.md, "os.fork"): its verbs answer what the
parent's answer, bit for bit, and close() and garbage collection return. Each child ends with
os._exit, as multiprocessing's do: a forked child of a process that imported onnxruntime hangs or
crashes in ONNX Runtime's own teardown on a normal exit, with or without uform."""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import uform
from ckpt import make_checkpoint

GUARD = 60.0  # seconds a child may take before the test calls it hung; never reached when it passes
RNG = np.random.default_rng(11)
PIXELS = [RNG.integers(0, 256, (40, 50, 3), dtype=np.uint8) for _ in range(12)]
SAMPLES = [(RNG.standard_normal(9000) * 0.1).astype(np.float32) for _ in range(12)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("fork") / "tiny.safetensors", "tiny", 9, ["text", "image", "audio"])


def encoded(model: uform.Model, executor: uform.Executor) -> bytes:
    images = np.array(model.image_encode_pixels(PIXELS, uform.Arena()).embeddings)
    sounds = np.array(model.on(executor).audio_encode_samples(SAMPLES, 16000, uform.Arena()).embeddings)
    texts = np.array(model.deferred(executor).text_encode(["a", "bc"], uform.Arena()).result(GUARD).embeddings)
    return images.tobytes() + sounds.tobytes() + texts.tobytes()


def in_a_child(job: Callable[[], bytes]) -> bytes:
    """What ``job`` answers in a forked child, or AssertionError when the child hangs or fails."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, and leave without Python's teardown
        os.close(read)
        try:
            answer = b"ok" + job()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            answer = f"error {type(exc).__name__}: {exc}".encode()
        with os.fdopen(write, "wb") as out:
            out.write(answer)
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + GUARD
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            os.close(read)
            raise AssertionError(f"the forked child hung for {GUARD:.0f} s")
        time.sleep(0.02)
    with os.fdopen(read, "rb") as got:
        answer = got.read()
    assert answer.startswith(b"ok"), answer.decode(errors="replace")
    return answer[2:]


@pytest.mark.parametrize("quantization", ["bf16", "e4m3", "f32"])
def test_a_model_loaded_before_fork_answers_the_child_as_the_parent(ckpt: Path, quantization: str) -> None:
    # the child's first call of more than one item waited forever: the executor's pool had been
    # started by the parent's calls, and its threads are not in the child
    with uform.Executor(2) as executor, uform.Model.load_ram(ckpt, quantization=quantization) as model:
        parent = encoded(model, executor)
        assert in_a_child(lambda: encoded(model, executor)) == parent
        assert encoded(model, executor) == parent  # and the parent's model is the parent's still


def test_close_and_garbage_collection_in_a_forked_child_return(ckpt: Path) -> None:
    # close() in the child hung freeing the sessions (ONNX Runtime's threads are the parent's), so did
    # a model collected there; now the child keeps them and close() refuses further calls
    model, other = uform.Model.load_ram(ckpt), uform.Model.load_ram(ckpt)
    model.image_encode_pixels(PIXELS, uform.Arena())

    def closing() -> bytes:
        nonlocal other
        model.close()
        with pytest.raises(ValueError, match="^this Model was closed"):
            model.text_encode(["a"], uform.Arena())
        del other
        gc.collect()
        return b""

    assert in_a_child(closing) == b""
    assert len(model.text_encode(["a"], uform.Arena())) == 1  # the parent's stays open
    model.close()


def work(i: int) -> bytes:
    return np.array(POOLED.image_encode_pixels(PIXELS, uform.Arena()).embeddings).tobytes()


POOLED: uform.Model


def test_a_multiprocessing_fork_pool_uses_the_parents_model(ckpt: Path) -> None:
    global POOLED
    POOLED = uform.Model.load_ram(ckpt)
    try:
        want = work(0)
        with multiprocessing.get_context("fork").Pool(2) as pool:
            assert pool.map_async(work, range(4)).get(GUARD) == [want] * 4
    finally:
        POOLED.close()
