"""The audio plugin: graph parity with the PyTorch reference, decoding every format, the
window rules (mono mean, resampling without a lost tail, cut or pad), bad input, stats."""

from __future__ import annotations

import dataclasses
import io
import os
import resource
import time
from pathlib import Path
from typing import Any

import media_audio as media
import numpy as np
import pytest

import uform
from ckpt import make_checkpoint
from uform.core import checkpoint
from uform.core.host import get_host
from uform.model import runtime_of
from uform.plugins import audio
from uform.plugins.melfront import power
from uform.plugins.media import audio as recordings
from uform.plugins.media import files as sources

R, N = 16000, 16000  # the tiny preset's rate and window


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("audio") / "tiny-audio.safetensors", "tiny", 7, ["audio"])


@pytest.fixture(scope="module")
def model(ckpt: Path) -> uform.Model:
    return uform.Model.load_ram(ckpt, executor=uform.Executor(2), quantization=uform.Scalar.F32)


@pytest.fixture(scope="module")
def tower() -> audio.AudioTower:
    return audio.read(get_host().modalities["audio"].tower.presets["tiny"], None)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two seconds of a stereo chord (440 Hz left, 880 Hz right) in every format."""
    d = tmp_path_factory.mktemp("clips")
    return {name: media.write_format(d, name, media.tone(2.0, rate, (440.0, 880.0))) for name, (_, _, _, rate) in media.FORMATS.items()}


def decode_item(index: int, item: object, tower: audio.AudioTower) -> recordings.Recording:
    """``recordings.decode`` of one item as the verb sees it (checked, at position ``index``)."""
    (source,) = sources.sources([item], "recordings")
    return recordings.decode(dataclasses.replace(source, index=index), tower.sample_rate, tower.samples)


def embed(model: uform.Model, files: list[Any], **kw: Any) -> np.ndarray:
    return np.array(model.audio_encode(files, uform.Arena(), **kw).embeddings)


def embed_samples(model: uform.Model, rows: Any, rate: int, **kw: Any) -> np.ndarray:
    return np.array(model.audio_encode_samples(rows, rate, uform.Arena(), **kw).embeddings)


# -- the tower ------------------------------------------------------------------------------


def test_graph_matches_reference(model: uform.Model, ckpt: Path) -> None:
    torch = pytest.importorskip("torch")
    from uform.exporters.reference import ReferenceModel

    rng = np.random.default_rng(0)
    windows = np.stack([
        rng.standard_normal(N).astype(np.float32) * 0.3,
        media.tone(1.0, R, (1000.0,))[0],
        np.zeros(N, np.float32),  # log of the floor everywhere
        np.concatenate([rng.uniform(-1, 1, N // 3), np.zeros(N - N // 3)]).astype(np.float32),
    ])  # fmt: skip
    ours = embed_samples(model, list(windows), R)
    with torch.no_grad():
        ref = ReferenceModel.from_checkpoint(ckpt).towers["audio"].encode(torch.from_numpy(windows)).numpy()
    assert ours.shape == (4, 32)
    np.testing.assert_allclose(ours, ref, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("front", [{"n_fft": 255, "hop": 100, "n_mels": 20, "patch_frames": 5}, {"n_fft": 2, "hop": 2, "n_mels": 3, "patch_frames": 1000}])
def test_odd_and_tiny_ffts_match_the_reference(front: dict[str, int], tmp_path: Path) -> None:
    """Geometries off the presets: an odd n_fft (no Nyquist bin), the smallest n_fft."""
    torch = pytest.importorskip("torch")
    import ml_dtypes

    from uform.core.config import make_config
    from uform.exporters.reference import ReferenceModel

    cfg = {**get_host().modalities["audio"].tower.presets["tiny"], "samples": 8000, **front}
    config = make_config(32, 32, {"audio": cfg})
    parsed = audio.read(cfg, config)
    rng = np.random.default_rng(8)
    weights = {k: (rng.standard_normal(v.shape) * v.std + v.mean).astype(ml_dtypes.bfloat16) for k, v in audio.tensors(parsed, config).items()}
    checkpoint.save(tmp_path / "odd.safetensors", config, weights)
    x = (rng.standard_normal((3, 8000)) * 0.2).astype(np.float32)
    ours = embed_samples(uform.Model.load_ram(tmp_path / "odd.safetensors", quantization=uform.Scalar.F32), x, R)
    with torch.no_grad():
        ref = ReferenceModel.from_checkpoint(tmp_path / "odd.safetensors").towers["audio"].encode(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, ref, atol=2e-5)


def test_front_end_constants_match_the_reference(tower: audio.AudioTower) -> None:
    torch = pytest.importorskip("torch")
    from uform.exporters.reference.audio import mel_filters

    ours = audio.mel_filters(tower)
    ref = mel_filters(R, 400, 32).numpy().T
    assert ours.shape == (201, 32)
    np.testing.assert_allclose(ours, ref, atol=1e-12)
    assert ours.max() <= 1.0 and (ours.sum(axis=0) > 0).all()  # every filter catches some bin
    # the DFT folded on the window's symmetry gives torch.stft's power spectrum
    x = np.random.default_rng(1).standard_normal(N).astype(np.float64)
    frames = np.lib.stride_tricks.sliding_window_view(x, 400)[::160]
    j, cos, sin = power.dft_halves(400)
    spectrum = ((frames[:, j] + frames[:, 400 - j]) @ cos) ** 2 + ((frames[:, j] - frames[:, 400 - j]) @ sin) ** 2
    stft = torch.stft(torch.from_numpy(x), 400, 160, window=torch.hann_window(400, periodic=True, dtype=torch.float64), center=False, return_complex=True)
    np.testing.assert_allclose(spectrum, (stft.abs() ** 2).numpy().T, rtol=1e-9, atol=1e-9)
    assert tower.frames == 98 and tower.tokens == 14


def test_config_is_checked() -> None:
    preset = dict(get_host().modalities["audio"].tower.presets["tiny"])
    with pytest.raises(uform.CheckpointError, match="towers.audio.patch_frames"):
        audio.read({**preset, "patch_frames": 99}, None)  # type: ignore[arg-type]
    with pytest.raises(uform.CheckpointError, match="towers.audio.samples"):
        audio.read({**preset, "samples": 100}, None)  # type: ignore[arg-type]
    with pytest.raises(uform.CheckpointError, match="towers.audio.n_fft"):
        audio.read({**preset, "n_fft": 65536}, None)  # type: ignore[arg-type]
    with pytest.raises(uform.CheckpointError, match="towers.audio.hop: 16776817 frames"):
        audio.read({**preset, "samples": 1 << 24, "hop": 1}, None)  # type: ignore[arg-type]


# -- the window -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["u8", "s16", "s16p", "s32", "s32p", "flt", "fltp", "dbl", "dblp"])
def test_mono_reads_every_sample_format(fmt: str) -> None:
    import av

    rng = np.random.default_rng(4)
    x = rng.uniform(-0.9, 0.9, (3, 64))  # three channels, a layout no mean shortcut fits
    dtype, scale = recordings._KINDS[fmt.rstrip("p")]
    raw = x * (1 / scale) + (128 if fmt == "u8" else 0)
    raw = np.round(raw).astype(dtype) if np.issubdtype(dtype, np.integer) else raw.astype(dtype)
    planar = fmt.endswith("p")
    frame = av.AudioFrame.from_ndarray(raw if planar else np.ascontiguousarray(raw.T).reshape(1, -1), format=fmt, layout="3.0")
    want = (raw.astype(np.float64) - (128 if fmt == "u8" else 0)).mean(axis=0) * scale
    np.testing.assert_allclose(recordings.mono(frame), want, atol=1e-6)


def test_wav_at_the_tower_rate_is_exactly_its_samples(model: uform.Model, tmp_path: Path) -> None:
    signal = media.tone(0.75, R, (300.0,))
    path = media.wav(tmp_path / "mono16k.wav", signal, R)
    pcm = media.pcm16(signal)[:, 0].astype(np.float32) / 32768
    window = decode_item(0, path, runtime_of(model).towers["audio"].parsed).samples
    np.testing.assert_array_equal(window, np.concatenate([pcm, np.zeros(N - len(pcm), np.float32)]))
    np.testing.assert_array_equal(embed(model, [path]), embed_samples(model, [pcm], R))


@pytest.mark.parametrize(("n", "padded", "truncated"), [(N - 1, 1, 0), (N, 0, 0), (N + 1, 0, 1)])
def test_a_recording_of_exactly_the_window_is_neither_padded_nor_cut(model: uform.Model, tmp_path: Path, n: int, padded: int, truncated: int) -> None:
    """Files and buffers count alike: one of exactly N samples at the tower's rate is not "longer"."""
    signal = media.tone(n / R, R, (300.0,))
    path = media.wav(tmp_path / "exact.wav", signal, R)
    counted = []
    for encode in (lambda s: model.audio_encode([path], uform.Arena(), stats=s), lambda s: model.audio_encode_samples([media.pcm16(signal)[:, 0] / np.float32(32768)], R, uform.Arena(), stats=s)):
        stats = uform.AudioEncodeStats()
        encode(stats)
        counted.append((stats.padded_items, stats.truncated_items))
    assert counted == [(padded, truncated)] * 2


