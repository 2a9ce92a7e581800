"""Call lifecycle: nothing a call started outlives it, and concurrent calls do not queue."""

from __future__ import annotations

import gc
import io
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import uform
from uform.core.pipeline import Batch, run_batches
from uform.core.progress import Progress
from uform.core.runtime import Call
from uform.model import runtime_of

WAIT = 10.0  # seconds a test waits for an event that must come; never reached when it passes


class Runner:
    """A runner answering one row per item, or raising on the batch numbered ``fail_at``."""

    def __init__(self, fail_at: int | None = None, before_failing: Callable[[], None] = lambda: None) -> None:
        self.fail_at, self.before_failing, self.runs = fail_at, before_failing, 0

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self.runs += 1
        if self.runs - 1 == self.fail_at:
            self.before_failing()
            raise RuntimeError("the tower failed")
        return [input_feed["x"].astype(np.float32)]


def fake_call(runner: Runner, executor: uform.Executor) -> Call:
    return Call("t", None, cast(Any, None), runner, executor, ("embeddings",))


def batch(i: int) -> Batch:
    return Batch(np.array([i]), {"x": np.array([[i]])})


def run(call: Call, thunks: list[Callable[[], Batch]], progress: Any = None) -> tuple[float, float]:
    return run_batches(call, thunks, ["embeddings"], Progress(progress, 0, len(thunks)), lambda b, r: None)


@pytest.mark.parametrize("how", ["runner raises", "progress cancels"])
def test_a_call_that_fails_waits_for_the_batch_it_was_preparing(how: str) -> None:
    events: list[str] = []
    failing = threading.Event()

    def prepare_next() -> Batch:  # batch 1, prepared while batch 0 computes
        assert failing.wait(WAIT)
        time.sleep(0.05)  # without the fix, the call has long returned by now
        events.append("batch 1 prepared")
        raise OSError("reading the caller's file after the call ended")

    def cancel(done: int, total: int) -> bool:
        failing.set()
        return False

    runner = Runner(0, failing.set) if how == "runner raises" else Runner()
    with uform.Executor(2) as ex:
        error = RuntimeError if how == "runner raises" else uform.CancelledError
        with pytest.raises(error):
            run(fake_call(runner, ex), [lambda: batch(0), prepare_next], cancel if how == "progress cancels" else None)
        events.append("call ended")
    assert events == ["batch 1 prepared", "call ended"]


def test_batches_not_started_are_never_prepared() -> None:
    prepared: list[int] = []

    def thunk(i: int) -> Callable[[], Batch]:
        def prepare() -> Batch:
            prepared.append(i)
            return batch(i)

        return prepare

    with uform.Executor(2) as ex, pytest.raises(RuntimeError, match="the tower failed"):
        run(fake_call(Runner(0), ex), [thunk(i) for i in range(5)])
    assert prepared in ([0], [0, 1])  # batch 1 may have been under way; 2.. never start


def test_a_call_holds_the_batch_it_computes_and_the_one_it_prepares_not_every_batch_before() -> None:
    # the look-ahead kept every finished future, each holding its batch's stacked feeds, until the call ended:
    # audio_encode_samples of 3,000 two-second recordings peaked at 289 MiB of RSS, 109 MiB now, the load alone 89 (docs/api.md)
    built: list[weakref.ref[Batch]] = []
    alive: list[int] = []

    def thunk(i: int) -> Callable[[], Batch]:
        def prepare() -> Batch:
            made = batch(i)
            built.append(weakref.ref(made))
            return made

        return prepare

    class Counting(Runner):
        def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            gc.collect()
            alive.append(sum(ref() is not None for ref in built))
            return super().run(output_names, input_feed)

    with uform.Executor(2) as ex:
        run(fake_call(Counting(), ex), [thunk(i) for i in range(20)])
    assert len(alive) == 20 and max(alive) <= 3, alive


def test_concurrent_calls_prepare_their_batches_at_the_same_time() -> None:
    """Each call's batch 1 waits until the other call's batch 1 is being prepared too: with
    one look-ahead thread per executor the second would queue behind the first forever."""
    both = threading.Barrier(2, timeout=WAIT)

    def meet(i: int) -> Batch:
        both.wait()
        return batch(i)

    results: dict[int, object] = {}

    def caller(k: int) -> None:
        try:
            run(fake_call(Runner(), ex), [lambda: batch(0), lambda: meet(1)])
            results[k] = "ok"
        except Exception as exc:  # noqa: BLE001
            results[k] = exc

    with uform.Executor(2) as ex:
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == {0: "ok", 1: "ok"}


