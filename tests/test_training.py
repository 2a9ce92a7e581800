"""The training recipe (uform.training): a few steps from scratch lower the loss, and the
checkpoint it writes loads in the runtime, encodes every modality and carries the fitted
choice temperatures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

from uform.demo import generate as g  # noqa: E402
from uform.demo.media import audio_bytes, image_bytes, video_bytes  # noqa: E402
from tiny_recipe import tiny_config, tensors  # noqa: E402


def test_a_few_steps_lower_the_loss_and_the_checkpoint_serves(tmp_path: Path) -> None:
    import uform
    from uform.training import Settings, train

    out = tmp_path / "trained.safetensors"
    settings = Settings(out=str(out), seed=0, steps=24, batch=12, decoder_batch=8, lr=3e-3, warmup=4, image_pool=24, video_pool=24,
                        audio_pool=24, calibration_examples=90, log_every=6, evaluate=False, config=tiny_config(),
                        decoder_steps=6, decoder_phase_batch=8, reading_steps=4)  # fmt: skip
    result = train(settings, log=lambda line: None)
    assert result.steps == 24 and len(result.losses) == 4
    assert result.last_loss < result.first_loss
    assert result.decoder_steps == 6 and len(result.decoder_losses) == 1
    assert result.reading_steps == 4 and len(result.reading_losses) == 1
    assert set(result.heldout) == {"canonical", "training", "decoder phase", "unseen phrasings", "options in any order",
                                  "six options in any order"}
    assert out.is_file() and not out.with_name(out.name + ".uncalibrated").exists()
    assert len(result.temperatures) == 3 and result.temperatures != (1.0, 1.0, 1.0)

    model = uform.Model.load_ram(out)
    description = model.describe()
    assert description.dimensions == 16 and description.choice_temperature_groups == 3
    rng = np.random.default_rng(5)
    arena = uform.Arena()
    assert model.text_encode(["a red circle"], arena).embeddings.shape == (1, 16)
    assert model.image_encode([image_bytes(g.picture(rng).pixels)], arena).embeddings.shape == (1, 16)
    assert model.video_encode([video_bytes(g.clip(rng).frames)], arena).embeddings.shape == (1, 16)
    assert model.audio_encode([audio_bytes(g.sound(rng).samples)], arena).embeddings.shape == (1, 16)
    probs = model.text_choose(["a red circle. Is it red? Answer y or n: "], "yn", arena, temperature_groups=[0])
    assert abs(float(np.sum(probs[0])) - 1) < 1e-5


def test_the_same_seed_writes_the_same_checkpoint(tmp_path: Path) -> None:
    from uform.training import Settings, train

    def run(name: str, seed: int) -> bytes:
        out = tmp_path / name
        train(Settings(out=str(out), seed=seed, steps=2, batch=4, decoder_batch=4, warmup=1, image_pool=4, video_pool=4,
                       audio_pool=4, calibration_examples=16, evaluate=False, config=tiny_config(), decoder_steps=2,
                       decoder_phase_batch=4, reading_steps=2), log=lambda line: None)  # fmt: skip
        return out.read_bytes()

    first = run("a.safetensors", 0)
    assert run("b.safetensors", 0) == first
    assert run("c.safetensors", 1) != first


def test_the_recipes_own_model_repeats_byte_for_byte(tmp_path: Path) -> None:
    """The recipe's geometry (not the tiny one, whose ops are too small to be cut across threads)
    on the threads torch has: the first phase's decoder ran its reduction in another order from
    run to run until the phase ran with deterministic algorithms, and a few of the training's
    H.264 clips encoded otherwise until x264 was made cpu-independent (tests/test_demo.py)."""
    from uform.training import Settings, train

    def run(name: str) -> bytes:
        out = tmp_path / name
        train(Settings(out=str(out), seed=0, steps=8, batch=16, decoder_batch=48, warmup=2, image_pool=32, video_pool=48,
                       audio_pool=16, calibration_examples=60, evaluate=False, decoder_steps=0, reading_steps=0),
              log=lambda line: None)  # fmt: skip
        return out.read_bytes()

    assert run("a.safetensors") == run("b.safetensors")


def test_the_steps_skip_filling_fresh_memory_and_write_what_filled_memory_writes(tmp_path: Path) -> None:
    """Deterministic algorithms fill every fresh tensor with NaN by default, to catch a read of
    memory no op wrote: 4 % of a first-phase step (the 42,804 fills of 25 steps). The recipe's
    steps write every tensor they read, so :func:`deterministic` turns the fill off (and back as
    it was) and the phase writes the same bytes as with it."""
    import torch

    from uform.training import Settings
    from uform.training.steps import deterministic
    from uform.training.towers import train_towers

    before, algorithms = torch.utils.deterministic.fill_uninitialized_memory, torch.are_deterministic_algorithms_enabled()
    with deterministic():
        assert torch.are_deterministic_algorithms_enabled() and not torch.utils.deterministic.fill_uninitialized_memory
    assert torch.utils.deterministic.fill_uninitialized_memory == before

    settings = Settings(out="unused", seed=0, steps=3, batch=4, decoder_batch=6, warmup=1, image_pool=4, video_pool=4, audio_pool=4,
                        config=tiny_config())  # fmt: skip
    train_towers(settings, tmp_path / "skipped.safetensors", lambda line: None, 0.0)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        train_towers.__wrapped__(settings, tmp_path / "filled.safetensors", lambda line: None, 0.0)  # type: ignore[attr-defined]
    finally:
        torch.use_deterministic_algorithms(algorithms)
        torch.utils.deterministic.fill_uninitialized_memory = before
    assert (tmp_path / "skipped.safetensors").read_bytes() == (tmp_path / "filled.safetensors").read_bytes()


def test_the_sixth_runs_settings_train(tmp_path: Path) -> None:
    """128 pictures a step's kind (image_factor 2), captions in groups of like length and packed decoder rows in both phases."""
    from uform.training import Settings, train

    out = tmp_path / "sixth.safetensors"
    result = train(Settings(out=str(out), seed=0, steps=3, batch=4, decoder_batch=6, warmup=1, image_pool=4, video_pool=4, audio_pool=4,
                            calibration_examples=30, evaluate=False, config=tiny_config(), decoder_steps=2, decoder_phase_batch=6,
                            image_factor=2, text_groups=4, decoder_row=128, reading_steps=0), log=lambda line: None)  # fmt: skip
    assert result.steps == 3 and result.decoder_steps == 2 and out.is_file()


