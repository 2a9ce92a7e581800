"""text_encode: parity with the PyTorch reference, batching, truncation, outputs and calls."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest

import uform
from ckpt import make_checkpoint
from uform import Arena, Outputs, Scalar

TEXTS = [
    "a cat", "", "Zürich — 東京", "the quick brown fox jumps over the lazy dog " * 3,
    "x", "a dog", "ab" * 15, "a cat sat on the mat",
]  # fmt: skip


def reference(path: Path, texts: list[bytes]) -> tuple[np.ndarray, list[np.ndarray]]:
    torch = pytest.importorskip("torch")
    from uform.exporters.reference import ReferenceModel

    ref = ReferenceModel.from_checkpoint(path)
    with torch.no_grad():
        emb, tokens = ref.towers["text"].encode(texts)
    return emb.numpy(), [t.numpy() for t in tokens]


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_parity_with_reference(preset: str, tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / f"{preset}.safetensors", preset, 3, ["text"])
    model = uform.Model.load_ram(path, quantization=Scalar.F32)  # the graph against the reference, exactly
    encoded_texts = [t.encode() for t in TEXTS]
    enc = model.text_encode(encoded_texts, Arena(), outputs=Outputs.EMBEDDINGS | Outputs.TOKENS)
    want, want_tokens = reference(path, encoded_texts)
    got = enc.embeddings
    cosine = np.sum(got * want, axis=1)
    print(f"{preset}: max abs error {np.abs(got - want).max():.2e}, min cosine {cosine.min():.7f}")
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
    assert cosine.min() > 0.99999
    assert enc.tokens is not None and len(enc.tokens) == len(TEXTS)
    for i, row in enumerate(enc.tokens):
        assert row.shape == (min(len(encoded_texts[i]), 32 if preset == "tiny" else 128), model.describe().token_width)
        np.testing.assert_allclose(row, want_tokens[i], rtol=1e-3, atol=1e-5)


def test_embeddings_are_unit_rows_and_str_equals_bytes(tiny_model: uform.Model) -> None:
    a = np.array(tiny_model.text_encode(TEXTS, Arena()).embeddings)
    b = np.array(tiny_model.text_encode([t.encode() for t in TEXTS], Arena()).embeddings)
    assert a.shape == (len(TEXTS), 32) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1, rtol=1e-5)
    assert np.array_equal(a, b)


def test_batching_invariance(tiny_model: uform.Model) -> None:
    rng = np.random.default_rng(0)
    texts = [bytes(rng.integers(32, 127, rng.integers(0, 40))) for _ in range(63)] + [b"the probe text"]
    together = np.array(tiny_model.text_encode(texts, Arena()).embeddings)
    alone = np.array(tiny_model.text_encode([b"the probe text"], Arena()).embeddings)
    np.testing.assert_allclose(together[-1], alone[0], atol=2e-6)


def test_determinism_across_loads(tiny_text: Path, tiny_model: uform.Model) -> None:
    again = uform.Model.load_ram(tiny_text)
    assert np.array_equal(again.text_encode(TEXTS, Arena()).embeddings, tiny_model.text_encode(TEXTS, Arena()).embeddings)


def test_truncation_at_context_is_counted(tiny_model: uform.Model) -> None:
    stats = uform.TextEncodeStats()
    long = "y" * 100
    enc = tiny_model.text_encode([long, "y" * 32, "short"], Arena(), outputs=Outputs.TOKENS | Outputs.EMBEDDINGS, stats=stats)
    assert np.array_equal(enc.embeddings[0], enc.embeddings[1])  # the first 32 bytes are all that count
    assert enc.tokens is not None and list(enc.tokens.lengths) == [32, 32, 5]
    assert (stats.items, stats.tokens, stats.truncated_items, stats.truncated_tokens) == (3, 69, 1, 68)
    assert stats.seconds_compute > 0 and stats.seconds_total >= stats.seconds_compute
    tiny_model.text_encode(["ab"], Arena(), stats=stats)
    assert stats.items == 4 and stats.tokens == 71  # stats add up across calls


def test_item_stats_keep_each_texts_tokens_in_call_order(tiny_model: uform.Model) -> None:
    """TextItemStats: each text's bytes encoded (cut at the context), appended call after call;
    ``add`` appends another's, ``reset`` empties it."""
    stats = uform.TextItemStats()
    tiny_model.text_encode(["y" * 100, "short"], Arena(), stats=stats)
    tiny_model.text_encode([b"ab"], Arena(), stats=stats)
    assert stats.item_tokens == [32, 5, 2] and stats.tokens == 39 and stats.items == 3
    total = uform.TextItemStats()
    total.add(stats)
    total.add(stats)
    assert total.item_tokens == [32, 5, 2, 32, 5, 2] and total.tokens == 78
    stats.reset()
    assert stats.item_tokens == [] and stats.tokens == 0