def test_stereo_is_the_mean_of_channels_and_resampling_keeps_the_tail(model: uform.Model, tower: audio.AudioTower, tmp_path: Path) -> None:
    left = media.tone(0.5, 44100, (1000.0,), amplitude=0.8)[0]
    path = media.wav(tmp_path / "left-only.wav", np.stack([left, np.zeros_like(left)]), 44100)
    window = decode_item(0, path, tower).samples
    expected = 0.4 * np.sin(2 * np.pi * 1000.0 * np.arange(8000) / R)  # mean of (L, 0), not (L + R) / sqrt 2
    np.testing.assert_allclose(window[32:7968], expected[32:7968], atol=2e-3)
    assert np.abs(window[7990:8000]).max() > 0.1  # the last samples were flushed out, not lost
    assert not window[8000:].any()  # then zero padding
    # files and buffers share the resampler: the same samples give the same window
    pcm = media.pcm16(np.stack([left, np.zeros_like(left)])).astype(np.float32) / 32768
    np.testing.assert_array_equal(recordings.resample(0, pcm.mean(axis=1, dtype=np.float32), 44100, tower.sample_rate, tower.samples).samples, window)
    np.testing.assert_allclose(embed(model, [path]), embed_samples(model, [pcm.mean(axis=1, dtype=np.float32)], 44100), atol=1e-6)