def test_the_contrastive_loss_ranks_every_meaning_and_the_inputs_are_labelled_by_meaning() -> None:
    import torch

    from uform.demo.variety import captions
    from uform.training.inputs import Inputs
    from uform.training.losses import contrastive, prototypes

    texts = torch.nn.functional.normalize(torch.randn(10, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    labels = torch.tensor([3, 3, 7, 1])  # meanings absent from the batch still compete as classes
    scale = torch.tensor(2.3)
    matched = contrastive(texts[labels], texts, labels, scale)
    assert float(matched) < float(contrastive(texts[torch.tensor([5, 0, 2, 9])], texts, labels, scale))

    inputs = Inputs(tiny_config(), 0, 6, lambda line: None, audio_pool=6, image_pool=6, canonical=0.5)
    for modality, (data, got) in (("image", inputs.images(5)), ("video", inputs.videos(5)), ("audio", inputs.sounds(5))):
        assert len(data) == len(got) == 5 and all(0 <= i < len(captions.meanings(modality)) for i in got)
        assert len(inputs.captions(modality)) == len(captions.meanings(modality))
    assert inputs.clip_frames.shape[1:] == (4, 32, 32, 3) and inputs.sound_windows.shape == (6, 16000)
    assert inputs.pictures.shape == (6, 32, 32, 3)

    # the prototypes: one unit vector a meaning; one attribute of three apart is cosine 2/3
    targets = prototypes(16, 0)
    assert {m: tuple(t.shape) for m, t in targets.items()} == {"image": (54, 16), "video": (72, 16), "audio": (23, 16)}
    assert torch.allclose(targets["image"].norm(dim=1), torch.ones(54))


def test_each_part_of_the_inputs_draws_from_its_own_stream() -> None:
    """Another picture pool and batch leave every other part's draws as they were (a larger
    picture batch once redrew every clip, sound, caption and question after it)."""
    from uform.training.inputs import Inputs

    small = Inputs(tiny_config(), 0, 4, lambda line: None, audio_pool=4, image_pool=2, canonical=0.5)
    large = Inputs(tiny_config(), 0, 4, lambda line: None, audio_pool=4, image_pool=6, canonical=0.5)
    other = Inputs(tiny_config(), 1, 4, lambda line: None, audio_pool=4, image_pool=2, canonical=0.5)
    assert np.array_equal(small.clip_frames, large.clip_frames) and np.array_equal(small.sound_windows, large.sound_windows)
    for step in range(3):
        small.images(2)
        large.images(8 + step)
        for a, b in ((small.videos(3), large.videos(3)), (small.sounds(3), large.sounds(3))):
            assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert small.captions("video") == large.captions("video")
        assert [q.text for q in small.questions(4)] == [q.text for q in large.questions(4)]
    assert not np.array_equal(small.clip_frames, other.clip_frames)


def test_a_flipped_transposed_or_reversed_clip_changes_its_direction_with_it() -> None:
    from uform.demo.variety import captions
    from uform.training.inputs import Inputs
    from uform.training.losses import motion

    inputs = Inputs(tiny_config(), 0, 8, lambda line: None, image_pool=2)
    meanings = captions.meanings("video")
    # a bright square moving right across a grey ground, sampled as 4 frames
    frames = np.full((1, 4, 32, 32, 3), 128, np.uint8)
    for t in range(4):
        frames[0, t, 12:20, 4 + 6 * t : 12 + 6 * t] = 250
    right = [i for i, m in enumerate(meanings) if m.attributes == ("red", "square", "right")][0]
    inputs.clip_frames, inputs.clip_labels = frames.repeat(2, 0), np.array([right, right])
    seen = set()
    for _ in range(40):
        got, labels = inputs.videos(1)
        place, weight, cover = motion(got, 8)
        dx, dy = float(place[0, -2] - place[0, 0]), float(place[0, -1] - place[0, 1])
        way = meanings[int(labels[0])].attributes[2]
        assert weight.min() == 1 and cover.shape == (1, 4, 16) and float(cover.sum()) > 0 and way == {True: "right" if dx > 0 else "left", False: "down" if dy > 0 else "up"}[abs(dx) > abs(dy)]
        seen.add(way)
    assert seen == {"left", "right", "up", "down"}


def test_packed_questions_give_the_padded_losses() -> None:
    import torch

    from uform.exporters.reference import ReferenceModel
    from uform.training.questions import decoder_loss, decoder_questions, packed_decoder_loss, packed_decoder_step

    torch.manual_seed(0)
    tower = ReferenceModel(tiny_config()).towers["decoder"]
    questions = decoder_questions(np.random.default_rng(3), 30, tower.context)
    assert all(len(q.text.encode()) < tower.context for q in questions)
    packed, answer = packed_decoder_loss(tower, questions, row=200)
    padded, _ = decoder_loss(tower, questions)
    packed, answer, padded = packed.detach(), answer.detach(), padded.detach()
    assert abs(float(packed) - float(padded)) < 1e-5 and 0 < float(answer) < float(packed)
    # the first phase's step: the padded loss and the same answers right, packed into rows of 128 bytes
    padded, right = decoder_loss(tower, questions)
    stepped, packed_right = packed_decoder_step(tower, questions, row=128)
    assert abs(float(stepped.detach()) - float(padded.detach())) < 1e-5 and packed_right == right


def test_captions_encoded_in_groups_of_like_length_give_the_same_embeddings() -> None:
    import torch

    from uform.demo.variety.captions import meanings, phrase
    from uform.exporters.reference import ReferenceModel
    from uform.training.losses import text_embeddings

    torch.manual_seed(0)
    tower = ReferenceModel(tiny_config()).towers["text"]
    rng = np.random.default_rng(4)
    captions = [phrase(rng, m, canonical=0.3, jumbled=0.35) for m in meanings("audio") + meanings("image")]
    with torch.no_grad():
        whole = text_embeddings(tower, captions)
        for groups in (2, 4):
            assert torch.allclose(text_embeddings(tower, captions, groups), whole, atol=1e-6)


def test_towers_run_for_their_class_token_alone_give_the_same_embeddings_and_gradients() -> None:
    """Training sets ``class_token_only`` on every tower but the decoder: their last block
    runs for the class token alone, and the embeddings and every gradient stay the full
    blocks' (a text tower with a token head, which reads every token, keeps them all)."""
    import torch

    from uform.exporters.reference import ReferenceModel
    from uform.training.steps import class_tokens_only, initialise

    config = tiny_config()
    config.towers["text"]["token_width"] = 8
    full = ReferenceModel(config)
    initialise(full, 3)
    picked = ReferenceModel(config)
    picked.load_state_dict(full.state_dict())
    class_tokens_only(picked)
    assert [n for n, t in picked.towers.items() if t.class_token_only] == [n for n in picked.towers if n != "decoder"]
    x = torch.zeros(2, 5, 32)
    assert picked.towers["image"].run(x).shape == (2, 1, 32) and full.towers["image"].run(x).shape == (2, 5, 32)
    rng = np.random.default_rng(5)
    inputs = {
        "image": (torch.from_numpy(rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)),),
        "video": (torch.from_numpy(rng.integers(0, 256, (2, 4, 32, 32, 3), dtype=np.uint8)),),
        "audio": (torch.from_numpy(rng.standard_normal((2, 16000)).astype(np.float32)),),
        "text": (torch.from_numpy(rng.integers(1, 256, (3, 9))), torch.tensor([9, 4, 1])),
    }
    for name, args in inputs.items():
        outs = [model.towers[name](*args) for model in (full, picked)]
        if name == "text":  # embeddings and the token head's vectors, every token still run
            assert outs[0][1] is not None and outs[1][1] is not None and torch.equal(outs[0][1], outs[1][1])
            outs = [o[0] for o in outs]
        torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=0)
        for out in outs:
            (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    graded = 0
    for (key, a), b in zip(full.named_parameters(), picked.parameters()):
        assert (a.grad is None) == (b.grad is None), key  # the decoder's and the token head's: none
        if a.grad is not None and b.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=key)
            graded += 1
    assert graded == sum(1 for n, _ in full.named_parameters() if not n.startswith("towers.decoder.") and "token_head" not in n)
    config.towers["text"]["token_width"] = 0  # without a token head, the text tower runs its class token alone too
    lone = ReferenceModel(config)
    lone.load_state_dict({k: v for k, v in full.state_dict().items() if "token_head" not in k})
    class_tokens_only(lone)
    with torch.no_grad():
        embeddings, tokens = lone.towers["text"](*inputs["text"])
        assert tokens is None
        torch.testing.assert_close(embeddings, full.towers["text"](*inputs["text"])[0], atol=1e-6, rtol=0)


