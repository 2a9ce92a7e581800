"""The Model API's last sharp edges: close() from inside a call's progress handler (an error, never
a hang), inputs whose encoding overflows to NaN (refused naming the item, nothing written), and
released memoryviews as items (an error naming the item)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import media_audio as media
import numpy as np
import pytest

import uform
from ckpt import make_checkpoint

GUARD = 60.0  # seconds a call may take before the test calls it hung; never reached when it passes
R = 16000  # the tiny preset's audio rate


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("edges") / "tiny.safetensors", "tiny", 5, ["text", "image", "audio"])


@pytest.fixture(scope="module")
def model(ckpt: Path) -> uform.Model:
    return uform.Model.load_ram(ckpt, quantization=uform.Scalar.F32)


def test_close_inside_a_progress_handler_raises_instead_of_hanging(ckpt: Path) -> None:
    m = uform.Model.load_ram(ckpt)
    answer: dict[str, Any] = {}

    def call() -> None:
        try:
            answer["encoded"] = m.text_encode(["a", "bc"], uform.Arena(), progress=lambda done, total: m.close())
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            answer["error"] = exc

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(GUARD)
    assert not worker.is_alive(), "text_encode hung: close() waited for the call it ran inside"
    error = answer.get("error")
    assert isinstance(error, RuntimeError) and "Model.close() was called inside a call of this Model" in str(error)
    assert "return False from the handler to cancel" in str(error)
    assert len(m.text_encode(["still open"], uform.Arena()).embeddings) == 1  # the model stayed open
    m.close()
    with pytest.raises(ValueError, match="this Model was closed"):
        m.text_encode(["x"], uform.Arena())


def _sine(amplitude: float) -> np.ndarray:
    return (amplitude * np.sin(np.arange(R, dtype=np.float64) / 7)).astype(np.float32)


@pytest.mark.parametrize("amplitude", [1e18, 1e30])
def test_samples_that_overflow_are_refused_naming_the_item(model: uform.Model, amplitude: float) -> None:
    arena = uform.Arena()
    before = model.audio_encode_samples([_sine(0.5)], R, arena)
    kept = np.array(before.embeddings)
    with pytest.raises(uform.InputError, match=r"item 1: the encoder's output for it is not finite \(NaN or infinity\)") as info:
        model.audio_encode_samples([_sine(0.5), _sine(amplitude), _sine(0.25)], R, arena)
    assert info.value.index == 1
    assert np.array_equal(np.array(before.embeddings), kept)  # nothing was written: the last output still reads
    assert np.isfinite(np.array(model.audio_encode_samples([_sine(1e17)], R, arena).embeddings)).all()


def test_a_float_wav_holding_1e30_is_refused_naming_the_file(model: uform.Model, tmp_path: Path) -> None:
    loud = media.write(tmp_path / "loud.wav", _sine(1e30)[None, :], R, "pcm_f32le", "wav")
    quiet = media.write(tmp_path / "quiet.wav", _sine(0.5)[None, :], R, "pcm_f32le", "wav")
    with pytest.raises(uform.InputError, match=r"item 1: the encoder's output for it is not finite") as info:
        model.audio_encode([quiet, loud], uform.Arena())
    assert info.value.index == 1
    assert np.isfinite(np.array(model.audio_encode([quiet], uform.Arena()).embeddings)).all()


def _released(buffer: Any) -> memoryview:
    view = memoryview(buffer)
    view.release()
    return view


RELEASED = r"item 1: the memoryview was released \(memoryview.release\(\) or the end of its with block\)"


def test_a_released_memoryview_is_an_error_naming_the_item(model: uform.Model, tmp_path: Path) -> None:
    with pytest.raises(uform.InputError, match=RELEASED):
        model.text_encode([b"fine", _released(b"gone")], uform.Arena())
    png = media_png()
    with pytest.raises(uform.InputError, match=RELEASED):
        model.image_encode([png, _released(png)], uform.Arena())
    pixels = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(uform.InputError, match=RELEASED):
        model.image_encode_pixels([pixels, _released(pixels.tobytes())], uform.Arena())
    with pytest.raises(uform.InputError, match=RELEASED):
        model.audio_encode_samples([_sine(0.5), _released(_sine(0.5))], R, uform.Arena())
    wav = media.write(tmp_path / "quiet.wav", _sine(0.5)[None, :], R, "pcm_s16le", "wav").read_bytes()
    with pytest.raises(uform.InputError, match=RELEASED):
        model.audio_encode([wav, _released(wav)], uform.Arena())


def media_png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


def _huge(height: int, width: int) -> np.ndarray:
    """A [height, width, 3] uint8 view of one pixel: no memory, however large it says it is."""
    return np.broadcast_to(np.full((1, 1, 3), 7, np.uint8), (height, width, 3))


@pytest.mark.parametrize(("height", "width"), [(60000, 60000), (10001, 10000), (1, 100_000_001)])
def test_pixels_over_max_pixels_are_refused_naming_the_item_before_anything_is_written(
    model: uform.Model, height: int, width: int
) -> None:
    arena = uform.Arena()
    before = model.image_encode_pixels([np.zeros((8, 8, 3), np.uint8)], arena)
    kept, generation = np.array(before.embeddings), arena.generation
    with pytest.raises(uform.InputError) as info:
        model.image_encode_pixels([np.zeros((8, 8, 3), np.uint8), _huge(height, width)], arena)
    assert info.value.index == 1
    assert str(info.value) == (
        f"item 1: the image is {width}x{height} = {width * height} pixels, over the limit of 100000000 "
        "(uform.plugins.media.image.MAX_PIXELS) that files are held to as well; resize it before encoding it"
    )
    assert arena.generation == generation and np.array_equal(np.array(before.embeddings), kept)


def test_pixels_at_max_pixels_are_encoded(model: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    from uform.plugins.media import image as pictures

    monkeypatch.setattr(pictures, "MAX_PIXELS", 40 * 30)
    assert len(model.image_encode_pixels([_huge(30, 40), _huge(40, 30)], uform.Arena())) == 2
    with pytest.raises(uform.InputError, match=r"item 0: the image is 41x30 = 1230 pixels, over the limit of 1200 "):
        model.image_encode_pixels([_huge(30, 41)], uform.Arena())


def test_an_empty_checkpoint_path_is_named_as_empty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # '' was read as '.', the current folder: '.: is a directory, not a checkpoint file'
    with pytest.raises(FileNotFoundError, match="^the checkpoint path is empty: name a .safetensors file, or pass None for the default model$"):
        uform.Model.load_ram("")  # Path('') is Path('.') already: only the str can be told apart


def test_a_released_memoryview_as_the_checkpoint_buffer_is_named(ckpt: Path) -> None:
    with pytest.raises(ValueError, match=r"^the checkpoint buffer is a released memoryview \(memoryview.release\(\) or the end of its with block\)"):
        uform.Model.load_ram_buffer(_released(ckpt.read_bytes()))  # it was Python's 'operation forbidden on released memoryview object'


@pytest.mark.parametrize("items", [None, 5])
def test_items_that_are_not_iterable_are_named_by_the_argument(model: uform.Model, items: Any) -> None:
    arena = uform.Arena()  # each was Python's "'NoneType' object is not iterable", naming no argument
    kind = type(items).__name__
    calls = {
        "texts": lambda: model.text_encode(items, arena),
        "files": lambda: model.image_encode(items, arena),
        "pixels": lambda: model.image_encode_pixels(items, arena),
        "samples": lambda: model.audio_encode_samples(items, R, arena),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=f"^{name} must be a sequence, got {kind}$"):
            call()
    assert arena.generation == 0


def test_a_progress_handler_answering_numpys_false_cancels(model: uform.Model, ckpt: Path) -> None:
    limit = np.float64(0.5)  # a handler comparing numpy values answers np.False_, which went on as "any other answer"
    arena = uform.Arena()
    kept = np.array(model.text_encode(["keep"], arena).embeddings)
    with pytest.raises(uform.CancelledError, match="cancelled by the progress handler at 2 of 2; nothing was written"):
        model.text_encode(["a", "b"], arena, progress=lambda done, total: done / total < limit)
    assert arena.generation == 1 and np.array_equal(np.array(model.text_encode(["keep"], uform.Arena()).embeddings), kept)
    with pytest.raises(uform.CancelledError):
        uform.Model.load_ram(ckpt, progress=lambda done, total: np.bool_(False))
    for answer in (0, None, np.True_):  # only False cancels
        assert len(model.text_encode(["a"], uform.Arena(), progress=lambda done, total: answer)) == 1


def test_a_tape_refuses_offsets_that_are_not_integers_and_scales_of_another_length(model: uform.Model) -> None:
    values = np.arange(3, dtype=np.float32)
    with pytest.raises(TypeError, match="^offsets must be integers, got float64$"):
        uform.RowsTape.from_numpy(values, np.array([0, 1.9, 3]))  # cut to [0, 1, 3]: the first row lost its second value
    with pytest.raises(ValueError, match=r"^scales must hold one value per row of values \(3\), got 7$"):
        uform.RowsTape.from_numpy(values, [0, 1, 3], scales=np.ones(7, np.float32))
    tape = uform.RowsTape.from_numpy(values, [0, 1, 3])
    assert tape[np.int64(1)].tolist() == [1.0, 2.0] and len(uform.RowsTape.from_numpy(values[:0], [0])) == 0
    with pytest.raises(TypeError, match="^a tape's rows are indexed by an int, got slice"):
        tape[0:1]  # type: ignore[index]
    tokens = model.text_encode(["ab", "c"], uform.Arena(), outputs=uform.Outputs.TOKENS, outputs_scalar=uform.Scalar.I8).tokens
    assert tokens is not None  # the verbs' own I8 tapes hold a scale per token row
    again = uform.RowsTape.from_numpy(*tokens.to_numpy(), scales=np.array(tokens.scales))
    assert again.lengths.tolist() == [2, 1] and np.array_equal(again[0], tokens[0])
