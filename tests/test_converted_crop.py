"""The centre crop's offset in a converted open_clip file (``towers.image.crop_rounding:
half_even``): torchvision's ``CenterCrop``, which open_clip's eval transform runs, starts the crop
at ``int(round((T − S) / 2))`` (Python's rounding, half to even), uform at ``(T − S) // 2``; they
differ by a column or row where ``T − S`` is 3 modulo 4. Before the field a converted open_clip
gave cosine 0.9983 to 0.9990 to ``encode_image`` on such pictures (32 px tall, 47, 51 and 55 wide),
opaque RGB ones (``python tests/test_converted_crop.py`` prints both)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import hf_models
import uform
from uform import Arena, Scalar
from uform.convert import convert
from uform.core import safetensors
from uform.core.errors import CheckpointError
from uform.plugins.media import frames, png
from uform.plugins.media.files import Source
from uform.plugins.media.image import decode

Image = pytest.importorskip("PIL.Image")
open_clip = pytest.importorskip("open_clip")
torch = pytest.importorskip("torch")
WIDTHS = (47, 48, 49, 51, 55)  # 32 px tall: T − S = 15, 16, 17, 19, 23


def _picture(folder: Path, width: int, height: int, kind: str) -> Path:
    rng = np.random.default_rng(width * 7 + height)
    base = rng.integers(0, 256, (max(2, height // 4), max(2, width // 4), 3), dtype=np.uint8)
    path = folder / f"{width}x{height}.{kind}"
    Image.fromarray(base).resize((width, height), Image.Resampling.BICUBIC).save(path, quality=95)
    return path


def _open_clips_pixels(path: Path, size: int) -> np.ndarray:
    from open_clip.transform import image_transform

    picture = Image.open(path)
    for step in image_transform(size, is_train=False).transforms[:-2]:
        picture = step(picture)
    return np.asarray(picture)


@pytest.mark.parametrize("kind, streamed", [("png", True), ("png", False), ("jpg", False)], ids=["streamed PNG", "PNG decoded whole", "JPEG"])
def test_the_crop_starts_where_torchvision_starts_it(tmp_path: Path, kind: str, streamed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decode path (the streaming PNG reader's row fit, Pillow's decode fitted a strip at a
    time, ``frames.fit``) crops as torchvision does, in both directions."""
    if not streamed:
        monkeypatch.setattr(png, "native", lambda: None)
    size = frames.Fit(32, rounding="floor", crop="half_even")
    shapes = [(w, 32) for w in WIDTHS] + [(32, h) for h in WIDTHS]
    wrong = [f"{w}x{h}" for w, h in shapes if not np.array_equal(decode(Source(0, str(p := _picture(tmp_path, w, h, kind))), size)[0], _open_clips_pixels(p, 32))]
    assert wrong == []
    assert frames.crop_offset(15, "half_even") == 8 and frames.crop_offset(15) == 7 and frames.crop_offset(17, "half_even") == 8


def test_a_converted_open_clip_encodes_such_pictures_as_open_clip(tmp_path: Path) -> None:
    directory, model = hf_models.make_open_clip(tmp_path / "oc")
    convert(directory, tmp_path / "oc.safetensors", dtype="f32")
    paths = [_picture(tmp_path, w, 32, "png") for w in WIDTHS]
    from open_clip.transform import image_transform

    transform = image_transform(32, is_train=False)
    with torch.no_grad():
        want = np.stack([model.encode_image(transform(Image.open(p))[None])[0].numpy() for p in paths])
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    with uform.Model.load_ram(tmp_path / "oc.safetensors", quantization=Scalar.F32) as m:
        got = np.asarray(m.image_encode([str(p) for p in paths], Arena()).embeddings)
    cos = dict(zip(WIDTHS, map(float, (got * want).sum(1))))
    assert {w: c for w, c in cos.items() if c < 0.99999} == {}
    config = json.loads(safetensors.parse(memoryview((tmp_path / "oc.safetensors").read_bytes())).metadata["uform"])
    assert config["towers"]["image"]["crop_rounding"] == "half_even"
    config["towers"]["image"]["crop_rounding"] = "ceil"
    c = safetensors.parse(memoryview((tmp_path / "oc.safetensors").read_bytes()))
    safetensors.write(tmp_path / "bad.safetensors", {n: np.array(c.array(n)) for n in c.entries}, dict(c.metadata) | {"uform": json.dumps(config)})
    with pytest.raises(CheckpointError, match=r"config field towers.image.crop_rounding: expected one of 'floor', 'half_even', got 'ceil'"):
        uform.Model.load_ram(tmp_path / "bad.safetensors")


def main() -> None:
    """The figures docs/models.md gives: cosines to ``encode_image`` with ``crop_rounding`` floor and half_even."""
    from open_clip.transform import image_transform

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        directory, model = hf_models.make_open_clip(tmp / "oc")
        convert(directory, tmp / "half_even.safetensors", dtype="f32")
        c = safetensors.parse(memoryview((tmp / "half_even.safetensors").read_bytes()))
        config = json.loads(c.metadata["uform"])
        config["towers"]["image"]["crop_rounding"] = "floor"
        safetensors.write(tmp / "floor.safetensors", {n: np.array(c.array(n)) for n in c.entries}, dict(c.metadata) | {"uform": json.dumps(config)})
        paths = [_picture(tmp, w, 32, "png") for w in WIDTHS]
        transform = image_transform(32, is_train=False)
        with torch.no_grad():
            want = np.stack([model.encode_image(transform(Image.open(p))[None])[0].numpy() for p in paths])
        want /= np.linalg.norm(want, axis=1, keepdims=True)
        for rule in ("floor", "half_even"):
            with uform.Model.load_ram(tmp / f"{rule}.safetensors", quantization=Scalar.F32) as m:
                got = np.asarray(m.image_encode([str(p) for p in paths], Arena()).embeddings)
            cosines = ", ".join(f"{w}x32 {c:.7f}" for w, c in zip(WIDTHS, (got * want).sum(1)))
            print(f"crop_rounding {rule}: {cosines}; max abs {np.abs(got - want).max():.2g}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
