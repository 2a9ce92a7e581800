"""The training recipe's phases from a checkpoint (``--phase decoder``, ``reading``, ``clips``,
``pictures``, ``sounds``, ``questions``; the clip stage; grafting): each trains its part alone,
every other tensor is the checkpoint's byte for byte, and from the first phase's output each
writes what the full recipe writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

from uform.demo import generate as g  # noqa: E402
from uform.demo.media import audio_bytes, image_bytes, video_bytes  # noqa: E402
from tiny_recipe import tiny_config, tensors  # noqa: E402


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