def test_map_raises_only_once_no_item_runs() -> None:
    events: list[str] = []
    started = threading.Event()

    def work(i: int) -> int:
        if i == 0:
            assert started.wait(WAIT)
            raise ValueError("item 0 is bad")
        started.set()
        time.sleep(0.05)
        events.append(f"item {i} done")
        return i

    with uform.Executor(2) as ex:
        with pytest.raises(ValueError, match="item 0 is bad"):
            ex.map(work, [0, 1])
        events.append("map raised")
    assert events == ["item 1 done", "map raised"]


def test_model_close_and_context_manager(tiny_text: Path) -> None:
    with uform.Model.load_ram(tiny_text) as model:
        first = np.array(model.text_encode(["hello"], uform.Arena()).embeddings)
        receiver = model.on(uform.Executor(1))
    for verb in (lambda: model.text_encode(["hello"], uform.Arena()), lambda: receiver.text_encode(["hello"], uform.Arena())):
        with pytest.raises(ValueError, match=r"this Model was closed \(Model.close\(\) or the end of its with block\); load it again"):
            verb()
    model.close()  # closing twice is harmless
    again = uform.Model.load_ram(tiny_text)
    np.testing.assert_array_equal(again.text_encode(["hello"], uform.Arena()).embeddings, first)
    assert "closed" not in repr(again) and "closed" in repr(model)


def test_close_joins_the_model_executor_but_not_the_callers(tiny_text: Path) -> None:
    mine = uform.Executor(2)
    with uform.Model.load_ram(tiny_text, executor=mine) as model:
        model.deferred(mine).text_encode(["a", "b"], uform.Arena()).result()
        own = uform.Model.load_ram(tiny_text)
        own.deferred(runtime_of(own).executor).text_encode(["a"], uform.Arena()).result()
        own.close()
        assert runtime_of(own).executor._dispatch is None  # joined
    assert mine._dispatch is not None  # the caller's executor is the caller's to close
    mine.close()


def test_close_closes_replicas(tiny_text: Path) -> None:
    closed: list[str] = []

    class Closing:
        def __init__(self, runner: Any) -> None:
            self.runner = runner

        def run(self, names: Any, feeds: Any) -> Any:
            return self.runner.run(names, feeds)

        def close(self) -> None:
            closed.append("closed")

    model = uform.Model.load_ram(tiny_text)
    runners = cast(dict[str, Any], runtime_of(model).placement.runners)
    runners["text"] = Closing(runners["text"])
    model.close()
    assert closed == ["closed"]


class Watched(io.BytesIO):
    """A file object that records reads overlapping in time (two threads inside ``read``)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.inside, self.overlaps, self.reads = threading.Lock(), 0, 0

    def read(self, size: int | None = -1, /) -> bytes:
        if not self.inside.acquire(blocking=False):
            self.overlaps += 1
            return super().read(size)
        try:
            self.reads += 1
            time.sleep(0.001)
            return super().read(size)
        finally:
            self.inside.release()


def test_a_file_object_listed_twice_is_read_once() -> None:
    from media import encode_image, pattern

    from uform.plugins.media import files as sources

    png = encode_image(pattern(40, 30), "PNG")
    f, other = Watched(png), Watched(png)
    f.seek(7)
    items = sources.sources([f, b"x", f, other], "images")
    assert [(s.index, s.stream, s.data) for s in items] == [(0, None, png), (1, None, b"x"), (2, None, png), (3, other, None)]
    assert f.reads == 1


def test_a_file_object_listed_twice_encodes_like_its_bytes(tmp_path: Path) -> None:
    from ckpt import make_checkpoint
    from media import encode_image, pattern

    png = encode_image(pattern(64, 48), "PNG")
    model = uform.Model.load_ram(make_checkpoint(tmp_path / "image.safetensors", "tiny", 0, ["image"]), executor=uform.Executor(4))
    f = Watched(png)
    got = np.array(model.image_encode([f] * 8, uform.Arena()).embeddings)
    np.testing.assert_array_equal(got, model.image_encode([png] * 8, uform.Arena()).embeddings)
    assert f.overlaps == 0
    empty = io.BytesIO()
    with pytest.raises(uform.InputError, match="item 0: the file object is empty"):
        model.image_encode([empty, empty], uform.Arena())