def test_length_sorted_batches_waste_little_padding() -> None:
    from uform.plugins.text import plan

    lengths = np.array([5, 30, 6, 29, 7, 31] * 50)
    batches = plan(lengths, max_rows=64)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    padding = sum(len(b) * lengths[b].max() - lengths[b].sum() for b in batches)
    assert padding <= 2 * len(lengths)  # neighbours in length share a batch
    assert all(len(b) <= 64 for b in batches)


def ordinary_sentences(n: int) -> np.ndarray:
    """Byte lengths of ``n`` sentences of 6-24 words (30-150 bytes), as benchmarks/text.py makes them."""
    words = "the a cat dog sat on mat market stock price rose fell sharply quietly over under river city night morning bright".split()
    rng = np.random.default_rng(0)
    return np.array([len(" ".join(rng.choice(words, rng.integers(6, 24)))) for _ in range(n)])


def cost(lengths: np.ndarray, batches: list[np.ndarray], run_tokens: int) -> int:
    return sum(len(b) * (int(lengths[b].max()) + 1) + run_tokens for b in batches)


@pytest.mark.parametrize("seed", range(20))
def test_batches_are_the_cheapest_buckets_of_neighbours(seed: int) -> None:
    """Against every way of cutting the sorted texts: padded tokens plus a run's cost, least."""
    import itertools

    from uform.plugins.text import plan

    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 60, int(rng.integers(1, 11)))
    max_rows, budget, run_tokens = int(rng.integers(1, 6)), int(rng.integers(60, 200)), int(rng.integers(0, 40))
    batches = plan(lengths, max_rows, budget, run_tokens)
    order = np.argsort(lengths, kind="stable")
    assert np.array_equal(np.concatenate(batches), order)
    n, least = len(order), None
    for k in range(n):
        for cut in itertools.combinations(range(1, n), k):
            parts = [order[a:b] for a, b in zip((0, *cut), (*cut, n))]
            if all(len(p) <= max_rows and (len(p) == 1 or len(p) * (lengths[p].max() + 1) <= budget) for p in parts):
                c = cost(lengths, parts, run_tokens)
                least = c if least is None else min(least, c)
    assert all(len(b) <= max_rows and (len(b) == 1 or len(b) * (lengths[b].max() + 1) <= budget) for b in batches)
    assert cost(lengths, batches, run_tokens) == least


def test_ordinary_sentences_are_cut_where_padding_costs_more_than_a_run() -> None:
    """64 sentences of 30-150 bytes: the old per-neighbour rule cut them into 10 batches with
    271 padding tokens (12 of ~5 rows in the issue's run); a GPU placement (batch_scale 4)
    makes fewer, fuller ones."""
    from uform.plugins.text import RUN_TOKENS, plan

    lengths = ordinary_sentences(64)

    def shape(lengths: np.ndarray, *bounds: int) -> tuple[list[int], int]:
        batches = plan(lengths, *bounds)
        return [len(b) for b in batches], sum(len(b) * int(lengths[b].max()) - int(lengths[b].sum()) for b in batches)

    assert shape(lengths) == ([5, 6, 3, 7, 4, 7, 7, 10, 8, 7], 197)
    assert shape(lengths, 4 * 64, 4 * 16384, 4 * RUN_TOKENS) == ([11, 11, 12, 17, 13], 445)
    assert shape(np.minimum(lengths, 32)) == ([64], 13)  # cut at the tiny preset's context: one batch


