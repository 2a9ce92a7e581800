"""The training recipe (uform.training): a few steps from scratch lower the loss, and the
checkpoint it writes loads in the runtime, encodes every modality and carries the fitted
choice temperatures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

from uform.core.config import make_config  # noqa: E402
from uform.demo import generate as g  # noqa: E402
from uform.demo.media import audio_bytes, image_bytes, video_bytes  # noqa: E402

STACK = {"width": 32, "depth": 1, "heads": 2, "mlp_width": 64}
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def tiny_config():  # type: ignore[no-untyped-def]
    return make_config(16, 128, {
        "text": {**STACK, "token_width": 0},
        "image": {**STACK, "image_size": 32, "patch_size": 8, "mean": MEAN, "std": STD},
        "video": {**STACK, "frames": 4, "image_size": 32, "patch_size": 8, "mean": MEAN, "std": STD},
        "audio": {**STACK, "sample_rate": 16000, "samples": 16000, "n_fft": 400, "hop": 160, "n_mels": 16, "patch_frames": 7},
        "decoder": dict(STACK),
    }, choice_temperatures=(1.0, 1.0, 1.0))  # fmt: skip


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


def tensors(path: Path) -> dict[str, bytes]:
    from uform.core.checkpoint import CheckpointFile

    with CheckpointFile(path) as f:
        return {name: f.array(name).tobytes() for name in f.entries}


def test_the_decoder_phase_from_a_checkpoint_is_the_full_recipes_second_phase(tmp_path: Path) -> None:
    """``--phase decoder --from CHECKPOINT`` trains the byte decoder alone: every other tensor
    is the checkpoint's byte for byte, and from the first phase's output it writes exactly what
    the full recipe writes."""
    import json

    from uform.core.checkpoint import CheckpointFile
    from uform.training import Settings, train

    common = dict(seed=0, steps=3, batch=4, decoder_batch=4, warmup=1, image_pool=4, video_pool=4, audio_pool=4,
                  calibration_examples=60, evaluate=False, config=tiny_config(), decoder_phase_batch=6, decoder_warmup=2,
                  reading_steps=0)  # fmt: skip
    towers, full, phased = tmp_path / "towers.safetensors", tmp_path / "full.safetensors", tmp_path / "phased.safetensors"
    train(Settings(out=str(towers), decoder_steps=0, **common), log=lambda line: None)  # the first phase alone (and calibration)
    train(Settings(out=str(full), decoder_steps=5, **common), log=lambda line: None)
    lines: list[str] = []
    result = train(Settings(out=str(phased), decoder_steps=5, phase="decoder", start=str(towers), **common), log=lines.append)
    assert result.steps == 0 and result.decoder_steps == 5 and len(result.decoder_losses) == 1
    assert any(line.startswith("decoder phase: 5 steps") for line in lines)
    before, after = tensors(towers), tensors(phased)
    assert before.keys() == after.keys()
    changed = {name for name in before if before[name] != after[name]}
    assert changed and all(name.startswith("decoder.") for name in changed)  # the towers are kept byte for byte
    assert tensors(full) == after  # the same as the full recipe's second phase
    with CheckpointFile(phased) as f:
        assert json.loads(f.metadata["uform"])["choice_temperatures"] == list(result.temperatures)
    assert len(result.temperatures) == 3 and all(0.0011 < t < 1000 for t in result.temperatures)

    # no steps: the checkpoint recalibrated from neutral temperatures, its tensors untouched
    again = tmp_path / "again.safetensors"
    assert train(Settings(out=str(again), decoder_steps=0, phase="decoder", start=str(phased), **common), log=lambda line: None).decoder_steps == 0
    assert tensors(again) == after
    with pytest.raises(ValueError, match="starts from a checkpoint"):
        train(Settings(out=str(again), phase="decoder", **common))


def test_the_reading_stage_from_a_checkpoint_is_the_full_recipes_last_stage(tmp_path: Path) -> None:
    """``--phase reading --from CHECKPOINT`` goes on with the byte decoder alone, from the
    decoder phase's output, and writes what the full recipe writes; ``--phase decoder`` runs
    the stage after the decoder phase."""
    from uform.training import Settings, train

    common = dict(seed=0, steps=3, batch=4, decoder_batch=4, warmup=1, image_pool=4, video_pool=4, audio_pool=4,
                  calibration_examples=60, evaluate=False, config=tiny_config(), decoder_phase_batch=6, decoder_warmup=2,
                  decoder_steps=3)  # fmt: skip
    decoded, full, read, phased = (tmp_path / f"{n}.safetensors" for n in ("decoded", "full", "read", "phased"))
    train(Settings(out=str(decoded), reading_steps=0, **common), log=lambda line: None)  # both phases, no reading stage
    train(Settings(out=str(full), reading_steps=4, **common), log=lambda line: None)
    lines: list[str] = []
    result = train(Settings(out=str(read), reading_steps=4, phase="reading", start=str(decoded), **common), log=lines.append)
    assert result.steps == 0 and result.decoder_steps == 0 and result.reading_steps == 4 and len(result.reading_losses) == 1
    assert any(line.startswith("reading stage: 4 steps") for line in lines)
    before, after = tensors(decoded), tensors(read)
    changed = {name for name in before if before[name] != after[name]}
    assert changed and all(name.startswith("decoder.") for name in changed)  # the towers are kept byte for byte
    assert tensors(full) == after  # the same as the full recipe's last stage
    towers = tmp_path / "towers.safetensors"
    train(Settings(out=str(towers), **(common | {"decoder_steps": 0, "reading_steps": 0})), log=lambda line: None)
    train(Settings(out=str(phased), reading_steps=4, phase="decoder", start=str(towers), **common), log=lambda line: None)
    assert tensors(phased) == after  # --phase decoder: the decoder phase, then the reading stage


def test_the_reading_stage_lists_lettered_options_in_a_random_order() -> None:
    """Its questions are lettered in the share asked for and their lists are shuffled: a full
    list of the six colours comes in the canonical order about once in 720 (the decoder
    phase's, half of them shuffled, far more often)."""
    from uform.demo.variety.decoder import decoder_question
    from uform.training.questions import decoder_questions
    from uform.training.reading import reading_questions

    def canonical_share(questions: list[g.Question]) -> tuple[float, int]:
        full = [q.text for q in questions if q.group == g.LETTERS and all(c in q.text for c in g.COLOURS)]
        in_order = [t for t in full if sorted(g.COLOURS, key=t.rfind) == list(g.COLOURS)]
        return len(in_order) / max(len(full), 1), len(full)

    rng = np.random.default_rng(3)
    lettered = reading_questions(rng, 1500, 128, letters=1.0)
    assert all(q.group == g.LETTERS and len(q.text.encode()) < 128 for q in lettered)
    share, full = canonical_share(lettered)
    assert full > 40 and share < 0.05
    share, full = canonical_share(decoder_questions(np.random.default_rng(3), 3000, 128))
    assert full > 40 and share > 0.3
    mixed = reading_questions(np.random.default_rng(4), 600, 128, letters=0.0)
    assert {q.group for q in mixed} == {g.YES_NO, g.DIGITS, g.LETTERS}
    assert sum(q.group == g.LETTERS for q in mixed) < 0.5 * len(mixed)
    rng = np.random.default_rng(5)
    share, full = canonical_share([decoder_question(rng, shuffled=0.0) for _ in range(3000)])
    assert full > 40 and share == 1.0  # never shuffled: every full list in the canonical order


def test_the_command_line_takes_the_decoder_phase_with_its_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    from uform.training.__main__ import main

    for argv in (["--out", "x", "--phase", "decoder"], ["--out", "x", "--from", "y.safetensors"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "--from CHECKPOINT goes with --phase decoder" in capsys.readouterr().err


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


@pytest.mark.parametrize(("phase", "tower"), [("clips", "video"), ("pictures", "image"), ("sounds", "audio")])
def test_a_media_tower_phase_trains_that_tower_alone_into_its_checkpoint(tmp_path: Path, phase: str, tower: str) -> None:
    """``--phase clips`` / ``pictures`` / ``sounds --from CHECKPOINT``: the first phase's clip,
    picture or sound tower alone, from a fresh initialisation, written into the checkpoint with every
    other tensor and the choice temperatures byte for byte; a variant is reproducible and
    another variant draws another tower; the checkpoint serves the tower's media."""
    import uform
    from uform.core.checkpoint import CheckpointFile
    from uform.training import Settings, train

    common = dict(seed=0, steps=3, batch=4, decoder_batch=4, warmup=1, image_pool=4, video_pool=6, audio_pool=4,
                  calibration_examples=60, evaluate=False, config=tiny_config(), decoder_steps=0, reading_steps=0)  # fmt: skip
    start = tmp_path / "start.safetensors"
    train(Settings(out=str(start), **common), log=lambda line: None)
    outs = {v: tmp_path / f"{phase}{v}.safetensors" for v in (1, 2)}
    lines: list[str] = []
    for v, out in outs.items():
        result = train(Settings(out=str(out), phase=phase, start=str(start), variant=v, **common), log=lines.append)
        assert result.steps == 3 and len(result.losses) == 1 and np.isfinite(result.last_loss)
    assert any(line.startswith("trained and saved in") for line in lines)
    assert any(line.startswith(f"{phase} step 3/3") for line in lines)
    before, one, two = tensors(start), tensors(outs[1]), tensors(outs[2])
    assert before.keys() == one.keys() == two.keys()
    assert {name for name in before if before[name] != one[name]} == {name for name in before if name.startswith(f"{tower}.")}
    assert {name for name in one if one[name] != two[name]} <= {name for name in before if name.startswith(f"{tower}.")}
    assert one != two  # another variant, another tower
    again = tmp_path / "again.safetensors"
    train(Settings(out=str(again), phase=phase, start=str(start), variant=1, **common), log=lambda line: None)
    assert tensors(again) == one
    with CheckpointFile(start) as a, CheckpointFile(outs[1]) as b:
        assert a.metadata == b.metadata  # the temperatures (and everything else said of the model) kept
    model = uform.Model.load_ram(outs[1])
    try:
        if tower == "video":
            embeddings = model.video_encode([video_bytes(g.clip(np.random.default_rng(0)).frames)], uform.Arena()).embeddings
        elif tower == "audio":
            embeddings = model.audio_encode([audio_bytes(g.sound(np.random.default_rng(0)).samples)], uform.Arena()).embeddings
        else:
            embeddings = model.image_encode([image_bytes(g.picture(np.random.default_rng(0)).pixels)], uform.Arena()).embeddings
        assert embeddings.shape == (1, 16)
    finally:
        model.close()


def test_the_sound_tower_can_take_another_front_end(tmp_path: Path) -> None:
    """``--phase sounds --audio-front n_fft=…,n_mels=…``: the checkpoint's config says the new
    front end, the sound tower's shapes follow it (its patches take n_mels × patch_frames
    values, its positions one per patch of the new frame count), every other tensor is kept
    byte for byte, and the runtime serves it; a key other than n_fft, hop, n_mels is refused."""
    import uform
    from uform.core.checkpoint import CheckpointFile
    from uform.core.config import ModelConfig
    from uform.training import Settings, train
    from uform.training.alone import with_audio_front

    common = dict(seed=0, steps=2, batch=4, decoder_batch=4, warmup=1, image_pool=4, video_pool=6, audio_pool=4,
                  calibration_examples=60, evaluate=False, config=tiny_config(), decoder_steps=0, reading_steps=0)  # fmt: skip
    start = tmp_path / "start.safetensors"
    train(Settings(out=str(start), **common), log=lambda line: None)
    before = tensors(start)
    out = tmp_path / "front.safetensors"
    lines: list[str] = []
    train(Settings(out=str(out), phase="sounds", start=str(start), audio_front={"n_fft": 800, "n_mels": 24}, **common), log=lines.append)
    assert "the sound tower's front end: n_fft 800, n_mels 24" in lines
    with CheckpointFile(start) as a, CheckpointFile(out) as b:
        old, new = ModelConfig.from_metadata(a.metadata).towers["audio"], ModelConfig.from_metadata(b.metadata).towers["audio"]
        assert {k: v for k, v in new.items() if old[k] != v} == {"n_fft": 800, "n_mels": 24}
        frames = 1 + (new["samples"] - 800) // new["hop"]
        assert b.entries["audio.patch.weight"].shape[1] == 24 * new["patch_frames"]
        assert b.entries["audio.pos.weight"].shape[0] == 1 + frames // new["patch_frames"]
    after = tensors(out)
    assert {name for name in before if not name.startswith("audio.")} == {name for name in after if not name.startswith("audio.")}
    assert all(before[name] == after[name] for name in before if not name.startswith("audio."))
    model = uform.Model.load_ram(out)
    try:
        assert model.audio_encode([audio_bytes(g.sound(np.random.default_rng(0)).samples)], uform.Arena()).embeddings.shape == (1, 16)
    finally:
        model.close()
    with pytest.raises(ValueError, match="^audio_front sets n_fft, hop, n_mels, not width$"):
        with_audio_front(tiny_config(), {"width": 8})
    with pytest.raises(ValueError, match="^audio_front goes with the sounds phase$"):
        train(Settings(out=str(tmp_path / "x.safetensors"), phase="pictures", start=str(start), audio_front={"n_mels": 24}, **common),
              log=lambda line: None)  # fmt: skip


def test_the_clip_tower_can_start_from_the_checkpoints_picture_tower(tmp_path: Path) -> None:
    """``--phase clips --clips-from-pictures``: every tensor the picture tower shares with the clip
    tower by name and shape is copied (the frames' embedding alone stays fresh), and the phase
    trains on from there into the checkpoint, logging what it took."""
    import torch

    from uform.exporters.reference import ReferenceModel
    from uform.training import Settings, train
    from uform.training.alone import pictures_into_clips

    common = dict(seed=0, steps=2, batch=4, decoder_batch=4, warmup=1, image_pool=4, video_pool=6, audio_pool=4,
                  calibration_examples=60, evaluate=False, config=tiny_config(), decoder_steps=0, reading_steps=0)  # fmt: skip
    start = tmp_path / "start.safetensors"
    train(Settings(out=str(start), **common), log=lambda line: None)
    model = ReferenceModel.from_checkpoint(start)
    clips = ReferenceModel(model.config).towers["video"]
    taken = pictures_into_clips(model, clips)
    assert set(clips.state_dict()) - set(taken) == {"time.weight"} and "blocks.0.attn.qkv.weight" in taken
    pictures = model.towers["image"].state_dict()
    assert all(torch.equal(clips.state_dict()[key], pictures[key]) for key in taken)

    lines: list[str] = []
    out = tmp_path / "clips.safetensors"
    train(Settings(out=str(out), phase="clips", start=str(start), variant=1, clips_from_pictures=True, **common), log=lines.append)
    assert any(line.startswith(f"the clip tower starts from the checkpoint's picture tower: {len(taken)} tensors") for line in lines)
    trained = ReferenceModel.from_checkpoint(out).towers["video"].state_dict()
    fresh = tmp_path / "fresh.safetensors"
    train(Settings(out=str(fresh), phase="clips", start=str(start), variant=1, **common), log=lambda line: None)
    untouched = ReferenceModel.from_checkpoint(fresh).towers["video"].state_dict()
    # two steps from the picture tower stay near it, and far from the fresh start's tower
    near = float((trained["patch.weight"] - pictures["patch.weight"]).abs().max())
    assert near < float((untouched["patch.weight"] - pictures["patch.weight"]).abs().max()) and near < 0.05


def test_the_clip_stage_trains_the_clip_tower_after_the_first_phase_from_its_picture_tower(tmp_path: Path) -> None:
    """``--clip-stage``: the towers' phase trains no clip tower (and decodes no clip pool), then the
    clip stage trains it from that phase's picture tower; every other tower is the phase's, so
    the checkpoint differs from the joint recipe's in its clip tower alone, and it repeats."""
    from uform.training import Settings, train

    common = dict(seed=0, steps=2, batch=4, decoder_batch=4, warmup=1, image_pool=4, video_pool=6, audio_pool=4,
                  calibration_examples=60, evaluate=False, config=tiny_config(), decoder_steps=0, reading_steps=0)  # fmt: skip
    lines: list[str] = []
    staged = tmp_path / "staged.safetensors"
    result = train(Settings(out=str(staged), clip_stage=True, **common), log=lines.append)
    assert result.clip_steps == 2 and result.clip_seconds > 0
    assert [line for line in lines if line.startswith("decoded") and "clips" in line] == [
        "decoded 2 training clips through the video plugin in 0 s",  # the first phase's: none to speak of
        "decoded 6 training clips through the video plugin in 0 s",  # the stage's pool
    ]
    assert any(line.startswith("the clip tower starts from the checkpoint's picture tower") for line in lines)
    assert any(line.startswith("clip stage: 2 steps in") for line in lines)
    joint = tmp_path / "joint.safetensors"
    train(Settings(out=str(joint), **common), log=lambda line: None)
    one, other = tensors(staged), tensors(joint)
    assert {name for name in one if one[name] != other[name]} == {name for name in one if name.startswith("video.")}
    again = tmp_path / "again.safetensors"
    train(Settings(out=str(again), clip_stage=True, **common), log=lambda line: None)
    assert again.read_bytes() == staged.read_bytes()


def test_the_command_line_takes_the_media_tower_phases_and_their_variant(capsys: pytest.CaptureFixture[str]) -> None:
    from uform.training.__main__ import main

    for argv, said in ((["--out", "x", "--phase", "clips"], "--from CHECKPOINT goes with --phase decoder, reading, clips, pictures, sounds or questions"),
                       (["--out", "x", "--phase", "pictures"], "--from CHECKPOINT goes with --phase decoder, reading, clips, pictures, sounds or questions"),
                       (["--out", "x", "--variant", "2"], "--variant goes with --phase clips, pictures, sounds or questions"),
                       (["--out", "x", "--phase", "sounds", "--from", "c", "--decoder-seed", "1"],
                        "--decoder-seed goes with --phase all, decoder, reading or questions (the phases that train the byte decoder)"),
                       (["--out", "x", "--phase", "pictures", "--from", "c", "--audio-front", "n_mels=64"],
                        "--audio-front goes with --phase sounds"),
                       (["--out", "x", "--phase", "sounds", "--from", "c", "--audio-front", "n_mels=lots"],
                        "--audio-front takes n_fft=N,hop=N,n_mels=N (any of them), got 'n_mels=lots'"),
                       (["--out", "x", "--phase", "sounds", "--from", "c", "--audio-front", "width=8"],
                        "--audio-front takes n_fft=N,hop=N,n_mels=N (any of them), got 'width=8'"),
                       (["--out", "x", "--phase", "pictures", "--from", "c", "--clips-from-pictures"],
                        "--clips-from-pictures goes with --phase clips"),
                       (["--out", "x", "--phase", "decoder", "--from", "c", "--clip-stage"],
                        "--clip-stage goes with --phase all (the towers' phase)"),
                       (["--out", "x", "--voice-partials", "0"], "--voice-partials is a count of partials, 1 or more, got 0"),
                       (["--out", "x", "--phase", "pictures", "--from", "c", "--voice-partials", "48"],
                        "--voice-partials goes with --phase all or sounds (the phases that train the sound tower)"),
                       (["--out", "x", "--canonical-vision", "1.5"], "--canonical-vision is a share, 0 to 1, got 1.5"),
                       (["--out", "x", "--reading-steps", "-1"], "--reading-steps is a count of steps, 0 or more, got -1"),
                       (["--out", "x", "--phase", "reading"], "--from CHECKPOINT goes with --phase decoder, reading, clips, pictures, sounds or questions")):  # fmt: skip
        with pytest.raises(SystemExit):
            main(argv)
        assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--seed", "-1"], "--seed is an integer of 0 or more, got -1"),  # numpy's 'expected non-negative integer', a traceback
        (["--phase", "pictures", "--from", "c", "--variant", "-2"], "--variant is an integer of 0 or more, got -2"),
        (["--decoder-seed", "-1"], "--decoder-seed is an integer of 0 or more, got -1"),
        (["--steps", "-5"], "--steps is an integer of 1 or more, got -5"),
        (["--steps", "0"], "--steps is an integer of 1 or more, got 0"),
        (["--batch", "0"], "--batch is an integer of 1 or more, got 0"),  # it made the pools and ran on
        (["--image-factor", "0"], "--image-factor is an integer of 1 or more, got 0"),
        (["--text-groups", "0"], "--text-groups is an integer of 1 or more, got 0"),
        (["--decoder-row", "-3"], "--decoder-row is an integer of 0 or more, got -3"),
        (["--image-pool", "0"], "--image-pool is an integer of 1 or more, got 0"),
        (["--video-pool", "-1"], "--video-pool is an integer of 1 or more, got -1"),
        (["--audio-pool", "0"], "--audio-pool is an integer of 1 or more, got 0"),
        (["--threads", "-2"], "--threads is an integer of 1 or more, got -2"),  # torch's RuntimeError, a traceback
        (["--minutes", "0"], "--minutes is a time, more than 0, got 0.0"),
        (["--minutes", "nan"], "--minutes is a time, more than 0, got nan"),
    ],
)
def test_the_command_line_refuses_counts_and_seeds_out_of_range_before_any_work(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from uform.training.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["--out", "x.safetensors", "--no-evaluate", *argv])
    assert info.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("out", ["", "trained/"])
def test_the_command_line_refuses_an_out_that_names_no_file(out: str, capsys: pytest.CaptureFixture[str]) -> None:
    from uform.training.__main__ import main

    with pytest.raises(SystemExit) as info:  # '' was written as '.', 'trained/' as the file 'trained', after the whole run
        main(["--out", out, "--no-evaluate"])
    assert info.value.code == 2 and f"--out names the checkpoint file to write, got {out!r}" in capsys.readouterr().err


def test_the_command_line_refuses_files_it_cannot_use_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's file at --out was replaced by the checkpoint; /dev/full at --out or --report was
    refused only when the run ended (minutes or hours in) with a traceback, the report lost; a
    --from missing, a folder, with a NaN temperature or without the decoder its phase trains was a
    traceback (FileNotFoundError, OSError 'No such device', CheckpointError, KeyError 'decoder')."""
    import uform
    from ckpt import make_checkpoint
    from uform.training import __main__ as command

    def never(*args: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(command, "train", never)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    text_only = make_checkpoint(tmp_path / "text.safetensors", "tiny", 0, ["text"])
    raw = uform.default_checkpoint().read_bytes()
    at = raw.index(b'choice_temperatures\\":[') + len(b'choice_temperatures\\":[')  # the header's length kept: NaN, spaces
    raw = raw[:at] + b"NaN" + b" " * (raw.index(b",", at) - at - 3) + raw[raw.index(b",", at) :]
    (tmp_path / "nan.safetensors").write_bytes(raw)
    good = str(uform.default_checkpoint())
    out = str(tmp_path / "out.safetensors")
    for argv, said in (
        (["--out", str(notes)], f"{notes}: exists and is not a uform checkpoint; not replaced (--force replaces it)"),
        (["--out", "/dev/full"], "/dev/full: not a regular file (/dev/full); not replaced"),
        (["--out", out, "--report", "/dev/full"], "/dev/full: not a regular file (/dev/full); not replaced"),
        (["--out", out, "--phase", "decoder", "--from", str(tmp_path / "nope")], f"{tmp_path}/nope: no such checkpoint file"),
        (["--out", out, "--phase", "decoder", "--from", str(tmp_path)], f"{tmp_path}: is a directory, not a checkpoint file"),
        (["--out", out, "--phase", "reading", "--from", str(tmp_path / "nan.safetensors")],
         f"{tmp_path}/nan.safetensors: config field choice_temperatures: nan is not a number in [0.001, 1000.0]"),
        (["--out", out, "--phase", "decoder", "--from", str(text_only)],
         f"{text_only}: has no byte decoder (tower 'decoder'), which --phase decoder trains; give a checkpoint that has one"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            command.main([*argv, "--no-evaluate"])
        assert info.value.code == 2 and capsys.readouterr().err.endswith(f"python -m uform.training: error: {said}\n")
    assert notes.read_text() == "my notes\n" and not Path(out).exists()
    with pytest.raises(AssertionError, match="the run started"):  # --force replaces it; a good --from is taken
        command.main(["--out", str(notes), "--force", "--phase", "decoder", "--from", good, "--no-evaluate"])


def test_a_users_file_at_report_is_not_replaced_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--out refused a user's file unless --force, but --report replaced one at the run's end
    (notes.txt gone after the run); a run's own earlier report is replaced as before."""
    import json
    from dataclasses import asdict

    from uform.training import __main__ as command
    from uform.training.settings import Result

    def never(*args: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(command, "train", never)
    out = str(tmp_path / "out.safetensors")
    notes, earlier = tmp_path / "notes.json", tmp_path / "run.json"
    notes.write_text('{"my": "notes"}\n')
    earlier.write_text(json.dumps(asdict(Result(out=out, steps=3, seconds=1.0, first_loss=2.0, last_loss=1.0, losses=[2.0, 1.0]))))
    with pytest.raises(SystemExit) as info:
        command.main(["--out", out, "--report", str(notes), "--no-evaluate"])
    said = f"{notes}: exists and is not a report of python -m uform.training; not replaced (--force replaces it)"
    assert info.value.code == 2 and capsys.readouterr().err.endswith(f"python -m uform.training: error: {said}\n")
    assert notes.read_text() == '{"my": "notes"}\n' and not Path(out).exists()
    for argv in (["--report", str(earlier)], ["--report", str(notes), "--force"]):  # the run starts
        with pytest.raises(AssertionError, match="the run started"):
            command.main(["--out", out, *argv, "--no-evaluate"])


def test_bf16_autocast_is_refused_where_pytorchs_bf16_products_are_not_native() -> None:
    """On a CPU where oneDNN has no BF16 products (held to AVX2 here, as an AVX2-only CPU is),
    the option would make the recipe several times slower: the command says so and stops."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-m", "uform.training", "--out", "never.safetensors", "--bf16-autocast"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--bf16-autocast: PyTorch has no native BF16 products on this CPU" in done.stderr
    assert "leave the option out" in done.stderr and not Path("never.safetensors").exists()


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


def test_a_grafted_checkpoint_holds_one_media_tower_of_the_donor_and_the_rest_of_the_host(tmp_path: Path) -> None:
    from uform.core import checkpoint
    from uform.core.errors import CheckpointError
    from uform.core.host import get_host
    from uform.core.safetensors import parse
    from uform.training.graft import graft

    paths = {}
    for seed in (1, 2):
        config, tensors = checkpoint.new(get_host(), "tiny", seed)
        checkpoint.save(paths.setdefault(seed, tmp_path / f"seed{seed}.safetensors"), config, tensors)
    out = tmp_path / "grafted.safetensors"
    assert graft("image", paths[1], paths[2], out) > 0
    donor, host, grafted = (parse(memoryview(p.read_bytes())) for p in (paths[1], paths[2], out))
    assert grafted.metadata == host.metadata and set(grafted.entries) == set(host.entries)
    for name in grafted.entries:
        source = donor if name.startswith("image.") else host
        assert grafted.array(name).tobytes() == source.array(name).tobytes(), name
    assert donor.array("image.patch.weight").tobytes() != host.array("image.patch.weight").tobytes()
    graft("image", paths[2], out, out)  # into itself: written aside, then renamed
    assert out.read_bytes() == paths[2].read_bytes()

    with pytest.raises(ValueError, match="only a media tower can be grafted .* not 'text'"):
        graft("text", paths[1], paths[2], out)
    config, tensors = checkpoint.new(get_host(), "small", 1, ["image"])
    checkpoint.save(other := tmp_path / "small.safetensors", config, tensors)
    with pytest.raises(CheckpointError, match="small.safetensors's image tower is configured otherwise than"):
        graft("image", other, paths[2], out)
    with pytest.raises(CheckpointError, match=r"small.safetensors: holds no audio tower \(towers: image\)"):
        graft("audio", paths[1], other, out)
    (bad := tmp_path / "bad.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="bad.safetensors: not a valid safetensors checkpoint"):
        graft("image", bad, paths[2], out)
    assert out.read_bytes() == paths[2].read_bytes()  # a refused graft leaves the output as it was


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


def test_the_questions_phase_gives_the_first_phases_decoder_bit_for_bit(tmp_path: Path) -> None:
    """``--phase questions``: the first phase's byte decoder trained alone (its steps on every
    ``decoder_every``-th step of the schedule, its questions' own stream) is the decoder the whole
    first phase gives, byte for byte; every other tensor is the checkpoint's, and the choice
    temperatures are fitted afresh (calibrated, not the checkpoint's)."""
    from uform.core.checkpoint import CheckpointFile
    from uform.core.config import ModelConfig
    from uform.training import Settings, train

    common = dict(seed=0, steps=7, batch=4, decoder_batch=6, warmup=2, image_pool=4, video_pool=6, audio_pool=4,
                  calibration_examples=60, evaluate=False, config=tiny_config(), decoder_steps=0, reading_steps=0)  # fmt: skip
    first = tmp_path / "first.safetensors"
    train(Settings(out=str(first), **common), log=lambda line: None)
    other = tmp_path / "other.safetensors"  # towers and decoder of another seed: the phase replaces the decoder alone
    train(Settings(out=str(other), **(common | {"seed": 1})), log=lambda line: None)
    out = tmp_path / "questions.safetensors"
    lines: list[str] = []
    result = train(Settings(out=str(out), phase="questions", start=str(other), **common), log=lines.append)
    assert result.steps == 4 and any(line.startswith("questions step 4/4") for line in lines)  # steps 0, 2, 4, 6 of 7
    made, want, kept = tensors(out), tensors(first), tensors(other)
    decoder = {name for name in made if name.startswith("decoder.")}
    assert decoder and all(made[name] == want[name] for name in decoder)
    assert all(made[name] == kept[name] for name in made if name not in decoder)
    assert any(made[name] != kept[name] for name in decoder)
    with CheckpointFile(out) as f:
        temperatures = ModelConfig.from_metadata(f.metadata).choice_temperatures
    assert tuple(temperatures) == tuple(result.temperatures) and len(temperatures) == 3 and tuple(temperatures) != (1.0, 1.0, 1.0)
    assert lines[-1].startswith("trained, saved and calibrated in ")


def test_the_decoders_draw_is_its_own_and_one_command_makes_the_four_commands_checkpoint(tmp_path: Path) -> None:
    """``--decoder-seed D``: the byte decoder's initialisation and every question it trains on
    come from draw D, the towers, held-out questions and calibration from ``--seed``. The towers
    are those of the run without it, byte for byte, and the whole checkpoint is what the four
    commands that first made the shipped model make (docs/notes/training-history.md, "How the
    shipped checkpoint came to be"): the run, ``--phase questions --seed D``, ``--phase decoder
    --seed D``, and a recalibration on ``--seed``."""
    from uform.core.checkpoint import CheckpointFile
    from uform.core.config import ModelConfig
    from uform.training import Settings, train

    common = dict(seed=0, steps=7, batch=4, decoder_batch=6, warmup=2, image_pool=4, video_pool=6, audio_pool=4, calibration_examples=60,
                  evaluate=False, config=tiny_config(), decoder_steps=3, decoder_phase_batch=6, reading_steps=2)  # fmt: skip
    one = tmp_path / "one.safetensors"
    train(Settings(out=str(one), decoder_seed=1, **common), log=lambda line: None)
    plain = tmp_path / "plain.safetensors"
    train(Settings(out=str(plain), **common), log=lambda line: None)
    made, base = tensors(one), tensors(plain)
    decoder = {name for name in made if name.startswith("decoder.")}
    assert all(made[name] == base[name] for name in made if name not in decoder)
    assert any(made[name] != base[name] for name in decoder)

    drawn = tmp_path / "questions.safetensors"
    train(Settings(out=str(drawn), phase="questions", start=str(plain), **(common | {"seed": 1})), log=lambda line: None)
    staged = tmp_path / "decoder.safetensors"
    train(Settings(out=str(staged), phase="decoder", start=str(drawn), **(common | {"seed": 1})), log=lambda line: None)
    final = tmp_path / "final.safetensors"
    train(Settings(out=str(final), phase="decoder", start=str(staged), **(common | {"decoder_steps": 0, "reading_steps": 0})),
          log=lambda line: None)  # fmt: skip
    assert tensors(final) == made
    with CheckpointFile(one) as a, CheckpointFile(final) as b:
        assert ModelConfig.from_metadata(a.metadata).choice_temperatures == ModelConfig.from_metadata(b.metadata).choice_temperatures
