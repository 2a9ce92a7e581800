"""The shipped default checkpoint (uform/data/default.safetensors) passes a quality floor on
both suites, measured through the runtime with BF16 and with E4M3 weights: the own suite
(uform.demo.evaluate, the training generator's renderer) and the foreign suite
(uform.demo.foreign.evaluate, media and phrasings made by independent code). The floors sit
a little under the figures docs/training.md reports, and are checked on seed 1, which the
figures were not measured (or tuned) on."""

from __future__ import annotations

import pytest

import uform
from uform.demo import evaluate, foreign

# docs/training.md, "The default model" (count 96, seed 0; the run: docs/notes/training-history.md,
# "The decoder of another draw"), has the figures; on seed 1
# (count 48, 256 questions) the shipped checkpoint measured recall@1 and @5 1.00 for every
# modality, direction 1.00, text_choose 1.000 with ECE 0.011, BF16 and E4M3 alike
FLOORS = {
    "image_recall_at_1": 0.93, "video_recall_at_1": 0.93, "audio_recall_at_1": 0.93,
    "image_recall_at_5": 0.97, "video_recall_at_5": 0.97, "audio_recall_at_5": 0.97,
    "video_direction": 0.93, "choose_accuracy": 0.97,
}  # fmt: skip
ECE_CEILING = 0.06
# The foreign suite on seed 1 (count 64, 256 questions): recall@1 image 0.93, video 0.97, audio
# 1.00, recall@5 1.00 / 0.97 / 1.00, direction 1.00, text_choose 0.996 with ECE 0.024, BF16 and
# E4M3 alike (2026-12-04, evening: the fourteenth run's picture and clip towers, the decoder of
# seed 1's draw and the sound tower of --voice-partials 48; the sound tower before read 0.87 here).
# Issue 19's goals (0.9 recall@1, 0.95 direction, text_choose 0.95 with ECE 0.05, E4M3 within
# 0.02) are met on seeds 0 and 1 at count 96 (docs/training.md); these floors keep every figure
# from getting worse.
FOREIGN_FLOORS = {
    "image_recall_at_1": 0.85, "video_recall_at_1": 0.88, "audio_recall_at_1": 0.93,
    "image_recall_at_5": 0.95, "video_recall_at_5": 0.93, "audio_recall_at_5": 0.95,
    "video_direction": 0.94, "choose_accuracy": 0.97,
}  # fmt: skip
FOREIGN_ECE_CEILING = 0.05  # issue 19's goal, met on this draw since the decoder of seed 1's draw (0.024)


@pytest.mark.parametrize("quantization", [uform.Scalar.BF16, uform.Scalar.E4M3])
def test_the_shipped_model_passes_its_quality_floor(quantization: uform.Scalar) -> None:
    with uform.Model.load_ram(uform.default_checkpoint(), quantization=quantization) as model:
        seen: list[tuple[int, int]] = []
        result = evaluate(model, seed=1, count=48, questions=256, progress=lambda done, total: seen.append((done, total)))
        held = model.describe().quantization.value  # what was asked, or f32 where the op library cannot serve bf16
    figures = result.as_dict()
    low = {k: figures[k] for k, floor in FLOORS.items() if figures[k] < floor}
    assert low == {}, figures
    assert result.choose_ece <= ECE_CEILING, figures
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert result.quantization == held and result.items == 48 and result.questions == 256 and result.suite == "own"


@pytest.mark.parametrize("quantization", [uform.Scalar.BF16, uform.Scalar.E4M3])
def test_the_shipped_model_understands_media_it_was_not_drawn_by(quantization: uform.Scalar) -> None:
    with uform.Model.load_ram(uform.default_checkpoint(), quantization=quantization) as model:
        result = foreign.evaluate(model, seed=1, count=64, questions=256)
    figures = result.as_dict()
    low = {k: figures[k] for k, floor in FOREIGN_FLOORS.items() if figures[k] < floor}
    assert low == {}, figures
    assert result.choose_ece <= FOREIGN_ECE_CEILING, figures
    assert result.suite == "foreign" and result.items == 64


def test_the_choice_temperatures_were_fitted_off_the_floor() -> None:
    import json

    from uform.core.checkpoint import CheckpointFile

    with CheckpointFile(uform.default_checkpoint()) as f:
        temperatures = json.loads(f.metadata["uform"])["choice_temperatures"]
    # calibrated on questions the model can get wrong: no group at the format's floor (0.001)
    assert len(temperatures) == 3 and all(0.0011 < t < 1000 for t in temperatures), temperatures


def test_the_shipped_model_is_small_and_calibrated() -> None:
    path = uform.default_checkpoint()
    assert path.stat().st_size <= 16 * 1024 * 1024
    with uform.Model.load_ram(path) as model:
        d = model.describe()
        assert d.choice_temperature_groups == 3 and d.dimensions == 64
        # the README's first search: red circles rank above every other picture
        from uform import Arena
        import numpy as np

        from uform.demo import generate as g
        from uform.demo.media import image_bytes

        rng = np.random.default_rng(11)
        pictures = [g.picture(rng, 128, colour="red", shape="circle", count=1) for _ in range(3)]
        pictures += [g.picture(rng, 128) for _ in range(20)]
        pictures = pictures[:3] + [p for p in pictures[3:] if p.caption != "a red circle"]
        media = np.array(model.image_encode([image_bytes(p.pixels) for p in pictures], Arena()).embeddings)
        query = np.array(model.text_encode(["a red circle"], Arena()).embeddings)[0]
        top = np.argsort(-(media @ query))[:3]
        assert sorted(top.tolist()) == [0, 1, 2]
