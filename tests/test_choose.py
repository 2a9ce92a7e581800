"""text_choose: parity with the PyTorch decoder, temperatures and groups, batching, bad input, the tape."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import uform
from uform import Arena, InputError, RowsTape, TextEncodeStats, UnsupportedError
from uform.core import checkpoint
from uform.core.config import ModelConfig
from uform.core.host import get_host
from uform.model import runtime_of

TEMPERATURES = [1.0, 0.02, 5.0]  # group 1 sharpens a tiny random model's small logits, group 2 flattens
TEXTS = [
    "Question: 2 + 2 = ? Answer:", "", "Zürich — 東京?", "is the sky blue? " * 4,  # the last is past context (32)
    "x", "Pick a digit:", "ab" * 16, "The answer is (",
]  # fmt: skip
CHOICES = ["ABCD", "yn", "0123456789", "yn", "AB", "0123456789", "ab", "ABCD"]


def write(path: Path, modalities: list[str], temperatures: Sequence[float] = (1.0,), seed: int = 0) -> Path:
    config, tensors = checkpoint.new(get_host(), "tiny", seed, modalities)
    config = ModelConfig.from_dict(dict(config.raw) | {"choice_temperatures": list(temperatures)})
    checkpoint.save(path, config, tensors)
    return path


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("choose") / "tiny-choose.safetensors", ["choose"], TEMPERATURES, seed=7)


@pytest.fixture(scope="module")
def model(path: Path) -> uform.Model:
    return uform.Model.load_ram(path)


def rows(tape: RowsTape) -> list[np.ndarray]:
    return [np.array(r) for r in tape]


def test_parity_with_reference(path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = uform.Model.load_ram(path, quantization=uform.Scalar.F32)  # the graph against the reference, exactly
    from uform.exporters.reference import ReferenceModel
    from uform.plugins.choose import feeds

    decoder = ReferenceModel.from_checkpoint(path).towers["decoder"]
    texts = [t.encode() for t in TEXTS]
    # the graph's logits against the reference's, on the same feeds (last 32 bytes kept)
    chunks = [t[-32:] for t in texts]
    lengths = np.array([len(c) for c in chunks])
    batch = feeds(chunks, lengths, np.arange(len(chunks)))
    got = runtime_of(model).placement.runners["decoder"].run(["logits"], batch.feeds)[0]
    with torch.no_grad():
        want = decoder.logits(texts).numpy()
        assert np.abs(decoder(torch.from_numpy(batch.feeds["bytes"]), torch.from_numpy(batch.feeds["last"])).numpy() - want).max() == 0
    assert got.shape == (len(texts), 256)
    assert np.abs(got - want).max() < 1e-5, np.abs(got - want).max()
    # text_choose against the reference's choose, in every group
    for group in range(len(TEMPERATURES)):
        tape = model.text_choose(TEXTS, CHOICES, Arena(), temperature_groups=[group] * len(TEXTS))
        with torch.no_grad():
            ref = decoder.choose(texts, [c.encode() for c in CHOICES], [group] * len(TEXTS))
        for mine, theirs in zip(tape, ref):
            np.testing.assert_allclose(mine, theirs.numpy(), atol=2e-5)


def test_rows_shape_order_and_sum(model: uform.Model) -> None:
    tape = model.text_choose(TEXTS, CHOICES, Arena(), temperature_groups=[1] * len(TEXTS))
    assert len(tape) == len(TEXTS)
    assert tape.lengths.tolist() == [len(c) for c in CHOICES]
    assert tape.values.dtype == np.float32 and tape.offsets.dtype == np.int64
    np.testing.assert_allclose([r.sum() for r in tape], 1.0, atol=1e-6)
    assert all((r > 0).all() for r in tape)
    # the order of a row is the order of the choices given
    flipped = model.text_choose(TEXTS, [c[::-1] for c in CHOICES], Arena(), temperature_groups=[1] * len(TEXTS))
    for a, b in zip(tape, flipped):
        np.testing.assert_allclose(a, b[::-1], atol=1e-7)
    # a choice's probability only depends on the other choices through the normaliser
    sub = model.text_choose(TEXTS[:1], ["AB"], Arena(), temperature_groups=[1])[0]
    np.testing.assert_allclose(sub, tape[0][:2] / tape[0][:2].sum(), rtol=1e-5)


def test_temperature_reshapes_rows_exactly(model: uform.Model) -> None:
    base = rows(model.text_choose(TEXTS, CHOICES, Arena()))  # group 0: T = 1
    for group, t in enumerate(TEMPERATURES):
        scaled = rows(model.text_choose(TEXTS, CHOICES, Arena(), temperature_groups=[group] * len(TEXTS)))
        for p1, pt in zip(base, scaled):
            want = p1.astype(np.float64) ** (1 / t)
            np.testing.assert_allclose(pt, want / want.sum(), rtol=1e-4, atol=1e-7)
    sharp, flat = (rows(model.text_choose(TEXTS, CHOICES, Arena(), temperature_groups=[g] * 8)) for g in (1, 2))
    for r0, rs, rf in zip(base, sharp, flat):
        if len(r0) > 1:
            assert rf.max() < r0.max() < rs.max()  # a higher temperature flattens, a lower one sharpens
            assert np.ptp(rf) < np.ptp(r0)


def test_group_selected_per_text(model: uform.Model) -> None:
    groups = [0, 1, 2, 1, 0, 2, 1, 0]
    mixed = rows(model.text_choose(TEXTS, CHOICES, Arena(), temperature_groups=groups))
    alone = {g: rows(model.text_choose(TEXTS, CHOICES, Arena(), temperature_groups=[g] * 8)) for g in range(3)}
    for i, g in enumerate(groups):
        np.testing.assert_array_equal(mixed[i], alone[g][i])
    assert np.array(groups, np.int64).tolist() == groups  # numpy ints are accepted too
    again = rows(model.text_choose(TEXTS, CHOICES, Arena(), temperature_groups=np.array(groups)))
    assert all(np.array_equal(a, b) for a, b in zip(mixed, again))


def test_batching_invariance_truncation_and_stats(model: uform.Model) -> None:
    rng = np.random.default_rng(0)
    many = [bytes(rng.integers(0, 256, int(n)).astype(np.uint8)) for n in rng.integers(0, 80, 150)]
    stats = TextEncodeStats()
    together = rows(model.text_choose(many, "0123", Arena(), stats=stats, temperature_groups=[1] * 150))
    for i in (0, 17, 99, 149):
        alone = model.text_choose([many[i]], ["0123"], Arena(), temperature_groups=[1])[0]
        np.testing.assert_allclose(together[i], alone, atol=2e-6)
    # a text past the context reads like its last 32 bytes
    long = [t for t in many if len(t) > 32][0]
    cut = model.text_choose([long, long[-32:], long[:32]], "0123", Arena(), temperature_groups=[1] * 3)
    np.testing.assert_allclose(cut[0], cut[1], atol=2e-6)
    assert not np.allclose(cut[0], cut[2])
    lengths = np.array([len(t) for t in many])
    assert stats.items == 150 and stats.batches >= 1
    assert stats.tokens == int(np.minimum(lengths, 32).sum())
    assert stats.truncated_items == int((lengths > 32).sum())
    assert stats.truncated_tokens == int(np.maximum(lengths - 32, 0).sum())
    assert stats.seconds_total >= stats.seconds_compute > 0


def test_choice_forms(model: uform.Model) -> None:
    shared = rows(model.text_choose(TEXTS, "yn", Arena()))
    listed = rows(model.text_choose(TEXTS, ["yn"] * 8, Arena()))
    as_bytes = rows(model.text_choose([t.encode() for t in TEXTS], [b"yn"] * 8, Arena()))
    assert all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(shared, listed, as_bytes))
    high = model.text_choose(["ok"], [b"\x00\xff\xc3"], Arena())[0]  # any byte value through bytes
    assert high.shape == (3,) and abs(high.sum() - 1) < 1e-6
    empty = model.text_choose([], "AB", Arena())
    assert len(empty) == 0 and empty.offsets.tolist() == [0]
    one = model.text_choose(["?"], "A", Arena())[0]
    assert one.tolist() == [1.0]


@pytest.mark.parametrize(
    ("choices", "groups", "index", "message"),
    [
        (["AB", "AB", "Aé"], None, 2, "choice 'é' is not a single byte (it is 2 bytes in UTF-8)"),
        (["AB", "ABA", "AB"], None, 1, "choice b'A' appears twice"),
        (["AB", "", "AB"], None, 1, "the choice set is empty"),
        (["AB", ["A", "B"], "AB"], None, 1, "choices must be a str or bytes of single-byte choices"),
        (["AB", "AB"], None, 2, "choices has no entry for this text (choices has 2 entries for 3 texts); give one choice string per text"),
        ("AB", [0, 3, 0], 1, "temperature group 3 is out of range: this model has 3 group(s), 0 … 2"),
        ("AB", [0, 0, -1], 2, "temperature group -1 is out of range"),
        ("AB", np.array([0, 0, 7]), 2, "temperature group 7 is out of range"),
        ("AB", [0, 2**70, 0], 1, "temperature group 1180591620717411303424 is out of range"),
        ("AB", [0, 1], 2, "temperature_groups has 2 entries for 3 texts"),
        ("AB", [0, 1.0], 2, "temperature_groups has no entry for this text (temperature_groups has 2 entries for 3 texts)"),
        ("AB", [0, 1.0, 0], 1, "temperature group must be an int, got float"),
        ("AB", [True, 0, 0], 0, "temperature group must be an int, got bool"),
    ],
)
def test_bad_input_names_the_text(model: uform.Model, choices: object, groups: object, index: int, message: str) -> None:
    arena = Arena()
    first = model.text_choose(["a"], "AB", arena)
    with pytest.raises(InputError, match=f"item {index}: ") as info:
        model.text_choose(["q1", "q2", "q3"], choices, arena, temperature_groups=groups)  # type: ignore[arg-type]
    assert info.value.index == index and message in str(info.value)
    assert arena.generation == 1 and first[0].shape == (2,)  # nothing written: the earlier tape stays readable


@pytest.mark.parametrize(
    ("texts", "choices", "groups", "message"),
    [
        (["q1"], ["AB", "CD"], None, "choices has 2 entries for 1 text: choices[1:] belongs to no text; give one choice string per text, or a single string shared by all"),
        (["q1", "q2", "q3"], "AB", [0, 1, 2, 0], "temperature_groups has 4 entries for 3 texts: temperature_groups[3:] belongs to no text; give one group per text, or None for group 0"),
        (["q1", "q2", "q3"], "AB", [0, 1, 2, "x"], "temperature_groups has 4 entries for 3 texts: temperature_groups[3:] belongs to no text"),
    ],
)
def test_more_entries_than_texts_name_the_extra_entries_not_an_item(
    model: uform.Model, texts: list[str], choices: object, groups: object, message: str
) -> None:
    # it was 'InputError: item 1: choices has 2 entries for 1 texts' for one text: there is no item 1
    arena = Arena()
    first = model.text_choose(["a"], "AB", arena)
    with pytest.raises(ValueError, match="^" + re.escape(message)) as info:
        model.text_choose(texts, choices, arena, temperature_groups=groups)  # type: ignore[arg-type]
    assert not isinstance(info.value, InputError) and "item" not in str(info.value)
    assert arena.generation == 1 and first[0].shape == (2,)  # nothing written


def _released(raw: bytes) -> memoryview:
    view = memoryview(raw)
    view.release()
    return view


def test_a_released_memoryview_as_choices_is_an_error_naming_the_text(model: uform.Model) -> None:
    arena = Arena()
    first = model.text_choose(["a"], "AB", arena)
    released = "the memoryview was released (memoryview.release() or the end of its with block)"
    with pytest.raises(InputError, match="item 1: ") as info:
        model.text_choose(["q1", "q2"], [b"AB", _released(b"AB")], arena)  # type: ignore[list-item]
    assert info.value.index == 1 and released in str(info.value)
    with pytest.raises(InputError, match="item 0: ") as info:
        model.text_choose(["q1", "q2"], _released(b"AB"), arena)  # type: ignore[arg-type]  # one shared by every text
    assert released in str(info.value)
    assert arena.generation == 1 and first[0].shape == (2,)


@pytest.mark.parametrize(
    ("choices", "groups", "message"),
    [
        ({"AB", "ABC"}, None, "choices must be a sequence, got a set, whose order is its own"),
        ({"AB": 0, "ABC": 1}, None, "choices must be a sequence, got a dict: pass list(d.values())"),
        ("AB", {0, 1}, "temperature_groups must be a sequence, got a set, whose order is its own"),
        ("AB", {0: 1, 1: 0}, "temperature_groups must be a sequence, got a dict: pass list(d.values())"),
    ],
)
def test_a_dict_or_set_of_choices_or_groups_is_refused(model: uform.Model, choices: object, groups: object, message: str) -> None:
    with pytest.raises(TypeError) as info:  # a set's order is its own, a dict iterates its keys: rows would answer other choices
        model.text_choose(["q1", "q2"], choices, Arena(), temperature_groups=groups)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_bad_text_and_cancel(model: uform.Model) -> None:
    arena = Arena()
    with pytest.raises(InputError, match="item 1: expected str or bytes, got int"):
        model.text_choose(["a", 5], "AB", arena)  # type: ignore[list-item]
    with pytest.raises(uform.CancelledError):
        model.text_choose(TEXTS, CHOICES, arena, progress=lambda done, total: False)
    seen: list[tuple[int, int]] = []
    model.text_choose(TEXTS, CHOICES, arena, progress=lambda d, t: seen.append((d, t)) and None)
    assert arena.generation == 1 and seen[-1] == (8, 8)
    with pytest.raises(TypeError, match="choices must be a str or bytes shared by all texts, or one per text; got int"):
        model.text_choose(["a"], 5, arena)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="temperature_groups must be a sequence of ints, one per text, or None; got int"):
        model.text_choose(["a"], "AB", arena, temperature_groups=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="arena must be a uform.Arena"):
        model.text_choose(["a"], "AB", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stats must be a TextEncodeStats"):
        model.text_choose(TEXTS, CHOICES, Arena(), stats=uform.EncodeStats())  # type: ignore[arg-type]


def test_tape_round_trips_through_numpy(model: uform.Model) -> None:
    arena = Arena()
    tape = model.text_choose(TEXTS, CHOICES, arena)
    values, offsets = tape.to_numpy()
    assert offsets.tolist() == [0, *np.cumsum([len(c) for c in CHOICES]).tolist()]
    copy = RowsTape.from_numpy(values, offsets)
    assert all(np.array_equal(a, b) for a, b in zip(tape, copy))
    best = [CHOICES[i][int(np.argmax(r))] for i, r in enumerate(copy)]  # how docs/choose.md reads an answer
    assert all(b in c for b, c in zip(best, CHOICES))
    model.text_choose(["again"], "AB", arena)
    with pytest.raises(uform.StaleArenaError):
        tape.values
    assert np.array_equal(copy.values, values)  # the copy outlives the arena's reuse


def test_describe_and_unsupported(tmp_path: Path, model: uform.Model) -> None:
    assert model.describe().choice_temperature_groups == 3
    plain = uform.Model.load_ram(write(tmp_path / "plain.safetensors", ["choose"]))
    assert plain.describe().choice_temperature_groups == 1
    text_only = uform.Model.load_ram(write(tmp_path / "text.safetensors", ["text"]))
    assert text_only.describe().choice_temperature_groups == 0
    with pytest.raises(UnsupportedError, match="text_choose needs the 'decoder' tower"):
        text_only.text_choose(["a"], "AB", Arena())


def test_receivers_and_threads(model: uform.Model) -> None:
    want = rows(model.text_choose(TEXTS, CHOICES, Arena(), temperature_groups=[1] * 8))
    with uform.Executor(1) as one, uform.Executor(2) as two:
        blocking = rows(model.on(one).text_choose(TEXTS, CHOICES, Arena(), temperature_groups=[1] * 8))
        deferred = model.deferred(two).text_choose(TEXTS, CHOICES, Arena(), temperature_groups=[1] * 8).result(timeout=60)
    for a, b, c in zip(want, blocking, rows(deferred)):
        np.testing.assert_allclose(a, b, atol=1e-6)
        np.testing.assert_allclose(a, c, atol=1e-6)


def test_the_pages_first_example_runs_as_written_and_prints_what_it_says(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/choose.md opened with ``Model.load_ram("model.safetensors")``, a file a reader does not
    have (FileNotFoundError), and asked the default model "Is water wet?" and "2 + 2", outside
    everything it knows (0.09, 0.62, 0.29 for A, B, C)."""
    page = (Path(__file__).parents[1] / "docs" / "choose.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/choose.md", "exec"), {"__name__": "choose_md"})
    printed = [float(v) for v in capsys.readouterr().out.strip().strip("[]").split()]
    shown = [float(v) for v in re.search(r"print\(tape\[1\]\)\s+# \[([^\]]*)\]", code)[1].split()]  # type: ignore[index]
    assert len(printed) == len(shown) == 3 and max(range(3), key=lambda i: printed[i]) == 1
    assert printed == pytest.approx(shown, abs=0.005)  # another CPU's kernels round a little differently