@pytest.mark.parametrize("rate", [1, 100, 8000, 11025, 22050, 44100, 48000, 96000, 1_000_000])
def test_resampling_loses_no_sample_however_short(rate: int) -> None:
    for n in (1, 5, 33, 100, 4321, 70001):
        if n * R > 2_000_000 * rate:
            continue  # more than the 2 M samples of this window
        x = np.random.default_rng(n).uniform(-0.5, 0.5, n).astype(np.float32)
        window = recordings.Window(R, 2_000_000)
        for start in range(0, n, 5000):
            window.add(x[start : start + 5000], rate)
        out = window.finish()
        due = (n * R + rate // 2) // rate  # round(n R / rate)
        assert window.produced == due, (rate, n)
        assert not out[due:].any() and (due < 8 or np.abs(out[due - 8 : due]).max() > 0), (rate, n)


def test_a_rate_change_mid_stream_flushes_and_goes_on() -> None:
    window = recordings.Window(R, 10**6)
    window.add(np.ones(4410, np.float32) * 0.5, 44100)  # 0.1 s
    window.add(np.ones(800, np.float32) * 0.5, 8000)  # 0.1 s
    window.add(np.ones(1600, np.float32) * 0.5, R)  # 0.1 s, not resampled
    out = window.finish()
    assert window.produced == 3 * 1600 and window.seconds == pytest.approx(0.3)
    np.testing.assert_allclose(out[200:1400], 0.5, atol=0.01)
    np.testing.assert_array_equal(out[3200:4800], 0.5)


def test_every_format_decodes_to_the_same_sound(model: uform.Model, clips: dict[str, Path]) -> None:
    names = list(clips)
    got = embed(model, [clips[n] for n in names])
    chord = media.tone(2.0, 48000, (440.0, 880.0)).mean(axis=0)
    want = embed_samples(model, [chord], 48000)[0]
    floors = {"wav": 0.9999, "flac": 0.9999, "mp3": 0.999, "opus-ogg": 0.98, "opus-webm": 0.98}  # Opus is the lossiest
    for name, row in zip(names, got):
        assert row @ want > floors[name], (name, row @ want)
    assert got[names.index("opus-ogg")] @ got[names.index("opus-webm")] > 0.9999  # one codec, two containers
    stats = uform.AudioEncodeStats()
    embed(model, [clips[n] for n in names], stats=stats)
    assert (stats.items, stats.batches, stats.truncated_items, stats.padded_items) == (5, 1, 5, 0)
    assert 5.0 <= stats.audio_seconds <= 5 * 2.0  # about the window each, never the whole file


def test_paths_bytes_and_file_objects_agree(model: uform.Model, tower: audio.AudioTower, clips: dict[str, Path]) -> None:
    path = clips["flac"]
    with open(path, "rb") as f:
        items = [path, str(path), path.read_bytes(), bytearray(path.read_bytes()), io.BytesIO(path.read_bytes()), f]
        windows = [decode_item(i, item, tower).samples for i, item in enumerate(items)]
        got = embed(model, items)  # file objects are read from their start again
    for window, row in zip(windows[1:], got[1:]):
        np.testing.assert_array_equal(window, windows[0])
        np.testing.assert_allclose(row, got[0], atol=1e-6)  # a row's place in the batch moves the last bit


def test_content_not_extension_decides(model: uform.Model, clips: dict[str, Path], tmp_path: Path) -> None:
    renamed = tmp_path / "really-flac.mp3"
    renamed.write_bytes(clips["flac"].read_bytes())
    np.testing.assert_array_equal(embed(model, [renamed]), embed(model, [clips["flac"]]))


def test_tags_that_are_not_utf8_do_not_fail_a_file(model: uform.Model, tower: audio.AudioTower, tmp_path: Path) -> None:
    signal = media.tone(0.5, 44100)
    path = media.bad_tags_flac(tmp_path / "latin1-title.flac", signal, 44100)
    window = decode_item(0, path, tower).samples
    pcm = media.pcm16(signal)[:, 0].astype(np.float32) / 32768
    np.testing.assert_allclose(window, recordings.resample(0, pcm, 44100, tower.sample_rate, tower.samples).samples, atol=1e-4)


def test_ten_hour_recording_costs_its_window(model: uform.Model, tmp_path: Path) -> None:
    path, head = media.ten_hour_wav(tmp_path / "ten-hours.wav")
    assert path.stat().st_size > 10 * 3600 * R * 2
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stats = uform.AudioEncodeStats()
    started = time.perf_counter()
    got = embed(model, [path, path], stats=stats)
    assert time.perf_counter() - started < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200_000  # KiB: nowhere near 1.15 GB
    assert stats.audio_seconds <= 2 * 1.1 and stats.truncated_items == 2  # 1 s of 10 h each
    pcm = media.pcm16(head)[:, 0].astype(np.float32) / 32768
    np.testing.assert_array_equal(got, embed_samples(model, [pcm, pcm], R))


def test_ten_hour_mp3_costs_its_window(model: uform.Model, tower: audio.AudioTower, tmp_path: Path) -> None:
    path, two_seconds = media.ten_hour_mp3(tmp_path / "ten-hours.mp3")
    stats = uform.AudioEncodeStats()
    started = time.perf_counter()
    got = embed(model, [path], stats=stats)
    assert time.perf_counter() - started < 10
    assert stats.audio_seconds < 1.1 and stats.truncated_items == 1
    np.testing.assert_array_equal(decode_item(0, path, tower).samples, decode_item(0, two_seconds, tower).samples)
    np.testing.assert_allclose(got, embed(model, [two_seconds]), atol=1e-6)


def test_undecodable_packets_are_skipped_and_counted(model: uform.Model, clips: dict[str, Path], tmp_path: Path) -> None:
    data = bytearray(clips["mp3"].read_bytes())
    middle = len(data) // 5
    data[middle : middle + 400] = np.random.default_rng(2).bytes(400)
    stats = uform.AudioEncodeStats()
    got = embed(model, [bytes(data)], stats=stats)
    assert np.isfinite(got).all() and stats.skipped_packets >= 1


def test_a_run_of_undecodable_packets_is_refused_by_its_own_reason(clips: dict[str, Path], tower: audio.AudioTower, tmp_path: Path) -> None:
    garbled = media.garbled_mp3(clips["mp3"], tmp_path / "garbled.mp3")
    with pytest.raises(uform.InputError) as caught:
        decode_item(4, garbled, tower)
    assert caught.value.reason == f"is corrupt: {recordings.MAX_FAILED_PACKETS + 1} packets in a row fail to decode"
    assert str(caught.value) == f"item 4 ({garbled}): {caught.value.reason}"


# -- bad input ------------------------------------------------------------------------------


def bad_items(d: Path, clips: dict[str, Path]) -> dict[str, tuple[Any, str]]:
    """name → (item, what the error says)."""
    (d / "empty.wav").write_bytes(b"")
    (d / "noise.mp3").write_bytes(np.random.default_rng(3).bytes(6000))
    (d / "text.wav").write_text("not a recording " * 50)
    (d / "folder.flac").mkdir()
    os.mkfifo(d / "pipe.wav")  # opening it would block until a writer came
    from PIL import Image

    Image.new("RGB", (8, 8)).save(d / "image.png")
    header_says_2s = d / "short.wav"
    media.wav(header_says_2s, media.tone(0.5, R), R)
    data = bytearray(header_says_2s.read_bytes())
    data[40:44] = (2 * R * 2).to_bytes(4, "little")
    header_says_2s.write_bytes(bytes(data))
    pcm = media.pcm16(media.tone(0.2, 8000)).tobytes()
    odd_headers = {  # (rate, channels) a WAV header may claim
        (0, 1): "not a recording uform can decode",
        (8000, 0): "holds no decodable audio",
        (2**31 - 1, 1): "cannot be decoded past 0.000 s",
    }
    for rate, channels in odd_headers:
        (d / f"odd-{rate}-{channels}.wav").write_bytes(media.wav_header(rate, channels, len(pcm)) + pcm)
    return {
        **{f"wav of {r} Hz, {c} channels": (d / f"odd-{r}-{c}.wav", why) for (r, c), why in odd_headers.items()},
        "empty file": (d / "empty.wav", "is empty"),
        "empty bytes": (b"", "the bytes are empty"),
        "random bytes": (d / "noise.mp3", "not a recording uform can decode"),
        "text as wav": (d / "text.wav", "not a recording uform can decode"),
        "missing": (d / "missing.opus", "no such file"),
        "directory": (d / "folder.flac", "is a directory"),
        "fifo": (d / "pipe.wav", "is not a regular file"),
        "image": (d / "image.png", "holds no audio stream"),
        "video only": (media.video_only_webm(d / "video.webm"), "holds no audio stream"),
        "truncated wav header": (header_says_2s, "truncated"),
        **{f"truncated {n}": (media.cut(clips[n], 0.3), "truncated") for n in ("wav", "flac", "mp3", "opus-webm")},
        "truncated ogg": (media.cut(clips["opus-ogg"], 0.3), "truncated"),
        "unknown codec": (media.unknown_codec_webm(clips["opus-webm"], d / "unknown.webm"), "holds audio in a codec this FFmpeg cannot decode"),
        "not a file": (3.5, "expected a path, bytes or a binary file object, got float"),
    }


def test_bad_files_name_index_path_and_reason_and_write_nothing(model: uform.Model, clips: dict[str, Path], tmp_path: Path) -> None:
    arena = uform.Arena()
    good = model.audio_encode([clips["wav"]], arena)
    before = np.array(good.embeddings)
    for name, (item, reason) in bad_items(tmp_path, clips).items():
        with pytest.raises(uform.InputError) as caught:
            model.audio_encode([clips["wav"], clips["flac"], item], arena)
        err = caught.value
        assert err.index == 2 and reason in err.reason, (name, str(err))
        if isinstance(item, Path):
            assert err.path == str(item) and str(item) in str(err), name
        assert arena.generation == 1, name
    np.testing.assert_array_equal(good.embeddings, before)  # still readable: nothing was written


def test_a_cut_wav_is_refused_whatever_carries_it(model: uform.Model, clips: dict[str, Path]) -> None:
    """FFmpeg clamps a WAV's data size to the file, so only its header tells a cut one: the
    header is read for file objects too (a seekable one put back, a one-way one kept as it
    is read; both encoded the cut file, padded, while its path and bytes were refused)."""
    from media import OneWay

    cut = media.cut(clips["wav"], 0.3)
    data = cut.read_bytes()
    reason = "is truncated or corrupt: its container declares 2.00 s of audio, only 0.60 s decode"
    with open(cut, "rb") as f:
        for item, where in ((cut, str(cut)), (data, None), (f, str(cut)), (io.BytesIO(data), None), (OneWay(data), None)):
            with pytest.raises(uform.InputError) as caught:
                model.audio_encode([clips["wav"], item], uform.Arena())
            assert (caught.value.index, caught.value.path, caught.value.reason) == (1, where, reason)


def test_bad_samples(model: uform.Model) -> None:
    ok = np.zeros(100, np.float32)
    cases = [
        ([ok, np.zeros(100, np.float64)], "float32"),
        ([ok, np.zeros((2, 50), np.float32)], "1-D"),
        ([ok, np.zeros(0, np.float32)], "holds no samples"),
        ([ok, np.array([0.0, np.nan], np.float32)], "NaN or infinite"),
        ([ok, [0.0, 1.0]], "got list"),
    ]
    for rows, reason in cases:
        with pytest.raises(uform.InputError, match=reason) as caught:
            model.audio_encode_samples(rows, R, uform.Arena())
        assert caught.value.index == 1
    with pytest.raises(TypeError, match="wrap one buffer in a list"):
        model.audio_encode_samples(ok, R, uform.Arena())
    with pytest.raises(TypeError, match="samples must be a sequence, got a frozenset, whose order is its own"):
        model.audio_encode_samples(frozenset([ok.tobytes()]), R, uform.Arena())  # type: ignore[arg-type]
    for rate in (0, -5, 44100.0, True, 10**7):
        with pytest.raises(ValueError, match="sample_rate"):
            model.audio_encode_samples([ok], rate, uform.Arena())  # type: ignore[arg-type]
    with pytest.raises(uform.UnsupportedError, match="token head"):
        model.audio_encode_samples([ok], R, uform.Arena(), outputs=uform.Outputs.TOKENS)
    with pytest.raises(TypeError, match="AudioEncodeStats"):
        model.audio_encode_samples([ok], R, uform.Arena(), stats=uform.TextEncodeStats())  # type: ignore[arg-type]


# -- buffers and tapes ----------------------------------------------------------------------


def test_tape_list_and_batches_agree(model: uform.Model) -> None:
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal(n).astype(np.float32) * 0.2 for n in (22050, 4000, 44100, 1)]
    listed = embed_samples(model, rows, 22050)
    tape = uform.RowsTape.from_numpy(np.concatenate(rows), np.cumsum([0] + [len(r) for r in rows]))
    np.testing.assert_array_equal(embed_samples(model, tape, 22050), listed)
    alone = np.concatenate([embed_samples(model, [r], 22050) for r in rows])
    np.testing.assert_allclose(alone, listed, atol=1e-6)  # results do not depend on the batch
    stats = uform.AudioEncodeStats()
    embed_samples(model, rows * 10, 22050, stats=stats)  # 40 items: batches of 16
    assert (stats.items, stats.batches, stats.padded_items, stats.truncated_items) == (40, 3, 20, 10)  # 1 s exactly fills the window: neither
    assert stats.seconds_decode > 0 and stats.seconds_compute > 0
    # batches 2 and 3 were resampled on the prefetch thread while ONNX Runtime computed
    assert stats.seconds_decode > stats.seconds_preprocess


