"""Version 2's image preprocessing against transformers' image processors, on photo-sized
pictures of many aspect ratios: the PIL processors' pixels exactly (up to about 16:1, where
version 1's region resample starts), the default (torchvision) processors' within 2 levels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from uform.plugins.media import frames

transformers = pytest.importorskip("transformers")
SIZES = [(480, 640), (640, 480), (1080, 1920), (333, 500), (224, 224), (100, 3000), (1000, 997), (2000, 90)]
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def photo(height: int, width: int, seed: int) -> Any:
    """A photo-like picture: smooth content from low-frequency noise, plus grain."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(0, 256, (max(2, height // 40), max(2, width // 40), 3), dtype=np.uint8))
    grain = rng.integers(-8, 9, (height, width, 3))
    return Image.fromarray(np.clip(np.asarray(base.resize((width, height), Image.Resampling.BICUBIC)) + grain, 0, 255).astype(np.uint8))


def _levels(processor: Any, fit: frames.Fit, mean: list[float], std: list[float], image: Any) -> np.ndarray:
    """|ours − theirs| in 8-bit levels, per pixel and channel."""
    ours = frames.fit(image, fit).astype(np.float32) / 255
    theirs = processor(images=image, return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
    return np.abs(ours - (theirs * np.float32(std) + np.float32(mean))) * 255  # type: ignore[no-any-return]


CASES = {
    "clip": (lambda pil, **k: (transformers.CLIPImageProcessorPil if pil else transformers.CLIPImageProcessor)(**k), frames.Fit(224, rounding="floor"), CLIP_MEAN, CLIP_STD),
    "siglip": (lambda pil, **k: (transformers.SiglipImageProcessorPil if pil else transformers.SiglipImageProcessor)(**k), frames.Fit(224, "square", "bicubic"), [0.5] * 3, [0.5] * 3),
    "siglip-bilinear": (lambda pil, **k: (transformers.SiglipImageProcessorPil if pil else transformers.SiglipImageProcessor)(resample=2, **k), frames.Fit(224, "square", "bilinear"), [0.5] * 3, [0.5] * 3),
}


@pytest.mark.parametrize("family", list(CASES))
def test_pixels_equal_the_pil_processor_and_near_the_default(family: str) -> None:
    make, fit, mean, std = CASES[family]
    pil, default = make(True, image_mean=mean, image_std=std), make(False, image_mean=mean, image_std=std)
    for i, (h, w) in enumerate(SIZES):
        image = photo(h, w, i)
        tw, th = frames.resized_size(w, h, 224, fit.rounding)
        whole = fit.resize == "square" or tw * th <= frames.FULL_RESIZE_AREA * 224 * 224
        # equal pixels (float rounding only); past about 16:1 the region resample may differ by a level (docs/media-images.md)
        assert _levels(pil, fit, mean, std, image).max() < (0.01 if whole else 2.01), (h, w)
        assert _levels(default, fit, mean, std, image).max() <= 2.01, (h, w)  # torchvision's resize: a level or two


def test_half_up_rounding_stays_version_1s() -> None:
    # 333 x 500 to a shorter side of 224: 336.336 -> 336 either way; 500 x 333 at 7: 10.51 -> 11 half up, 10 floor
    assert frames.resized_size(333, 500, 224) == frames.resized_size(333, 500, 224, "floor") == (224, 336)
    assert frames.resized_size(500, 333, 7) == (11, 7) and frames.resized_size(500, 333, 7, "floor") == (10, 7)
