"""Calibration: NLL temperature fitting, ECE, writing calibrated checkpoints, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import uform
from ckpt import make_checkpoint
from uform import Arena
from uform import calibrate as cal
from uform.cli import main
from uform.core import safetensors

TRUE = [0.05, 0.2]  # the temperatures the labels are drawn at, per group


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("calibrate") / "tiny-choose.safetensors", "tiny", 11, ["choose"])


@pytest.fixture(scope="module")
def examples(path: Path) -> list[cal.Example]:
    rng = np.random.default_rng(3)
    n = 1600
    texts = [bytes(rng.integers(32, 127, int(k)).astype(np.uint8)).decode() for k in rng.integers(0, 48, n)]
    choices = [("ABCD", "yn", "0123456789")[i % 3] for i in range(n)]
    return cal.sample_examples(uform.Model.load_ram(path), texts, choices, [i % 2 for i in range(n)], TRUE, seed=5)


def ragged(rows: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    return np.concatenate([np.asarray(r, np.float64) for r in rows]), offsets


def test_fit_recovers_known_temperatures() -> None:
    rng = np.random.default_rng(0)
    n, k = 4000, 4
    logits = rng.normal(0, 2, (n, k))
    groups = np.arange(n) % 3
    true = np.array([0.25, 1.0, 3.0])
    p = np.exp(logits / true[groups, None])
    p /= p.sum(1, keepdims=True)
    answers = (p.cumsum(1) < rng.random((n, 1))).sum(1)
    fitted, counts = cal.fit_temperatures(logits.reshape(-1), np.arange(n + 1) * k, answers, groups, 4)
    assert counts.tolist() == [1334, 1333, 1333, 0]
    np.testing.assert_allclose(fitted[:3], true, rtol=0.15)
    assert fitted[3] == 1.0  # a group without examples keeps 1
    # the fit is the NLL minimum: nudging any temperature makes it worse
    z, o = logits.reshape(-1), np.arange(n + 1) * k
    best = cal.nll(z, o, answers, fitted[groups])
    for factor in (0.9, 1.1):
        assert cal.nll(z, o, answers, (fitted * factor)[groups]) > best


def test_fit_clamps_to_format_bounds() -> None:
    z, o = ragged([[0.0, 1.0]] * 50)
    right = np.ones(50, np.int64)
    fitted, _ = cal.fit_temperatures(z, o, right, np.zeros(50, np.int64), 1)  # always right: T → 0
    assert fitted[0] == pytest.approx(1e-3, rel=1e-9)
    fitted, _ = cal.fit_temperatures(z, o, 1 - right, np.zeros(50, np.int64), 1)  # always the lower logit: T → ∞
    assert fitted[0] == pytest.approx(1e3, rel=1e-9)
    single, single_offsets = ragged([[0.3]] * 5)  # one choice each: nothing to learn
    assert cal.fit_temperatures(single, single_offsets, np.zeros(5, np.int64), np.zeros(5, np.int64), 1)[0][0] == 1.0
    half = np.arange(50) % 2
    fitted, _ = cal.fit_temperatures(z, o, half, np.zeros(50, np.int64), 1)  # a coin flip: T → ∞
    assert fitted[0] == pytest.approx(1e3, rel=1e-9)


def test_ece_by_hand() -> None:
    probs, offsets = ragged([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.5, 0.5]])
    answers = np.array([0, 1, 1, 1])
    # confidences 0.9, 0.8, 0.7, 0.5 (a tie takes the first choice); correct 1, 0, 1, 0; 10 bins: one each
    assert cal.ece(probs, offsets, answers, bins=10) == pytest.approx((0.1 + 0.8 + 0.3 + 0.5) / 4)
    assert cal.ece(probs, offsets, answers, bins=1) == pytest.approx(abs(0.5 - 0.725))
    assert cal.top_choice(probs, offsets).tolist() == [0, 0, 1, 0]


def test_ece_takes_any_number_of_bins_in_memory_of_the_rows() -> None:
    """A count per bin took 8 bytes a bin (160 MB for 10**7 bins; --bins 1000000000 took 7.9 GB
    and 55 s), and 2**70 bins raised OverflowError (a traceback from uform calibrate)."""
    import tracemalloc

    probs, offsets = ragged([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.5, 0.5]])
    answers = np.array([0, 1, 1, 1])
    one_each = (0.1 + 0.8 + 0.3 + 0.5) / 4
    tracemalloc.start()
    try:
        assert cal.ece(probs, offsets, answers, bins=10**7) == pytest.approx(one_each)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert cal.ece(probs, offsets, answers, bins=2**70) == pytest.approx(one_each)


def test_calibrate_writes_a_checkpoint(path: Path, examples: list[cal.Example], tmp_path: Path) -> None:
    out = tmp_path / "calibrated.safetensors"
    report = cal.calibrate(path, examples, out, holdout=0.25, seed=1)
    print(cal.summary(report))
    assert report.fit_examples == 1200 and report.heldout_examples == 400
    assert report.previous == (1.0,) and len(report.temperatures) == 2
    np.testing.assert_allclose(report.temperatures, TRUE, rtol=0.2)
    assert report.ece_after < report.ece_before / 3 and report.nll_after < report.nll_before
    model = uform.Model.load_ram(out)
    assert model.describe().choice_temperature_groups == 2
    # same tensors byte for byte, only the config changed
    before = safetensors.parse(memoryview(path.read_bytes()))
    after = safetensors.parse(memoryview(out.read_bytes()))
    assert before.entries.keys() == after.entries.keys()
    assert all(np.array_equal(before.array(n).view(np.uint16), after.array(n).view(np.uint16)) for n in before.entries)
    config = json.loads(after.metadata["uform"])
    assert config["choice_temperatures"] == list(report.temperatures)
    # group 1 of the calibrated model uses its temperature
    base = uform.Model.load_ram(path).text_choose(["Answer:"], "ABCD", Arena())[0].astype(np.float64)
    got = model.text_choose(["Answer:"], "ABCD", Arena(), temperature_groups=[1])[0]
    want = base ** (1 / report.temperatures[1])
    np.testing.assert_allclose(got, want / want.sum(), rtol=1e-3)


def test_cli_and_examples_file(path: Path, examples: list[cal.Example], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [{"text": e.text, "choices": e.choices, "answer": e.choices[e.answer], "group": e.group} for e in examples[:400]]
    lines[1]["answer"] = examples[1].answer  # an index is accepted too
    (tmp_path / "ex.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert cal.read_examples(tmp_path / "ex.jsonl") == examples[:400]
    out = tmp_path / "new.safetensors"
    assert main(["calibrate", str(path), str(tmp_path / "ex.jsonl"), "--out", str(out), "--holdout", "0.5"]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}: choice_temperatures [" in text and "ECE (15 bins)  before" in text
    assert uform.Model.load_ram(out).describe().choice_temperature_groups == 2
    # recalibrating the calibrated checkpoint in place keeps the fit (logits come back through T0 log p)
    report = cal.calibrate(out, cal.read_examples(tmp_path / "ex.jsonl"), out, holdout=0.5)
    first = json.loads(safetensors.parse(memoryview(out.read_bytes())).metadata["uform"])["choice_temperatures"]
    np.testing.assert_allclose(report.previous, report.temperatures, rtol=1e-4)
    assert first == list(report.temperatures)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "ex.jsonl:2: not JSON"),
        ('{"text": "q", "choices": "AB", "answer": "C"}', "ex.jsonl:2: answer 'C' is not one of the choices 'AB'"),
        ('{"text": "q", "choices": "", "answer": 0}', "ex.jsonl:2: choices must be a non-empty string"),
        ('{"text": 3, "choices": "AB", "answer": 0}', "ex.jsonl:2: text must be a string"),
        ('{"text": "q", "choices": "AB", "answer": 0, "group": -1}', "ex.jsonl:2: group must be an integer from 0 to 4095"),
        ('{"text": "q", "choices": "AB", "answer": 0, "group": 100000000000}', "ex.jsonl:2: group must be an integer from 0 to 4095"),
        ('{"text": "q", "choices": "ABA", "answer": 0}', "ex.jsonl:2: choice 'A' appears twice in 'ABA'"),
        ('{"text": "q", "choices": "A\u00e9", "answer": 0}', "ex.jsonl:2: choice 'é' is not a single byte: choices must be ASCII"),
        ('{"text": "q\\ud800", "choices": "AB", "answer": 0}', "ex.jsonl:2: text is not encodable as UTF-8"),
    ],
)
def test_bad_examples_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "ex.jsonl").write_text('{"text": "q", "choices": "AB", "answer": "A"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        cal.read_examples(tmp_path / "ex.jsonl")


def test_a_bad_line_after_a_blank_one_is_named_by_its_line(path: Path, tmp_path: Path) -> None:
    (tmp_path / "ex.jsonl").write_text('{"text": "q", "choices": "AB", "answer": "A"}\n\n{"text": "q", "choices": "AA", "answer": 0}\n')
    with pytest.raises(ValueError, match="ex.jsonl:3: choice 'A' appears twice in 'AA'"):  # it was 'example 1: ...'
        cal.calibrate(path, tmp_path / "ex.jsonl")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (cal.Example("q", "AB", 2), "example 3: answer 2 is not the index of one of its 2 choices 'AB'"),
        (cal.Example("q", "AB", 5), "example 3: answer 5 is not the index of one of its 2 choices 'AB'"),
        (cal.Example("q", b"AB", -1), "example 3: answer -1 is not the index of one of its 2 choices b'AB'"),
        (cal.Example("q", "AB", 0, -1), "example 3: group must be an integer from 0 to 4095 (uform.calibrate.MAX_GROUPS), got -1"),
        (cal.Example("q", "AB", 0, 10**11), "example 3: group must be an integer from 0 to 4095 (uform.calibrate.MAX_GROUPS), got 100000000000"),
    ],
)
def test_examples_given_as_objects_are_checked_by_name(path: Path, bad: cal.Example, message: str) -> None:
    # an answer past its row read another row's logit (a wrong fit, or an IndexError), a huge group allocated a temperature each
    fine = [cal.Example("q1", "AB", 0), cal.Example("q2", "AB", 1), cal.Example("q3", "yn", 1)]
    with pytest.raises(ValueError) as info:
        cal.calibrate(path, [*fine, bad])
    assert str(info.value) == message


def test_examples_may_be_any_iterable_and_seed_groups_are_bounded(path: Path) -> None:
    examples = [cal.Example(f"q{i}", "AB", i % 2) for i in range(8)]
    assert cal.calibrate(path, iter(examples)) == cal.calibrate(path, examples)
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        cal.calibrate(path, examples, seed=-1)
    with pytest.raises(ValueError, match=r"groups must be at most 4096 \(uform.calibrate.MAX_GROUPS\), got 4097"):
        cal.calibrate(path, examples, groups=4097)


def test_bad_choices_in_examples_and_groups(path: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="example 1: choice b'A' appears twice"):
        cal.calibrate(path, [cal.Example("q", "AB", 0), cal.Example("q", "AAB", 0)])
    with pytest.raises(ValueError, match="names group 3, beyond the 2 groups"):
        cal.calibrate(path, [cal.Example("q", "AB", 0, 3)], groups=2)
    with pytest.raises(ValueError, match="no examples to calibrate on"):
        cal.calibrate(path, [])
    with pytest.raises(ValueError, match=r"holdout must be in \[0, 1\)"):
        cal.calibrate(path, [cal.Example("q", "AB", 0)], holdout=1.0)
    for name, value in (("bins", 0), ("bins", -3), ("groups", 0)):  # numpy's own bincount errors, before
        with pytest.raises(ValueError, match=rf"{name} must be an integer of 1 or more, got {value}"):
            cal.calibrate(path, [cal.Example("q", "AB", 0)], **{name: value})
    assert main(["calibrate", str(path), str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x")]) == 2


def test_a_group_of_one_choice_examples_keeps_its_temperature(path: Path, examples: list[cal.Example], tmp_path: Path) -> None:
    """A one-choice example has p = 1 at every temperature: such examples alone reset the group's
    temperature to 1.0 (1.9664 of the shipped model's group 0 became 1, no note said why)."""
    first = tmp_path / "first.safetensors"
    fitted = cal.calibrate(path, examples, first, seed=1).temperatures
    assert fitted[0] != 1.0
    report = cal.calibrate(first, [cal.Example("q", "A", 0, 0), cal.Example("r", b"\x00", 0, 0), cal.Example("s", "AB", 1, 1)], holdout=0)
    assert report.fit_counts == (2, 1)
    assert report.temperatures[0] == fitted[0] and report.temperatures[1] != fitted[1]  # group 1's two choices are fitted
    assert report.notes[-1] == f"group 0's 2 fitting examples each have one choice, which no temperature changes; it keeps temperature {fitted[0]:g}"


def test_an_examples_path_that_is_not_a_regular_file_is_refused_by_name(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO without a writer blocked the open forever; /dev/zero was read as one endless line
    (memory grew until killed); /dev/null read as 'no examples'; a folder gave Python's [Errno 21]."""
    fifo = tmp_path / "examples.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "out.safetensors"
    run = subprocess.run([sys.executable, "-m", "uform.cli", "calibrate", str(path), str(fifo), "--out", str(out)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (run.returncode, run.stderr) == (2, f"uform: error: {fifo}: is a FIFO, not a file of examples; give a JSON lines file\n")
    for where, kind in (("/dev/zero", "a device"), ("/dev/null", "a device"), (str(tmp_path), "a folder")):
        assert main(["calibrate", str(path), where, "--out", str(out), "-q"]) == 2
        assert capsys.readouterr().err == f"uform: error: {where}: is {kind}, not a file of examples; give a JSON lines file\n"
    assert not out.exists()


def test_groups_without_examples_are_one_note_a_run(path: Path) -> None:
    """One example of group 4095 printed 4095 notes (4100 lines, 335 kB of --json), one per empty group."""
    report = cal.calibrate(path, [cal.Example("q", "AB", 0, 4095)], holdout=0)
    assert report.notes == ["holdout is 0: ECE and NLL are measured on the fitting examples",
                            "groups 0 to 4094 had no fitting examples and keep temperature 1"]  # fmt: skip
    report = cal.calibrate(path, [cal.Example("q", "AB", 0, 2)], holdout=0, groups=4)
    assert report.notes[1:] == ["groups 0 to 1 had no fitting examples and keep temperature 1", "group 3 had no fitting examples and keeps temperature 1"]


def test_a_holdout_too_small_to_hold_any_example_out_says_so(path: Path) -> None:
    """--holdout 0.25 of 2 examples held none out and the note said 'holdout is 0', the opposite of
    what was asked (docs/choose.md's own two examples, run as the page shows them)."""
    examples = [cal.Example("2 + 2 = ? A) 3 B) 4 C) 5. Answer:", "ABC", 1, 0), cal.Example("Is water wet? Answer y or n:", "yn", 0, 0)]
    report = cal.calibrate(path, examples, holdout=0.25)
    assert (report.fit_examples, report.heldout_examples) == (2, 2)
    assert report.notes[0] == "holdout 0.25 of 2 examples holds none out: ECE and NLL are measured on the fitting examples"
    assert cal.calibrate(path, examples, holdout=0).notes[0] == "holdout is 0: ECE and NLL are measured on the fitting examples"