def test_empty_call(tiny_model: uform.Model) -> None:
    enc = tiny_model.text_encode([], Arena(), outputs=Outputs.EMBEDDINGS | Outputs.TOKENS)
    assert enc.embeddings.shape == (0, 32) and len(enc) == 0
    assert enc.tokens is not None and len(enc.tokens) == 0
    blank = tiny_model.text_encode(["", ""], Arena(), outputs=Outputs.EMBEDDINGS | Outputs.TOKENS)
    assert blank.embeddings.shape == (2, 32) and blank.tokens is not None
    assert list(blank.tokens.lengths) == [0, 0] and blank.tokens.values.shape == (0, 16)


@pytest.mark.parametrize(
    ("texts", "error", "pattern"),
    [
        ("just a string", TypeError, "got a single str; wrap it in a list"),
        ({"id-1": "a red circle"}, TypeError, r"texts must be a sequence, got a dict: pass list\(d.values\(\)\)"),  # embedded "id-1" before
        ({"b", "a"}, TypeError, r"texts must be a sequence, got a set, whose order is its own"),
        (["fine", 42], uform.InputError, "item 1: expected str or bytes, got int"),
        (["fine", "bad \ud800 surrogate"], uform.InputError, "item 1: text is not encodable as UTF-8"),
    ],
)
def test_bad_texts(tiny_model: uform.Model, texts: object, error: type, pattern: str) -> None:
    arena = Arena()
    kept = tiny_model.text_encode(["keep me"], arena)
    before = np.array(kept.embeddings)
    with pytest.raises(error, match=pattern):
        tiny_model.text_encode(texts, arena)  # type: ignore[arg-type]
    assert np.array_equal(kept.embeddings, before)  # nothing was written, the old output is live


def test_bad_arguments(tiny_model: uform.Model) -> None:
    with pytest.raises(TypeError, match="arena must be a uform.Arena"):
        tiny_model.text_encode(["a"], None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outputs_scalar must be one of"):
        tiny_model.text_encode(["a"], Arena(), outputs_scalar="f8")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stats must be a TextEncodeStats"):
        tiny_model.text_encode(["a"], Arena(), stats=uform.EncodeStats())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="progress_steps must be a non-negative integer"):
        tiny_model.text_encode(["a"], Arena(), progress_steps=-1)


def test_tokens_need_a_token_head(tmp_path: Path) -> None:
    import json

    from uform.core import checkpoint, config
    from uform.core.host import get_host

    cfg, tensors = checkpoint.new(get_host(), "tiny", 0, ["text"])
    raw = json.loads(json.dumps(cfg.raw))
    raw["towers"]["text"]["token_width"] = 0
    del tensors["text.token_head.weight"]
    checkpoint.save(tmp_path / "headless.safetensors", config.ModelConfig.from_dict(raw), tensors)
    model = uform.Model.load_ram(tmp_path / "headless.safetensors")
    assert model.describe().token_width == 0
    with pytest.raises(uform.UnsupportedError, match="no token head"):
        model.text_encode(["a"], Arena(), outputs=Outputs.TOKENS)


@pytest.mark.parametrize("scalar", list(Scalar))
def test_output_scalars_compare_as_documented(tiny_model: uform.Model, scalar: Scalar) -> None:
    exact = np.array(tiny_model.text_encode(TEXTS, Arena()).embeddings)
    cos = exact @ exact.T
    enc = tiny_model.text_encode(TEXTS, Arena(), outputs_scalar=scalar, outputs=Outputs.EMBEDDINGS | Outputs.TOKENS)
    e = enc.embeddings
    if scalar is Scalar.B1:
        assert e.shape == (len(TEXTS), 4) and e.dtype == np.uint8
        bits = np.unpackbits(e, axis=1)
        assert np.array_equal(bits, (exact > 0).astype(np.uint8))
        hamming = np.count_nonzero(bits[:, None, :] != bits[None, :, :], axis=2)
        approx = np.cos(np.pi * hamming / 32)
        assert np.corrcoef(approx.ravel(), cos.ravel())[0, 1] > 0.7
    elif scalar is Scalar.I8:
        assert e.dtype == np.int8 and enc.embedding_scales is not None
        approx = (e.astype(np.float32) * enc.embedding_scales[:, None]) @ (e.astype(np.float32) * enc.embedding_scales[:, None]).T
        np.testing.assert_allclose(approx, cos, atol=0.03)
        assert np.abs(e).max() == 127
    else:
        assert enc.embedding_scales is None
        wide = e.astype(np.float32)
        tolerance = {Scalar.F32: 1e-6, Scalar.F16: 2e-3, Scalar.BF16: 2e-2, Scalar.E4M3: 0.15, Scalar.E5M2: 0.3}[scalar]
        np.testing.assert_allclose(wide @ wide.T, cos, atol=tolerance)
    assert enc.tokens is not None and enc.tokens.values.dtype == e.dtype