def test_smoothed_calibration_keeps_a_group_answered_all_right_off_the_floor() -> None:
    from uform import calibrate as cal

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(80, 3)) * 4
    answers, groups, offsets = logits.argmax(1), np.zeros(80, np.int64), np.arange(81) * 3
    assert cal.fit_temperatures(logits.reshape(-1), offsets, answers, groups, 1)[0][0] == pytest.approx(cal.T_MIN)
    smoothed = cal.fit_temperatures(logits.reshape(-1), offsets, answers, groups, 1, smoothing=True)[0][0]
    assert 0.01 < smoothed < 10
    # with plenty of wrong answers it changes the fit little: labels drawn from softmax(logits / 0.5)
    many = rng.normal(size=(4000, 3))
    p = np.exp(many / 0.5) / np.exp(many / 0.5).sum(1, keepdims=True)
    drawn = (p.cumsum(1) < rng.random((4000, 1))).sum(1)
    plain = cal.fit_temperatures(many.reshape(-1), np.arange(4001) * 3, drawn, np.zeros(4000, np.int64), 1)[0][0]
    assert cal.fit_temperatures(many.reshape(-1), np.arange(4001) * 3, drawn, np.zeros(4000, np.int64), 1, smoothing=True)[0][0] == pytest.approx(plain, rel=0.01)


