"""The image plugin: preprocessing, every file format and pixel mode, parity with the PyTorch reference, bad input."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from media import OneWay, encode_image, pattern, png16, png_header_only, webp_claiming, with_orientation
from PIL import Image

import uform
from ckpt import make_checkpoint
from uform.model import runtime_of
from uform.plugins import image
from uform.plugins.media import frames
from uform.plugins.media import image as pictures
from uform.plugins.media import files as sources

S = 32  # tiny preset


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("image") / "tiny-image.safetensors", "tiny", 3, ["image"])


@pytest.fixture(scope="module")
def model(ckpt: Path) -> uform.Model:
    return uform.Model.load_ram(ckpt, quantization=uform.Scalar.F32)  # the graph against the reference, exactly


def embed(model: uform.Model, files: list[object]) -> np.ndarray:
    return np.array(model.image_encode(files, uform.Arena()).embeddings)


def embed_pixels(model: uform.Model, pixels: list[np.ndarray]) -> np.ndarray:
    return np.array(model.image_encode_pixels(pixels, uform.Arena()).embeddings)


# -- the tower -------------------------------------------------------------------------


def test_parity_with_reference(model: uform.Model, ckpt: Path) -> None:
    torch = pytest.importorskip("torch")

    from uform.exporters.reference import ReferenceModel

    rng = np.random.default_rng(0)
    pictures = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(32, 32), (50, 20), (7, 90), (300, 301)]]
    ours = embed_pixels(model, pictures)
    fitted = np.stack([frames.fit(Image.fromarray(p), S) for p in pictures])
    with torch.no_grad():
        ref = ReferenceModel.from_checkpoint(ckpt).towers["image"](torch.from_numpy(fitted)).numpy()
    assert ours.shape == (4, 32)
    np.testing.assert_allclose(ours, ref, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)


def test_batches_do_not_change_results(model: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    pictures = [rng.integers(0, 256, (40, 40 + i, 3), dtype=np.uint8) for i in range(7)]
    whole = embed_pixels(model, pictures)
    monkeypatch.setattr(image, "MAX_ROWS", 3)
    stats = uform.ImageEncodeStats()
    model.image_encode_pixels(pictures, uform.Arena(), stats=stats)
    np.testing.assert_allclose(embed_pixels(model, pictures), whole, atol=1e-6)
    assert stats.batches == 3 and stats.items == 7 and stats.pixels == sum(40 * (40 + i) for i in range(7))


def test_tokens_are_unsupported(model: uform.Model) -> None:
    with pytest.raises(uform.UnsupportedError, match="no token head"):
        model.image_encode_pixels([np.zeros((4, 4, 3), np.uint8)], uform.Arena(), outputs=uform.Outputs.TOKENS)


# -- preprocessing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("w", "h", "expected"),
    [(32, 32, (32, 32)), (64, 48, (43, 32)), (48, 64, (32, 43)), (33, 32, (33, 32)), (3, 1000, (32, 10667)), (1, 1, (32, 32)), (95, 64, (48, 32))],
)
def test_resized_size_rounds_half_up(w: int, h: int, expected: tuple[int, int]) -> None:
    assert frames.resized_size(w, h, 32) == expected


def test_fit_is_bicubic_resize_then_central_crop() -> None:
    picture = pattern(48, 100)
    got = frames.fit(Image.fromarray(picture), S)
    resized = np.asarray(Image.fromarray(picture).resize((67, 32), Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(got, resized[:, 17:49])
    assert frames.fit(Image.fromarray(pattern(S, S)), S).tobytes() == pattern(S, S).tobytes()


def test_files_and_pixels_are_preprocessed_byte_for_byte_alike(model: uform.Model) -> None:
    picture = pattern(90, 120)
    files = [encode_image(picture, "PNG"), encode_image(picture, "WEBP", lossless=True), encode_image(picture, "JPEG", quality=90)]
    decoded = [np.asarray(Image.open(io.BytesIO(f)).convert("RGB")) for f in files]
    np.testing.assert_array_equal(decoded[0], picture)
    assert (embed(model, files) == embed_pixels(model, decoded)).all()  # exactly equal


def test_paths_bytes_and_file_objects(model: uform.Model, tmp_path: Path) -> None:
    data = encode_image(pattern(60, 50), "PNG")
    misnamed = tmp_path / "really-a-png.jpg"  # content decides the format, never the name
    misnamed.write_bytes(data)
    with open(misnamed, "rb") as f:
        out = embed(model, [data, str(misnamed), misnamed, io.BytesIO(data), f])
    assert np.ptp(out, axis=0).max() == 0


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation(model: uform.Model, orientation: int) -> None:
    stored = pattern(40, 70, seed=orientation)
    upright = {
        1: stored, 2: stored[:, ::-1], 3: stored[::-1, ::-1], 4: stored[::-1], 5: stored.transpose(1, 0, 2),
        6: np.rot90(stored, -1), 7: stored[::-1, ::-1].transpose(1, 0, 2), 8: np.rot90(stored, 1),
    }[orientation]  # fmt: skip
    got, *_ = pictures.decode(sources.Source(0, None, data=with_orientation(stored, orientation)), S)
    np.testing.assert_array_equal(got, frames.fit(Image.fromarray(np.ascontiguousarray(upright)), S))


def _rgb(im: Image.Image) -> np.ndarray:
    return np.asarray(pictures.to_rgb(pictures.orient(im)))


def test_modes_convert_to_8_bit_rgb() -> None:
    gray = pattern(20, 30)[..., 0]
    np.testing.assert_array_equal(_rgb(Image.fromarray(gray)), np.repeat(gray[..., None], 3, 2))
    # 16-bit grayscale keeps the high byte; so does Pillow's own 16-bit RGB PNG reader
    wide = (np.arange(600, dtype=np.uint16).reshape(20, 30) * 109).astype(np.uint16)
    gray16 = Image.open(io.BytesIO(encode_image(Image.fromarray(wide), "PNG")))
    assert gray16.mode.startswith("I")
    np.testing.assert_array_equal(_rgb(gray16)[..., 1], (wide >> 8).astype(np.uint8))
    deep = (np.random.default_rng(3).integers(0, 65536, (20, 30, 4))).astype(np.uint16)
    np.testing.assert_array_equal(_rgb(Image.open(io.BytesIO(png16(deep[..., :3])))), (deep[..., :3] >> 8).astype(np.uint8))
    high = (deep >> 8).astype(np.int64)
    over_white = (high[..., :3] * high[..., 3:] + 255 * (255 - high[..., 3:]) + 127) // 255
    np.testing.assert_array_equal(_rgb(Image.open(io.BytesIO(png16(deep)))), over_white.astype(np.uint8))
    # alpha over white: c' = (c a + 255 (255 - a) + 127) // 255
    rgba = np.dstack([pattern(20, 30), np.arange(600).reshape(20, 30) % 256]).astype(np.uint8)
    a = rgba[..., 3:].astype(np.int64)
    expected = ((rgba[..., :3] * a + 255 * (255 - a) + 127) // 255).astype(np.uint8)
    np.testing.assert_array_equal(_rgb(Image.open(io.BytesIO(encode_image(rgba, "PNG")))), expected)
    np.testing.assert_array_equal(_rgb(Image.open(io.BytesIO(encode_image(rgba, "WEBP", lossless=True)))), expected)
    # palette with a transparent entry composites too
    pal = Image.fromarray(pattern(20, 30)).quantize(8)
    pal.info["transparency"] = 0
    opaque = np.asarray(pal.convert("RGB"))
    got = _rgb(Image.open(io.BytesIO(encode_image(pal, "PNG", transparency=0))))
    index = np.asarray(pal)
    np.testing.assert_array_equal(got[index == 0], 255)
    np.testing.assert_array_equal(got[index != 0], opaque[index != 0])
    # CMYK: round((255 - c)(255 - k) / 255)
    cmyk = np.random.default_rng(2).integers(0, 256, (20, 30, 4), dtype=np.uint8)
    ck = (255 - cmyk[..., :3].astype(np.int64)) * (255 - cmyk[..., 3:].astype(np.int64))
    np.testing.assert_array_equal(_rgb(Image.fromarray(cmyk, "CMYK")), np.round(ck / 255).astype(np.uint8))
    cmyk_jpeg = Image.open(io.BytesIO(encode_image(Image.fromarray(cmyk, "CMYK"), "JPEG")))
    assert cmyk_jpeg.mode == "CMYK" and _rgb(cmyk_jpeg).shape == (20, 30, 3)
    assert _rgb(Image.fromarray(gray > 100)).dtype == np.uint8  # 1-bit


def test_large_jpegs_decode_at_reduced_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode_image(pattern(600, 800), "JPEG", quality=95)
    reduced, _, pixels, was_reduced = pictures.decode(sources.Source(0, None, data=data), S)
    assert was_reduced and pixels == 75 * 100  # 1/8 scale keeps the shorter side >= 2 S (75 >= 64)
    monkeypatch.setattr(pictures, "JPEG_DRAFT_MARGIN", 0)
    full, _, pixels, was_reduced = pictures.decode(sources.Source(0, None, data=data), S)
    assert not was_reduced and pixels == 600 * 800
    assert np.abs(full.astype(int) - reduced).mean() < 2


# -- bad input -------------------------------------------------------------------------


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[object, str]]:
    jpeg = encode_image(pattern(200, 200), "JPEG")
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "dir.jpg").mkdir()
    return {
        "empty bytes": (b"", "the bytes are empty"),
        "empty file": (tmp_path / "empty.png", "the file is empty"),
        "missing": (tmp_path / "missing.jpg", "no such file"),
        "directory": (tmp_path / "dir.jpg", "is a directory"),
        "truncated jpeg": (jpeg[: len(jpeg) // 2], "truncated"),
        "truncated png": (encode_image(pattern(200, 200), "PNG")[:300], "cannot decode the image"),
        "random bytes": (np.random.default_rng(0).bytes(5000), "not a JPEG, PNG or WebP image"),
        "gif": (encode_image(pattern(8, 8), "GIF"), "a GIF"),
        "video": (b"\x00\x00\x00\x20ftypisom" + b"\x00" * 40, "an MP4/MOV file"),
        "bomb": (png_header_only(30000, 30000), "decompression bombs"),
        **{f"webp bomb {chunk}": (webp_claiming(16383, 16383, chunk), rf"^item 35: the image is 16383x16383 = 268402689 pixels, over the limit of {pictures.MAX_PIXELS} ") for chunk in ("VP8 ", "VP8L")},
        "webp bomb VP8X": (webp_claiming(1 << 24, 1 << 24, "VP8X"), rf"^item 35: the image is 16777216x16777216 = {1 << 48} pixels, over the limit"),
        "not a file": (12, "expected a path, bytes or a binary file object"),
    }


@pytest.mark.parametrize(
    "case",
    ["empty bytes", "empty file", "missing", "directory", "truncated jpeg", "truncated png", "random bytes", "gif", "video", "bomb",
     "webp bomb VP8 ", "webp bomb VP8L", "webp bomb VP8X", "not a file"],
)  # fmt: skip
def test_bad_files_name_item_path_and_reason_and_write_nothing(model: uform.Model, tmp_path: Path, case: str) -> None:
    bad, reason = _bad_inputs(tmp_path)[case]
    good = encode_image(pattern(40, 40), "PNG")
    arena = uform.Arena()
    before = model.image_encode([good], arena)
    kept, generation = np.array(before.embeddings), arena.generation
    with pytest.raises(uform.InputError, match=reason) as info:
        model.image_encode([good] * 35 + [bad], arena)  # the bad item sits in the second batch
    assert info.value.index == 35
    if isinstance(bad, Path):
        assert info.value.path == str(bad) and str(bad) in str(info.value)
    assert arena.generation == generation
    np.testing.assert_array_equal(before.embeddings, kept)


@pytest.mark.parametrize("size", [(1, 1), (37, 5), (16383, 2), (300, 200)])
def test_the_webp_size_read_from_its_header_is_pillows(size: tuple[int, int]) -> None:
    """The size uform checks against MAX_PIXELS before Pillow reads a WebP (VP8, VP8L, VP8X)."""
    seen = set()
    for mode in ("RGB", "RGBA"):
        for options in ({"lossless": True}, {"quality": 50}):
            data = encode_image(Image.new(mode, size, (1, 2, 3, 4)), "WEBP", **options)
            seen.add(data[12:16])
            assert pictures.webp_size(data[:32]) == Image.open(io.BytesIO(data)).size == size
    assert seen == {b"VP8 ", b"VP8L", b"VP8X"}


def test_one_way_and_text_streams(model: uform.Model, tmp_path: Path) -> None:
    data = encode_image(pattern(30, 30), "PNG")
    np.testing.assert_array_equal(embed(model, [OneWay(data)]), embed(model, [data]))
    path = tmp_path / "x.png"
    path.write_bytes(data)
    with open(path, encoding="latin-1") as text, pytest.raises(uform.InputError, match="text mode"):
        model.image_encode([text], uform.Arena())
    with open(path, encoding="latin-1") as text, pytest.raises(uform.InputError, match="text mode") as info:
        model.image_encode([data, text], uform.Arena())
    assert info.value.index == 1 and info.value.path == str(path)


def test_bad_pixels(model: uform.Model) -> None:
    for bad in [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 3), np.float32), np.zeros((0, 4, 3), np.uint8), np.zeros((4, 4, 4), np.uint8)]:
        with pytest.raises(uform.InputError, match=r"item 1: expected uint8 \[height, width, 3\]"):
            model.image_encode_pixels([np.zeros((4, 4, 3), np.uint8), bad], uform.Arena())
    with pytest.raises(TypeError, match="wrap it in a list"):
        model.image_encode_pixels(np.zeros((4, 4, 3), np.uint8), uform.Arena())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wrap it in a list"):
        model.image_encode("picture.jpg", uform.Arena())  # type: ignore[arg-type]
    for name, call in (("files", model.image_encode), ("pixels", model.image_encode_pixels)):
        with pytest.raises(TypeError, match=rf"{name} must be a sequence, got a dict: pass list\(d.values\(\)\)"):
            call({"a.jpg": np.zeros((4, 4, 3), np.uint8)}, uform.Arena())  # type: ignore[operator]


def test_stats(model: uform.Model, tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    path.write_bytes(encode_image(pattern(30, 40), "PNG"))
    stats = uform.ImageEncodeStats()
    model.image_encode([path, encode_image(pattern(600, 800), "JPEG")], uform.Arena(), stats=stats)
    assert (stats.items, stats.batches, stats.reduced) == (2, 1, 1)
    assert stats.pixels == 30 * 40 + 75 * 100
    assert stats.bytes_read == path.stat().st_size + len(encode_image(pattern(600, 800), "JPEG"))
    assert stats.seconds_decode > 0 and stats.seconds_total >= stats.seconds_compute > 0
    with pytest.raises(TypeError, match="ImageEncodeStats"):
        model.image_encode([path], uform.Arena(), stats=uform.TextEncodeStats())  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_corrupted_files_raise_input_errors_only(model: uform.Model, fmt: str) -> None:
    """Flipped bytes and cuts anywhere: each item either decodes or raises InputError naming it."""
    data = encode_image(pattern(64, 80), fmt)
    rng = np.random.default_rng(7)
    mutants = []
    for _ in range(40):
        b = bytearray(data)
        for at in rng.integers(0, len(b), rng.integers(1, 8)):
            b[at] = int(rng.integers(0, 256))
        mutants.append(bytes(b[: int(rng.integers(len(b) // 3, len(b) + 1))]))
    for i, m in enumerate(mutants):
        try:
            out = model.image_encode([m], uform.Arena())
            assert np.isfinite(out.embeddings).all()
        except uform.InputError as exc:
            assert exc.index == 0 and exc.reason, i


def test_jpeg_orientation_and_empty_calls(model: uform.Model) -> None:
    data = with_orientation(pattern(40, 70), 6, "JPEG")
    upright = Image.open(io.BytesIO(data)).convert("RGB").transpose(Image.Transpose.ROTATE_270)
    got, *_ = pictures.decode(sources.Source(0, None, data=data), S)
    np.testing.assert_array_equal(got, frames.fit(upright, S))
    assert model.image_encode([], uform.Arena()).embeddings.shape == (0, 32)
    assert model.image_encode_pixels([], uform.Arena()).embeddings.shape == (0, 32)


def test_decoding_overlaps_the_tower(model: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch k + 1 decodes in worker threads while the session computes batch k."""
    import threading
    import time

    events: list[tuple[str, float, float, str]] = []
    real_decode, runners = image.decode, runtime_of(model).placement.runners
    real_runner = runners["image"]

    def slow_decode(source: sources.Source, size: int) -> tuple[np.ndarray, int, int, bool]:
        t0 = time.perf_counter()
        time.sleep(0.01)
        out = real_decode(source, size)
        events.append(("decode", t0, time.perf_counter(), threading.current_thread().name))
        return out

    class SlowRunner:
        def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            t0 = time.perf_counter()
            time.sleep(0.15)
            out = real_runner.run(names, feeds)
            events.append(("compute", t0, time.perf_counter(), threading.current_thread().name))
            return out  # type: ignore[no-any-return]

    monkeypatch.setattr(image, "decode", slow_decode)
    monkeypatch.setattr(image, "MAX_ROWS", 4)
    monkeypatch.setitem(runners, "image", SlowRunner())
    stats = uform.ImageEncodeStats()
    model.image_encode([encode_image(pattern(20, 20, seed=i), "PNG") for i in range(12)], uform.Arena(), stats=stats)
    computes = [e for e in events if e[0] == "compute"]
    decodes = [e for e in events if e[0] == "decode"]
    assert len(computes) == 3 and len(decodes) == 12
    first_compute = computes[0]
    overlapped = [d for d in decodes if d[1] < first_compute[2] and d[2] > first_compute[1]]
    assert len(overlapped) >= 4  # the whole second batch decoded during the first compute
    assert all(d[3] != threading.main_thread().name for d in overlapped)
    assert stats.seconds_preprocess < 0.8 * stats.seconds_decode  # only the first batch is exposed


def test_unreadable_file(model: uform.Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gone.png"
    path.write_bytes(encode_image(pattern(8, 8), "PNG"))

    def refuse(self: sources.Source) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(sources.Source, "open", refuse)
    with pytest.raises(uform.InputError, match=r"item 0 \(.*gone.png\): cannot read the file \(Permission denied\)"):
        model.image_encode([path], uform.Arena())
