"""``python -m uform.training``'s command line: which options go with which phase, counts, seeds
and files refused before any work (status 2, the reason named, nothing written), and
``--bf16-autocast`` refused where PyTorch has no native BF16 products."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")


def test_the_command_line_takes_the_decoder_phase_with_its_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    from uform.training.__main__ import main

    for argv in (["--out", "x", "--phase", "decoder"], ["--out", "x", "--from", "y.safetensors"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "--from CHECKPOINT goes with --phase decoder" in capsys.readouterr().err


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
