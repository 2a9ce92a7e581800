"""SigLIP 2 NaFlex (transformers' ``Siglip2Model``, random weights at the base model's pixel
geometry: patch 16, a 16 x 16 position grid, at most 256 patches) converted and run against
transformers' ``get_image_features`` on six pictures (square, 2:1, 1:3, tiny, huge, strip), at
F32, BF16 and E4M3; mixed batches against each picture alone; files, export, video, an index.
docs/models-naflex.md."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
torch = pytest.importorskip("torch")

import uform  # noqa: E402
from uform import Arena, Scalar  # noqa: E402
from uform.convert import convert  # noqa: E402
from uform.plugins.media import naflex  # noqa: E402

from convert_folders import copy, edit_config, header, refused  # noqa: E402
from naflex_models import SIZES, make_siglip2, picture, reference  # noqa: E402

PICTURES = [picture(w, h, i) for i, (w, h) in enumerate(SIZES.values())]
GRIDS = [(16, 16), (11, 22), (27, 9), (12, 20), (14, 18), (2, 100)]  # rows x columns, transformers' spatial_shapes
BOUNDS = {Scalar.F32: 0.99999, Scalar.BF16: 0.9995, Scalar.E4M3: 0.99}  # the converted models' parity bounds


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_siglip2(tmp_path_factory.mktemp("siglip2") / "tiny-siglip2")


@pytest.fixture(scope="module")
def model(source: Path) -> Any:
    from transformers import Siglip2Model

    return Siglip2Model.from_pretrained(source).eval()


@pytest.fixture(scope="module")
def converted(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out") / "naflex.safetensors"
    convert(source, out, dtype="f32")
    return out


@pytest.fixture(scope="module")
def want(model: Any) -> np.ndarray:
    return reference(model, PICTURES)


def test_the_converted_tower_is_naflex_with_the_patch_weight_in_uforms_order(converted: Path, model: Any) -> None:
    cfg, entries, _ = header(converted)
    image = cfg["towers"]["image"]
    assert cfg["source"]["family"] == "siglip2" and cfg["source"]["architecture"] == "Siglip2Model"
    assert {k: image[k] for k in ("resize", "max_patches", "image_size", "patch_size", "interpolation", "mean", "std", "class_token", "pooling")} == {
        "resize": "naflex", "max_patches": 256, "image_size": 256, "patch_size": 16, "interpolation": "bilinear",
        "mean": [0.5] * 3, "std": [0.5] * 3, "class_token": False, "pooling": "attention",
    }  # fmt: skip
    assert entries["image.patch.weight"]["shape"] == [64, 768] and entries["image.pos.weight"]["shape"] == [256, 64]
    from safetensors.numpy import load_file

    linear = model.vision_model.embeddings.patch_embedding.weight.detach().numpy()  # [W, (row, column, channel)]
    stored = load_file(converted)["image.patch.weight"]  # [W, (channel, row, column)]
    assert np.array_equal(stored.reshape(64, 3, 16, 16).transpose(0, 2, 3, 1).reshape(64, -1), linear)


def test_what_uform_cannot_run_is_refused_by_name(source: Path, tmp_path: Path) -> None:
    d = copy(source, tmp_path)
    edit_config(d, lambda c: c["vision_config"].update(num_patches=250))
    refused(d, tmp_path, r"vision_config: num_patches 250 is not a square \(the position table is a G0 x G0 grid\)")
    edit_config(d, lambda c: c["vision_config"].update(num_patches=256))
    processor = json.loads((d / "preprocessor_config.json").read_text())
    (d / "preprocessor_config.json").write_text(json.dumps(processor | {"patch_size": 14}))
    refused(d, tmp_path, r"preprocessor_config.json: patch_size 14 differs from config.json's vision_config.patch_size 16")
    (d / "preprocessor_config.json").write_text(json.dumps(processor | {"resample": 0}))
    refused(d, tmp_path, r"preprocessor_config.json: resample 0 is not supported; supported: 2 \(bilinear\), 3 \(bicubic\)")


def test_the_grid_is_transformers_and_the_positions_are_its_resize(model: Any) -> None:
    from transformers.models.siglip2.image_processing_siglip2 import get_image_size_for_max_num_patches

    rng = np.random.default_rng(3)
    for h, w in list(rng.integers(1, 5000, (300, 2))) + [(1, 1), (3, 5), (40, 2000), (20000, 1)]:
        for p, n in ((16, 256), (14, 729), (16, 1024)):
            th, tw = get_image_size_for_max_num_patches(int(h), int(w), p, n)
            assert naflex.grid_for(int(h), int(w), p, n) == (th // p, tw // p), (h, w, p, n)
    table = model.vision_model.embeddings.position_embedding.weight.detach()
    for gh, gw in GRIDS:
        theirs = model.vision_model.embeddings.resize_positional_embeddings(table.reshape(16, 16, -1), torch.tensor([[gh, gw]]), gh * gw)[0]
        assert np.abs(naflex.positions(gh, gw, 16) @ table.numpy() - theirs.numpy()).max() < 1e-6, (gh, gw)


@pytest.mark.parametrize("quantization", [Scalar.F32, Scalar.BF16, Scalar.E4M3], ids=str)
def test_six_pictures_against_transformers(converted: Path, want: np.ndarray, quantization: Scalar) -> None:
    m = uform.Model.load_ram(converted, quantization=quantization)
    got = np.asarray(m.image_encode_pixels(PICTURES, Arena()).embeddings, np.float64)
    cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() > BOUNDS[quantization], dict(zip(SIZES, cos.round(7)))
    alone = np.stack([np.asarray(m.image_encode_pixels([p], Arena()).embeddings)[0] for p in PICTURES])
    assert np.abs(alone - got).max() <= 1e-6  # a batch of six grids equals each picture alone


def test_files_equal_their_pixels_and_a_batch_keeps_its_order(converted: Path) -> None:
    from PIL import Image

    m = uform.Model.load_ram(converted, quantization=Scalar.F32)
    pictures = PICTURES[:4] + [PICTURES[0]]  # a grid twice, apart

    def png(p: np.ndarray, mode: str = "RGB") -> bytes:
        out = io.BytesIO()
        Image.fromarray(p).convert(mode).save(out, "PNG")
        return out.getvalue()

    rows = np.asarray(m.image_encode([png(p) for p in pictures], Arena()).embeddings)
    assert np.array_equal(rows, np.asarray(m.image_encode_pixels(pictures, Arena()).embeddings))
    assert np.array_equal(rows[0], rows[4])
    grey = np.asarray(Image.fromarray(PICTURES[1]).convert("L").convert("RGB"))  # converted whole, then fitted
    assert np.array_equal(
        np.asarray(m.image_encode([png(PICTURES[1], "L")], Arena()).embeddings), np.asarray(m.image_encode_pixels([grey], Arena()).embeddings)
    )


def _clip(width: int, height: int, seed: int) -> bytes:
    """An 8-frame MP4 (H.264) whose frames differ, one frame a time unit: the 8 samples are its 8 frames."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(8):
            frame = av.VideoFrame.from_ndarray(picture(width, height, seed + i), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return out.getvalue()


def _decoded(data: bytes) -> list[np.ndarray]:
    """Every frame of ``data`` as uform converts it to RGB (``frames.frame_rgb``), in order."""
    import av

    from uform.plugins.media import frames

    with av.open(io.BytesIO(data)) as container:
        return [frames.frame_rgb(f) for f in container.decode(video=0)]


def test_a_clip_is_the_renormalised_mean_of_its_frames_at_its_own_grid(converted: Path) -> None:
    from uform.plugins.media.files import sources
    from uform.plugins.media.frames import Pixels
    from uform.plugins.media.video import sample

    m = uform.Model.load_ram(converted, quantization=Scalar.F32)
    wide, tall = _clip(128, 64, 10), _clip(48, 96, 20)  # 2:1 at 11x22, 1:2 at 22x11 (two grids, one call)
    got = np.asarray(m.video_encode([wide, tall, wide], Arena()).embeddings, np.float64)
    fit = Pixels.read(header(converted)[0]["towers"]["image"], "image").fit
    for row, data, grid in ((got[0], wide, (11, 22)), (got[1], tall, (22, 11))):
        decoded = _decoded(data)
        assert len(decoded) == 8
        sampled, _ = sample(sources([data], "bytes")[0], 8, fit)
        assert sampled.shape == (8, grid[0] * 16, grid[1] * 16, 3)
        frames_rows = np.asarray(m.image_encode_pixels(decoded, Arena()).embeddings, np.float64)
        mean = frames_rows.mean(axis=0)
        assert np.abs(row - mean / np.linalg.norm(mean)).max() <= 1e-6
    assert np.array_equal(got[0], got[2])
    alone = np.asarray(m.video_encode([tall], Arena()).embeddings, np.float64)[0]
    assert np.abs(alone - got[1]).max() <= 1e-6


def test_a_frame_of_another_size_takes_the_clips_first_grid(converted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream whose frame size changes: each frame is resized to the first sampled frame's
    grid, once (it was first resized to its own grid, then that thrown away)."""
    import av
    from PIL import Image

    from uform.plugins.media.files import sources
    from uform.plugins.media.frames import Pixels
    from uform.plugins.media.video import frame_pixels

    fit = Pixels.read(header(converted)[0]["towers"]["image"], "image").fit
    source = sources([b"x"], "bytes")[0]
    frame = av.VideoFrame.from_ndarray(picture(96, 96, 4), format="rgb24")  # its own grid: 16x16
    assert frame_pixels(frame, fit, source).shape == (256, 256, 3)
    resizes: list[tuple[int, int]] = []
    resize_to = naflex.resize_to
    monkeypatch.setattr(naflex, "resize_to", lambda image, h, w, bicubic=False: resizes.append((h, w)) or resize_to(image, h, w, bicubic))
    fitted = frame_pixels(frame, fit, source, (176, 352, 3))  # the clip's first frame was 2:1 (11x22)
    assert resizes == [(176, 352)]
    rgb = Image.fromarray(frame.to_ndarray(format="rgb24"))
    assert np.array_equal(fitted, np.asarray(rgb.resize((352, 176), Image.Resampling.BILINEAR)))


def _switching(sizes: list[tuple[int, int]], kind: str = "webm") -> bytes:
    """A VP8 WebM (or an H.264 MP4, its new sizes' parameter sets in band) of one video stream
    whose frame size changes: 4 frames of each ``(width, height)`` in turn, each size from its
    own encoder (a keyframe at each switch, as WebRTC recordings hold), 8 frames a second."""
    from fractions import Fraction

    import av

    out, rate, codec = io.BytesIO(), Fraction(1, 8), {"webm": "libvpx", "mp4": "libx264"}[kind]
    with av.open(out, "w", format=kind) as container:
        stream = container.add_stream(codec, rate=8)
        stream.width, stream.height, stream.pix_fmt = sizes[0][0], sizes[0][1], "yuv420p"
        for k, (w, h) in enumerate(sizes):
            encoder = av.CodecContext.create(codec, "w")
            encoder.width, encoder.height, encoder.pix_fmt, encoder.time_base, encoder.framerate = w, h, "yuv420p", rate, 8
            for i in range(5):
                frame = av.VideoFrame.from_ndarray(picture(w, h, 10 * k + i), format="rgb24").reformat(format="yuv420p") if i < 4 else None
                if frame is not None:
                    frame.pts, frame.time_base = 4 * k + i, rate
                for packet in encoder.encode(frame):
                    packet.stream, packet.time_base = stream, rate
                    container.mux(packet)
    return out.getvalue()


@pytest.mark.parametrize("kind", ["webm", "mp4"])
def test_a_real_clip_whose_frame_size_changes(converted: Path, kind: str) -> None:
    """A WebM (an MP4) that switches from 64x32 to 32x64 after 4 frames. NaFlex: every frame at the first
    sampled frame's grid (11x22; the 1:2 frames resized to 352x176, squashed), so the clip is the
    renormalised mean of image_encode_pixels of those 8 pictures, and not that of each frame at
    its own grid (the 1:2 ones would be 22x11). A fixed-size tower fits each frame as it comes,
    each by its own size: sample() gives frames.fit of every decoded frame."""
    from PIL import Image

    from uform.plugins.media import frames
    from uform.plugins.media.files import sources
    from uform.plugins.media.video import sample

    data = _switching([(64, 32), (32, 64)], kind)
    decoded = _decoded(data)
    assert [f.shape[:2] for f in decoded] == [(32, 64)] * 4 + [(64, 32)] * 4
    first = [f if f.shape[:2] == (32, 64) else np.asarray(Image.fromarray(f).resize((352, 176), Image.Resampling.BILINEAR)) for f in decoded]

    def mean(pixels: list[np.ndarray]) -> np.ndarray:
        rows = np.asarray(m.image_encode_pixels(pixels, Arena()).embeddings, np.float64).mean(0)
        out: np.ndarray = rows / np.linalg.norm(rows)
        return out

    with uform.Model.load_ram(converted, quantization=Scalar.F32) as m:
        got = np.asarray(m.video_encode([data], Arena()).embeddings, np.float64)[0]
        np.testing.assert_allclose(got, mean(first), atol=1e-6, rtol=0)
        assert float(got @ mean(decoded)) < 0.9999  # each frame at its own grid: another embedding
    for size in (224, frames.Fit(224, "square", "bilinear")):
        clip = sample(sources([data], "bytes")[0], 8, size)[0]
        assert np.array_equal(clip, np.stack([frames.fit(frames.from_array(f), size) for f in decoded]))


def test_a_clips_row_does_not_depend_on_the_clips_beside_it(converted: Path) -> None:
    """Three clips of three grids in one call, in two orders, equal each clip alone bit for bit
    (the frames' mean was ONNX Runtime's ReduceMean, which sums otherwise for a batch of
    several clips than for one: rows 1.5e-8 to 3e-8 apart)."""
    clips = [_clip(64, 32, 0), _clip(32, 64, 10), _clip(48, 48, 20)]
    with uform.Model.load_ram(converted, quantization=Scalar.F32) as m:
        alone = np.concatenate([np.asarray(m.video_encode([c], Arena()).embeddings) for c in clips])
        for order in ([0, 1, 2], [2, 0, 1]):
            together = np.asarray(m.video_encode([clips[i] for i in order], Arena()).embeddings)
            np.testing.assert_array_equal(together, alone[order])


def test_a_video_tower_of_its_own_is_not_naflex(converted: Path, tmp_path: Path) -> None:
    from uform.core import safetensors
    from uform.core.errors import CheckpointError

    c = safetensors.parse(memoryview(converted.read_bytes()))
    config = json.loads(c.metadata["uform"])
    config["towers"]["video"] = config["towers"]["image"] | {"frames": 8, "pooling": "class", "class_token": True}
    out = tmp_path / "own-video.safetensors"
    safetensors.write(out, {n: np.array(c.array(n)) for n in c.entries}, dict(c.metadata) | {"uform": json.dumps(config)})
    with pytest.raises(CheckpointError, match=r"towers.video.resize: 'naflex' is for a video tower made of the image tower \('from': 'image'\) only"):
        uform.Model.load_ram(out, quantization=Scalar.F32)


def test_the_exported_tower_takes_patches_and_positions(converted: Path, tmp_path: Path) -> None:
    import onnxruntime as ort
    from PIL import Image

    from uform.cli import main

    assert main(["export", str(converted), str(tmp_path / "x"), "-q"]) == 0
    session = ort.InferenceSession(str(tmp_path / "x" / "image.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["patches", "positions"]
    described = json.loads((tmp_path / "x" / "image.json").read_text())
    assert "get_image_size_for_max_num_patches" in json.dumps(described)
    video = json.loads((tmp_path / "x" / "video.json").read_text())["preprocessing"]
    assert "all at the grid the first sampled frame's size gives" in video, video  # not each frame at its own grid
    m = uform.Model.load_ram(converted, quantization=Scalar.F32)
    for p in PICTURES[3:]:
        fitted = np.asarray(naflex.fit_image(Image.fromarray(p), 16, 256))
        gh, gw = naflex.grid_of(fitted, 16)
        (row,) = session.run(None, {"patches": naflex.patches(fitted, 16)[None], "positions": naflex.positions(gh, gw, 16)})[0]
        assert np.abs(row - np.asarray(m.image_encode_pixels([p], Arena()).embeddings)[0]).max() < 1e-5


def test_an_index_of_naflex_pictures(converted: Path, tmp_path: Path) -> None:
    from PIL import Image

    from uform.cli import main
    from uform.index import Index

    for name, p in zip(SIZES, PICTURES):
        Image.fromarray(p).save(tmp_path / f"{name.replace(':', 'x')}.png")
    assert main(["index", str(tmp_path), "--into", str(tmp_path / "idx"), "-m", str(converted), "--quantization", "f32", "-q"]) == 0
    with Index(tmp_path / "idx", checkpoint=converted, read_only=True) as ix:
        assert ix.counts()["image"] == 6
        for name in ("1x3", "strip"):
            best = ix.search_file(tmp_path / f"{name}.png", k=1)[0]
            assert Path(best.path).name == f"{name}.png" and best.score == pytest.approx(1.0, abs=1e-5)


if __name__ == "__main__":  # docs/models.md's parity table: python tests/test_naflex.py
    import tempfile

    from transformers import Siglip2Model

    with tempfile.TemporaryDirectory() as tmp:
        made = make_siglip2(Path(tmp) / "tiny-siglip2")
        path = Path(tmp) / "naflex.safetensors"
        convert(made, path, dtype="f32")
        reference_rows = reference(Siglip2Model.from_pretrained(made).eval(), PICTURES)
        table = {}
        for q in BOUNDS:
            rows = np.asarray(uform.Model.load_ram(path, quantization=q).image_encode_pixels(PICTURES, Arena()).embeddings, np.float64)
            table[q] = np.sum(rows * reference_rows, axis=1) / np.linalg.norm(rows, axis=1)
        print("| picture | grid | F32 | BF16 | E4M3 |\n|---|---|---|---|---|")
        for i, (name, (w, h)) in enumerate(SIZES.items()):
            print(f"| {name} {w}x{h} | {GRIDS[i][0]}x{GRIDS[i][1]} | " + " | ".join(f"{table[q][i]:.7f}" for q in BOUNDS) + " |")


def test_a_transparent_picture_equals_transformers_converting_it_to_rgb(converted: Path, model: Any) -> None:
    """transformers' processors refuse RGBA unless ``do_convert_rgb``, whose ``convert_to_rgb``
    composites over white, as uform does (docs/models-naflex.md)."""
    from PIL import Image
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    rgba = np.dstack([PICTURES[1], np.tile(np.linspace(0, 255, PICTURES[1].shape[1]).astype(np.uint8), (PICTURES[1].shape[0], 1))])
    out = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(out, "PNG")
    proc = Siglip2ImageProcessorPil(max_num_patches=256, patch_size=model.config.vision_config.patch_size, do_convert_rgb=True)
    with torch.no_grad():
        ref = model.get_image_features(**proc(images=[Image.fromarray(rgba, "RGBA")], return_tensors="pt"))
    want = getattr(ref, "pooler_output", ref)[0].numpy().astype(np.float64)
    got = np.asarray(uform.Model.load_ram(converted, quantization=Scalar.F32).image_encode([out.getvalue()], Arena()).embeddings, np.float64)[0]
    assert float(got @ want / np.linalg.norm(want)) > BOUNDS[Scalar.F32]


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "I;16"])
def test_a_picture_converted_for_its_grid_is_converted_a_strip_at_a_time(mode: str) -> None:
    """A NaFlex picture is converted to RGB and fitted to its grid a strip of rows at a time:
    bit for bit the whole conversion, and never the conversion's wider intermediates over the
    whole picture (a 6000 x 4000 RGBA PNG took 722 MB of peak RSS converted whole, 283 MB
    converted into one RGB copy, 94 MB streamed)."""
    import tracemalloc

    from PIL import Image

    from uform.plugins.media import frames
    from uform.plugins.media import image as pictures
    from uform.plugins.media.files import sources
    from uform.plugins.media.upright import to_rgb

    rng = np.random.default_rng(3)
    width, height = 1200, 900
    if mode == "I;16":
        picture_ = Image.fromarray(rng.integers(0, 65536, (height, width), dtype=np.uint16))
    elif mode == "P":  # a palette with a transparent entry
        picture_ = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert("P", palette=Image.Palette.ADAPTIVE)
        picture_.info["transparency"] = 0
    else:
        picture_ = Image.fromarray(rng.integers(0, 256, (height, width, len(mode)), dtype=np.uint8).squeeze(), mode)
    buffer = io.BytesIO()
    picture_.save(buffer, "PNG", **({"transparency": 0} if mode == "P" else {}))
    fit = frames.Fit(256, "naflex", "bilinear", patch=16, max_patches=256)
    with Image.open(io.BytesIO(buffer.getvalue())) as whole:
        want = frames.fit(to_rgb(whole), fit)
    tracemalloc.start()
    got = pictures.decode(sources([buffer.getvalue()], "pictures")[0], fit)[0]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(got, want)
    assert peak < 4 * width * height, f"{peak / (width * height):.1f} bytes a pixel traced"