def test_stale_arena_raises_never_returns_overwritten_data(tiny_model: uform.Model) -> None:
    arena = Arena()
    first = tiny_model.text_encode(["first"], arena, outputs=Outputs.EMBEDDINGS | Outputs.TOKENS)
    tokens = first.tokens
    _ = first.embeddings
    tiny_model.text_encode(["second"], arena)
    with pytest.raises(uform.StaleArenaError, match="reused by a later call"):
        _ = first.embeddings
    with pytest.raises(uform.StaleArenaError):
        _ = tokens.values if tokens is not None else None
    assert arena.generation == 2


def test_outputs_are_read_only_views(tiny_model: uform.Model) -> None:
    enc = tiny_model.text_encode(["a"], Arena())
    with pytest.raises(ValueError, match="read-only"):
        enc.embeddings[0, 0] = 1.0


def test_progress_is_called_at_each_step_passed_for_any_count_of_steps(tiny_model: uform.Model) -> None:
    from uform.core.progress import Progress

    seen: list[tuple[int, int]] = []
    tracker = Progress(lambda d, t: seen.append((d, t)), 4, 300)
    for _ in range(5):
        tracker.advance(64)  # 64, 128, 192, 256, 320: the marks 75, 150, 225 and 300 passed at 128, 192, 256, 320
    assert seen == [(128, 300), (192, 300), (256, 300), (320, 300)]
    # More steps than items: every advance reports; 10**30 steps looped over each one (a hang).
    seen.clear()
    tiny_model.text_encode(["a", "bb", "ccc"], Arena(), progress=lambda d, t: seen.append((d, t)), progress_steps=10**30)
    assert seen[-1] == (3, 3) and len(seen) <= 3
    with pytest.raises(ValueError, match="progress_steps must be a non-negative integer, got True"):
        tiny_model.text_encode(["a"], Arena(), progress_steps=True)


def test_progress_and_cancellation_write_nothing(tiny_model: uform.Model) -> None:
    texts = [f"text number {i}" * (i % 5 + 1) for i in range(300)]
    seen: list[tuple[int, int]] = []
    tiny_model.text_encode(texts, Arena(), progress=lambda d, t: seen.append((d, t)), progress_steps=4)
    assert seen[-1] == (300, 300) and 2 <= len(seen) <= 5
    arena = Arena()
    kept = tiny_model.text_encode(["keep"], arena)
    before = np.array(kept.embeddings)
    calls = []

    def cancel(done: int, total: int) -> bool:
        calls.append(done)
        return done < 100

    with pytest.raises(uform.CancelledError, match="nothing was written"):
        tiny_model.text_encode(texts, arena, progress=cancel)
    assert np.array_equal(kept.embeddings, before) and arena.generation == 1


def test_concurrent_calls_match_single_threaded(tiny_model: uform.Model) -> None:
    rng = np.random.default_rng(1)
    jobs = [[bytes(rng.integers(97, 123, rng.integers(1, 40))) for _ in range(rng.integers(1, 20))] for _ in range(48)]
    expected = [np.array(tiny_model.text_encode(job, Arena()).embeddings) for job in jobs]
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        arena = Arena()
        try:
            for i in range(k, len(jobs), 8):
                results[i] = np.array(tiny_model.text_encode(jobs[i], arena).embeddings)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == len(jobs)
    for i, want in enumerate(expected):
        np.testing.assert_allclose(results[i], want, atol=2e-6)


