"""Pictures of extreme aspect ratio: the work is bounded by the output, the rule stays the documented one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from media import encode_image, pattern
from PIL import Image

import uform
from ckpt import make_checkpoint
from uform.plugins.media import frames
from uform.plugins.media import image as pictures
from uform.plugins.media import files as sources

S = 32  # tiny preset


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> uform.Model:
    return uform.Model.load_ram(make_checkpoint(tmp_path_factory.mktemp("shapes") / "tiny-image.safetensors", "tiny", 3, ["image"]))


def strip(height: int, width: int) -> np.ndarray:
    """A smooth ``[height, width, 3]`` picture whose every row differs from its neighbours."""
    y = np.arange(height, dtype=np.float64)[:, None, None]
    x = np.arange(width, dtype=np.float64)[None, :, None]
    rgb = 128 + 100 * np.sin(y / 3.0 + x / 2.0 + np.array([0.0, 1.0, 2.0]))
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def documented(picture: np.ndarray, size: int) -> np.ndarray:
    """docs/checkpoint.md literally: bicubic resize to shorter side ``size``, central crop."""
    h, w = picture.shape[:2]
    tw, th = frames.resized_size(w, h, size)
    resized = np.asarray(Image.fromarray(picture).resize((tw, th), Image.Resampling.BICUBIC))
    top, left = (th - size) // 2, (tw - size) // 2
    return resized[top : top + size, left : left + size]


@pytest.mark.parametrize(("h", "w", "size"), [(20000, 1, 32), (1, 20000, 32), (3000, 5, 32), (40, 1000, 32), (6000, 200, 112), (300, 9000, 224)])
def test_extreme_pictures_follow_the_documented_rule(h: int, w: int, size: int) -> None:
    tw, th = frames.resized_size(w, h, size)
    assert tw * th > frames.FULL_RESIZE_AREA * size * size  # the region path
    picture = pattern(h, w, seed=w)
    np.testing.assert_array_equal(frames.fit(Image.fromarray(picture), size), documented(picture, size))
    busy = strip(h, w)  # every row differs: rounding in another pass order shows, by a level or two at most
    assert np.abs(frames.fit(Image.fromarray(busy), size).astype(int) - documented(busy, size)).max() <= 2


def test_ordinary_pictures_are_resized_whole_as_before() -> None:
    for h, w in [(48, 100), (100, 48), (32, 512), (512, 32), (300, 301)]:  # up to 16:1
        picture = pattern(h, w)
        np.testing.assert_array_equal(frames.fit(Image.fromarray(picture), S), documented(picture, S))


# The old fit resized a 1×1,000,000 strip to 32×32,000,000 (4 GB) before cropping 32×32.
BOUNDED = """
import resource, sys
import numpy as np
from PIL import Image
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
sys.path.insert(0, sys.argv[1])
from uform.plugins.media import frames
for shape in [(1_000_000, 1), (1, 1_000_000)]:
    picture = np.full(shape + (3,), 90, np.uint8)
    picture[shape[0] // 2, shape[1] // 2] = 250  # the centre pixel shows in the centre
    print(frames.fit(Image.fromarray(picture), 32).tobytes().hex())
"""


def test_a_million_to_one_strip_fits_in_little_memory() -> None:
    root = str(Path(frames.__file__).parents[2])
    out = subprocess.run([sys.executable, "-c", BOUNDED, root], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # The same local geometry at a size the documented rule handles whole: 40 rows, the
    # spike at row 20, the central square mapping onto rows 19.5 … 20.5 as 499,999.5 … 500,000.5.
    near = np.full((40, 1, 3), 90, np.uint8)
    near[20] = 250
    tall, wide = documented(near, 32), documented(np.ascontiguousarray(near.transpose(1, 0, 2)), 32)
    assert out.stdout.split() == [tall.tobytes().hex(), wide.tobytes().hex()]


def test_a_million_to_one_png_and_its_pixels_encode_alike(model: uform.Model) -> None:
    picture = strip(1_000_000, 1)
    data = encode_image(picture, "PNG")
    assert len(data) < 100_000
    fitted, _, pixels, _ = pictures.decode(sources.Source(0, None, data=data), S)
    assert pixels == 1_000_000 and fitted.shape == (S, S, 3)
    wide = np.ascontiguousarray(picture.transpose(1, 0, 2))
    files = np.array(model.image_encode([data, encode_image(wide, "PNG")], uform.Arena()).embeddings)
    pixel_rows = np.array(model.image_encode_pixels([picture, wide], uform.Arena()).embeddings)
    assert np.array_equal(files, pixel_rows) and np.isfinite(files).all()
