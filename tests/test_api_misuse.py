"""The API page's misuses, each answered at once in the caller's terms: a Model constructed from a
path (it loads nothing), a cpu_class or gpu_class that is no class (the caller's ValueError, not a
backend's bug reported in the log), and what a demanding caller passes the two decoded-input verbs."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import uform
from ckpt import make_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("misuse") / "tiny.safetensors", "tiny", 7, ["text", "image", "audio"])


def test_a_model_constructed_from_a_path_is_a_type_error_naming_the_loads(ckpt: Path) -> None:
    # it answered a Model, whose describe() and verbs then raised AttributeError: 'PosixPath' object has no attribute 'describe'
    for given in (ckpt, str(ckpt)):
        with pytest.raises(TypeError, match=rf"^Model\(\) takes a loaded runtime, not {type(given).__name__}: load a checkpoint "
                                            r"with Model.load_ram\(path\), Model.load_ram_buffer\(buffer\), Model.load_vram\(path\)"):
            uform.Model(given)  # type: ignore[arg-type]


@pytest.mark.parametrize(("load", "what", "kind"), [
    ("load_ram", "cpu_class", "CPUClass"), ("load_ram_buffer", "cpu_class", "CPUClass"),
    ("load_vram", "gpu_class", "GPUClass"), ("load_vram_buffer", "gpu_class", "GPUClass"),
])  # fmt: skip
def test_a_pin_that_is_no_class_is_the_callers_value_error_before_any_backend_is_asked(
    ckpt: Path, caplog: pytest.LogCaptureFixture, load: str, what: str, kind: str
) -> None:
    # cpu_class='junk' reached the e4m3 backend's accepts, which raised: the log said "backend 'e4m3': its accepts
    # raised ValueError: ...; uform ... (plugin 'e4m3') has a bug: report it there", then the cpu backend raised it again;
    # load_vram(gpu_class='junk') on a machine without CUDA said "no CUDAExecutionProvider" and never named the pin
    source = ckpt.read_bytes() if load.endswith("_buffer") else ckpt
    with caplog.at_level(logging.DEBUG), pytest.raises(ValueError, match=rf"^{what} 'junk' is not a {kind}; choose one of "):
        getattr(uform.Model, load)(source, **{what: "junk"})
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_pin_given_as_its_string_loads_as_the_class(ckpt: Path) -> None:
    with uform.Model.load_ram(ckpt, cpu_class="x86-64-v2") as model:
        assert model.describe().cpu_class is uform.CPUClass.X86_64_V2


def test_views_of_pixels_and_samples_encode_as_their_copies(ckpt: Path) -> None:
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (41, 53, 3), dtype=np.uint8)
    samples = (rng.standard_normal(5000) * 0.1).astype(np.float32)
    locked = pixels.copy()
    locked.flags.writeable = False
    with uform.Model.load_ram(ckpt, quantization=uform.Scalar.F32) as model:
        views = [pixels[::-1, ::-1], pixels[::2, ::3], pixels[:, :, ::-1], locked]
        got = np.array(model.image_encode_pixels(views, uform.Arena()).embeddings)
        want = np.array(model.image_encode_pixels([np.array(v) for v in views], uform.Arena()).embeddings)
        assert np.array_equal(got, want)
        got = np.array(model.audio_encode_samples([samples[::-1], samples[::3]], 16000, uform.Arena()).embeddings)
        want = np.array(model.audio_encode_samples([samples[::-1].copy(), samples[::3].copy()], 16000, uform.Arena()).embeddings)
        assert np.array_equal(got, want)


def test_nonfinite_samples_are_refused_before_any_batch_is_encoded(ckpt: Path) -> None:
    # the check ran as each item's window was made, batch by batch: a NaN at item 2000 of the default model's
    # came after those 2000 were encoded (2.1-2.3 s on 2 cores, docs/media.md, "Recordings"); here the first batch's progress was reported first
    rng = np.random.default_rng(5)
    rows = [(rng.standard_normal(16000) * 0.1).astype(np.float32) for _ in range(40)]
    rows[20][123] = np.nan
    arena, done = uform.Arena(), []
    before = np.array(uform.Model.load_ram(ckpt).audio_encode_samples(rows[:3], 16000, arena).embeddings)
    with uform.Model.load_ram(ckpt) as model:
        for rate in (16000, 44100, 8000):
            with pytest.raises(uform.InputError, match=r"^item 20: holds NaN or infinite samples$"):
                model.audio_encode_samples(rows, rate, arena, progress=lambda d, t: done.append(d))
        assert done == [] and arena.generation == 1
        assert np.array_equal(np.array(model.audio_encode_samples(rows[:3], 16000, uform.Arena()).embeddings), before)


def test_nonfinite_samples_past_the_window_are_never_read(ckpt: Path) -> None:
    x = (np.random.default_rng(6).standard_normal(3 * 16000) * 0.1).astype(np.float32)
    x[40000] = np.inf  # a window is 16000 samples at 16 kHz: what follows is cut unread, as before
    with uform.Model.load_ram(ckpt) as model:
        got = np.array(model.audio_encode_samples([x], 16000, uform.Arena()).embeddings)
        assert np.array_equal(got, np.array(model.audio_encode_samples([x[:16000].copy()], 16000, uform.Arena()).embeddings))


def test_an_executor_that_is_not_one_is_named_alike_by_the_load_and_the_receivers(ckpt: Path) -> None:
    # on() and deferred() said 'expected a uform.Executor, got int', the load 'executor must be a uform.Executor, got int'
    with uform.Model.load_ram(ckpt) as model:
        for misuse in (lambda: uform.Model.load_ram(ckpt, executor=2), lambda: model.on(2), lambda: model.deferred(2)):  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=r"^executor must be a uform.Executor, got int$"):
                misuse()


def test_pickling_a_model_is_refused_in_uforms_words(ckpt: Path) -> None:
    # it was ONNX Runtime's "cannot pickle 'onnxruntime.capi.onnxruntime_pybind11_state.InferenceSession' object"
    import copy
    import pickle

    with uform.Model.load_ram(ckpt) as model:
        for send in (pickle.dumps, copy.deepcopy):
            with pytest.raises(TypeError, match=r"^a uform.Model cannot be pickled or copied to another process .*: pass the "
                                                r"checkpoint's path and load it there with Model.load_ram\(path\)"):
                send(model)
        assert copy.copy(model).describe() == model.describe()  # a copy shares the load, as before