def test_one_arena_two_calls_at_once_is_refused(tiny_model: uform.Model) -> None:
    arena = Arena()
    entered, release = threading.Event(), threading.Event()

    def slow(done: int, total: int) -> None:
        entered.set()
        release.wait(10)

    t = threading.Thread(target=lambda: tiny_model.text_encode(["a"] * 10, arena, progress=slow))
    t.start()
    entered.wait(10)
    try:
        with pytest.raises(uform.ArenaBusyError, match="another call"):
            tiny_model.text_encode(["b"], arena)
    finally:
        release.set()
        t.join()


def test_on_and_deferred_run_on_the_executor(tiny_model: uform.Model) -> None:
    want = np.array(tiny_model.text_encode(TEXTS, Arena()).embeddings)
    with uform.Executor(threads=1) as ex:
        got = tiny_model.on(ex).text_encode(TEXTS, Arena())
        assert np.array_equal(got.embeddings, want)
        pending = tiny_model.deferred(ex).text_encode(TEXTS, Arena())
        assert isinstance(pending, uform.Deferred)
        assert np.array_equal(pending.result(timeout=60).embeddings, want)
        assert pending.done() and pending.exception() is None
        failing = tiny_model.deferred(ex).text_encode([1], Arena())
        assert isinstance(failing.exception(timeout=60), uform.InputError)
        with pytest.raises(uform.InputError):
            failing.result()
        with pytest.raises(AttributeError, match="not a Model verb"):
            tiny_model.on(ex).load_ram  # noqa: B018
    # closed: its threads joined; used again, it starts them anew
    assert np.array_equal(tiny_model.deferred(ex).text_encode(TEXTS, Arena()).result(timeout=60).embeddings, want)
    ex.close()
    for name, bad in (("threads", 0), ("threads", True), ("threads", 1025), ("calls", 0), ("calls", 10**6)):
        with pytest.raises(ValueError, match=rf"Executor {name} must be an integer from 1 to 1024, got {bad!r}"):
            uform.Executor(**{name: bad})  # 4,096 threads made a load take seconds on 2 cores and its close hang
    assert uform.Executor(threads=1024, calls=1024).threads == 1024


def test_describe(tiny_text: Path) -> None:
    d = uform.Model.load_ram(tiny_text, quantization=Scalar.F32).describe()
    assert isinstance(d, tuple) and len(d) == 8
    assert d._fields == ("dimensions", "context", "quantization", "memory_usage", "cpu_class", "gpu_class", "token_width", "choice_temperature_groups")
    assert (d.dimensions, d.context, d.quantization, d.gpu_class, d.token_width, d.choice_temperature_groups) == (32, 32, Scalar.F32, None, 16, 0)
    assert d.cpu_class is not None
    assert d.memory_usage == 88704 * 4  # one float32 copy of every weight


def test_pinned_cpu_class(tiny_text: Path) -> None:
    from uform.plugins.cpu import machine_classes

    runnable = machine_classes()
    assert uform.Model.load_ram(tiny_text, cpu_class=runnable[0]).describe().cpu_class == runnable[0]
    beyond = next((c for c in uform.CPUClass if c not in runnable and c.value.startswith(runnable[0].value[:3])), None)
    if beyond is None:
        pytest.skip(f"this machine runs every class of its architecture (best: {runnable[-1].value})")
    # Class names hold regex metacharacters ('x86-64-v4+vnni+bf16'): match them literally.
    message = f"cpu_class {beyond.value} is beyond this machine; the best class it runs is {runnable[-1].value}"
    with pytest.raises(uform.UnsupportedError, match=re.escape(message)):
        uform.Model.load_ram(tiny_text, cpu_class=beyond)


def test_matryoshka_prefix_is_an_embedding(tiny_model: uform.Model) -> None:
    e = np.array(tiny_model.text_encode(["a cat", "a cat sat"], Arena()).embeddings)
    prefix = e[:, :16] / np.linalg.norm(e[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(np.linalg.norm(prefix, axis=1), 1, rtol=1e-6)