def test_the_held_out_split_reads_the_shipped_model_through_the_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    """The split a model is chosen on (never the foreign suite): the same draw for the same seed,
    labelled by meaning, and the shipped model reads it far above chance, attribute by attribute."""
    import json

    import uform
    from uform.demo.variety import captions
    from uform.training import heldout

    sizes = {"image": 24, "video": 12, "audio": 12}
    split = heldout.draw(0, sizes)
    assert split == heldout.draw(0, sizes) and split != heldout.draw(1, sizes)
    bright = heldout.draw(0, sizes, partials=48)  # the recordings alone drawn otherwise
    assert {m for m in sizes if bright.files[m] != split.files[m]} == {"audio"}
    assert {m: len(f) for m, f in split.files.items()} == sizes
    assert all(0 <= i < len(captions.meanings(m)) for m, labels in split.labels.items() for i in labels)
    with uform.Model.load_ram() as model:
        read = heldout.read(model, split)
    assert set(read) == {"image", "video", "audio"} and read["video"].direction is not None and read["image"].direction is None
    for modality, floor in (("image", 0.75), ("video", 0.6), ("audio", 0.75)):
        r = read[modality]
        assert r.accuracy >= floor and len(r.attributes) == 3 and min(r.attributes) >= r.accuracy, (modality, r)
    assert read["video"].direction >= 0.75

    heldout.main([str(uform.default_checkpoint()), "--json", "--count", "4"])
    said = json.loads(capsys.readouterr().out)
    assert said["checkpoint"] == str(uform.default_checkpoint()) and set(said) == {"checkpoint", "image", "video", "audio"}
    with pytest.raises(SystemExit):
        heldout.main([str(uform.default_checkpoint()), "--count", "0"])
    assert "--count is a number of items, 1 or more, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        heldout.main([str(uform.default_checkpoint()), "--voice-partials", "0"])
    assert "--voice-partials is a count of partials, 1 or more, got 0" in capsys.readouterr().err