def test_any_buffer_and_empty_calls(model: uform.Model, clips: dict[str, Path]) -> None:
    import array

    x = np.random.default_rng(6).standard_normal((3, 2 * N)).astype(np.float32) * 0.1
    want = embed_samples(model, x, R)  # a 2-D array is a sequence of rows
    got = embed_samples(model, [array.array("f", x[0]), memoryview(x[1]), np.ascontiguousarray(x[2])], R)
    np.testing.assert_array_equal(got, want)
    strided = embed_samples(model, [x[0][::2]], R // 2)  # a strided view, at half the rate
    assert strided.shape == (1, 32) and np.isfinite(strided).all()
    assert embed(model, []).shape == (0, 32) and embed_samples(model, [], R).shape == (0, 32)
    with open(clips["wav"]) as text_mode, pytest.raises(uform.InputError, match="in text mode; open it with .rb."):
        model.audio_encode([text_mode], uform.Arena())


def test_import_uform_loads_no_av() -> None:
    import subprocess
    import sys

    code = "import sys, uform; uform.AudioEncodeStats; print(sorted(m for m in ('av', 'onnxruntime', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ})
    assert out.stdout.strip() == "[]"


def test_a_recordings_row_does_not_depend_on_the_recordings_beside_it(model: uform.Model) -> None:
    rng = np.random.default_rng(0)
    items = [(rng.standard_normal(n) * 0.2).astype(np.float32) for n in (16000, 30000, 8000, 50000, 12000)]
    alone = np.concatenate([embed_samples(model, [x], R) for x in items])
    np.testing.assert_array_equal(embed_samples(model, items, R), alone)  # ORT's Log moved a last bit with the batch: 6.0e-8