def test_bf16_autocast_runs_the_towers_in_bf16_and_leaves_the_decoder_as_it_was(tmp_path: Path) -> None:
    """``autocast``: the first phase's and the clip stage's tower forwards in BF16 (their
    products' outputs BF16), the losses in float32. The decoder, which never runs under it,
    comes out byte for byte as without; every other tower differs; a run repeats."""
    import torch

    from uform.training import Settings, train
    from uform.training.steps import towers_in_bf16

    layer = torch.nn.Linear(4, 3)
    with towers_in_bf16(True):
        assert layer(torch.ones(2, 4)).dtype == torch.bfloat16
    with towers_in_bf16(False):
        assert layer(torch.ones(2, 4)).dtype == torch.float32
    common = dict(seed=0, steps=3, batch=4, decoder_batch=4, warmup=1, image_pool=4, video_pool=6, audio_pool=4, decoder_every=1,
                  calibration_examples=60, evaluate=False, config=tiny_config(), decoder_steps=0, reading_steps=0, clip_stage=True)  # fmt: skip
    paths = {name: tmp_path / f"{name}.safetensors" for name in ("float32", "bf16", "again")}
    results = {name: train(Settings(out=str(path), autocast=name != "float32", **common), log=lambda line: None) for name, path in paths.items()}
    assert all(np.isfinite(r.losses).all() for r in results.values())
    one, other = tensors(paths["bf16"]), tensors(paths["float32"])
    differ = {name.split(".")[0] for name in one if one[name] != other[name]}
    assert differ == {"text", "image", "video", "audio"}
    assert paths["again"].read_bytes() == paths["bf16"].read_bytes()
