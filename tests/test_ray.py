"""uform.ray: batch encoding on Ray Data (docs/scale.md).

The Ray tests share one local runtime (``ray.init(num_cpus=2)``, module-scoped), kept out of
the home folder (its files under a temporary folder, its auth token in a file there), and
run three small pipelines; the rest calls :class:`uform.ray.Encoder` in this process. They
skip, saying why, where ``ray[data]`` is not installed. No timing is asserted here:
benchmarks/ray.py measures speed.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import uform
from ckpt import make_checkpoint
from media import encode_image, pattern

HAVE_RAY = importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.data") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray[data] is not installed (pip install 'uform[ray]')")
HOME_TOKEN = Path.home() / ".ray" / "auth_token"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")  # Ray's own, about its own settings


def within(seconds: float, run: Callable[[], Any]) -> Any:
    """``run()``, failing the test rather than the suite if a pipeline hangs (a pool that
    holds every CPU starves the reads feeding it: that hang is what this guards against)."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(run()), daemon=True)
    worker.start()
    worker.join(seconds)
    if not result:
        pytest.fail(f"the Ray pipeline did not finish within {seconds} s")
    return result[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ray") / "tiny.safetensors", "tiny", 0, ["text", "image"])


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> Iterator[uform.Model]:
    """The in-process reference: the same quantization (the default BF16) as the actors."""
    with uform.Executor(1) as ex, uform.Model.load_ram(checkpoint, executor=ex) as m:
        yield m


def texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"row {i}: " + "".join(rng.choice(list("abcdefgh ij"), int(rng.integers(0, 200)))) for i in range(n)]


def images(n: int) -> list[bytes]:
    return [encode_image(pattern(24 + 5 * (i % 7), 30 + 3 * i, i), "PNG" if i % 2 else "JPEG") for i in range(n)]


def reference(model: uform.Model, verb: str, items: list[Any], **kwargs: Any) -> np.ndarray:
    return np.array(getattr(model, verb)(items, uform.Arena(), **kwargs).embeddings)


# -- what bit equality rests on: rows do not depend on the batch they are in -------------------


def test_rows_do_not_depend_on_their_batch(model: uform.Model) -> None:
    """Ray cuts and regroups batches as it likes (and a refused row leaves its batch): rows
    are independent in these towers, bit for bit, whatever their neighbours or batch size."""
    t = texts(40)
    whole = reference(model, "text_encode", t)
    assert np.array_equal(whole, np.concatenate([reference(model, "text_encode", t[i : i + 7]) for i in range(0, 40, 7)]))
    assert np.array_equal(whole, np.concatenate([reference(model, "text_encode", [x]) for x in t]))
    shuffled = np.random.default_rng(1).permutation(40)
    assert np.array_equal(whole[shuffled], reference(model, "text_encode", [t[i] for i in shuffled]))
    im = images(9)
    whole = reference(model, "image_encode", im)
    assert np.array_equal(whole, np.concatenate([reference(model, "image_encode", [x]) for x in im]))


# -- the actor's callable, in this process ---------------------------------------------------


@needs_ray
def test_import_uform_does_not_import_ray() -> None:
    code = "import sys, uform; assert 'ray' not in sys.modules, 'ray was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@needs_ray
def test_encoder_equals_model_and_never_hands_out_reused_memory(checkpoint: Path, model: uform.Model) -> None:
    from uform.ray import Encoder

    enc = Encoder(str(checkpoint), "text", "caption", threads=1)
    assert enc.model.describe().quantization == model.describe().quantization
    first, second = texts(16, seed=2), texts(16, seed=3)
    out1 = enc({"caption": np.array(first, dtype=object), "id": np.arange(16)})
    kept = out1["embedding"].copy()
    out2 = enc({"caption": np.array(second, dtype=object), "id": np.arange(16, 32)})
    # a result handed out must survive the next batch, which reuses the actor's arena
    assert np.array_equal(out1["embedding"], kept)
    assert np.array_equal(out1["embedding"], reference(model, "text_encode", first))
    assert np.array_equal(out2["embedding"], reference(model, "text_encode", second))
    assert list(out2["id"]) == list(range(16, 32)) and list(out1["error"]) == [""] * 16
    # the control: the same reuse does overwrite a view taken from an Encoded, so the checks above can fail
    arena = uform.Arena()
    view = model.text_encode(first, arena).embeddings
    before = view.copy()
    model.text_encode(second, arena)
    assert not np.array_equal(view, before)
    assert enc.loads == 1 and enc.batches == 2
    clone = pickle.loads(pickle.dumps(enc))  # instances pickle as their arguments
    assert np.array_equal(clone({"caption": np.array(first, dtype=object)})["embedding"], kept)
    clone.close()
    enc.close()


@needs_ray
def test_scalars_matryoshka_and_tokens_equal_model(checkpoint: Path, model: uform.Model) -> None:
    from uform.ray import Encoder

    t = texts(10, seed=4)
    batch = {"t": np.array(t, dtype=object)}
    for scalar in (uform.Scalar.I8, uform.Scalar.B1, uform.Scalar.BF16, uform.Scalar.F16):
        enc = Encoder(checkpoint, "text", "t", outputs=uform.Outputs.EMBEDDINGS | uform.Outputs.TOKENS, outputs_scalar=scalar, threads=1)
        got = enc(batch)
        want = model.text_encode(t, uform.Arena(), outputs=uform.Outputs.EMBEDDINGS | uform.Outputs.TOKENS, outputs_scalar=scalar)
        e = got["embedding"]
        if scalar is uform.Scalar.BF16:
            e = e.view(ml_dtypes.bfloat16)  # handed to Arrow as bits
        assert e.dtype == want.embeddings.dtype and np.array_equal(e.view(np.uint8), want.embeddings.view(np.uint8)), scalar
        assert want.tokens is not None and len(got["tokens"]) == len(t)
        for i, row in enumerate(got["tokens"]):
            assert np.array_equal(row.view(np.uint8), want.tokens[i].view(np.uint8)), (scalar, i)
        if scalar is uform.Scalar.I8:
            assert want.embedding_scales is not None and want.tokens.scales is not None
            assert np.array_equal(got["embedding_scale"], want.embedding_scales)
            assert np.array_equal(np.concatenate(list(got["tokens_scale"])), want.tokens.scales)
        enc.close()
    # a Matryoshka prefix: the first k values of each F32 row, made unit again (docs/api.md)
    enc = Encoder(checkpoint, "text", "t", dimensions=16, threads=1)
    full = reference(model, "text_encode", t)
    assert np.array_equal(enc(batch)["embedding"], full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True))
    enc.close()
    with pytest.raises(ValueError, match="dimensions"):
        Encoder(checkpoint, "text", "t", dimensions=10_000, threads=1)
    with pytest.raises(ValueError, match="modality"):
        Encoder(checkpoint, "smell", "t", threads=1)
    for bad in (0, 1025, True):
        with pytest.raises(ValueError, match=rf"threads must be an int from 1 to 1024 or None; got {bad!r}"):
            Encoder(checkpoint, "text", "t", threads=bad)
    for bad in (0, True, 2.0):  # True was taken as 1: rows of one value, or recordings read at 1 Hz
        with pytest.raises(ValueError, match=rf"dimensions must be a positive int \(a Matryoshka prefix\) or None; got {bad!r}"):
            Encoder(checkpoint, "text", "t", dimensions=bad, threads=1)
        with pytest.raises(ValueError, match=rf"modality 'audio_samples' needs sample_rate, a positive int; got {bad!r}"):
            Encoder(checkpoint, "audio_samples", "s", sample_rate=bad, threads=1)


@needs_ray
def test_bad_rows_carry_their_error_and_the_rest_encode(checkpoint: Path, model: uform.Model, tmp_path: Path) -> None:
    from uform.ray import Encoder

    good = images(8)
    (tmp_path / "ok.png").write_bytes(good[1])
    items: list[Any] = [good[0], str(tmp_path / "ok.png"), good[2][:40], str(tmp_path / "missing.png"), good[3], b"not an image", *good[4:]]
    enc = Encoder(checkpoint, "image", "img", threads=1)
    out = enc({"img": np.array(items, dtype=object), "k": np.arange(len(items))})
    bad = [2, 3, 5]
    for i, err in enumerate(out["error"]):
        assert (err != "") == (i in bad), (i, err)
    assert all(out["error"][i].startswith("InputError: ") and len(out["error"][i]) > len("InputError: ") for i in bad)
    assert out["error"][3] == "InputError: no such file"  # the reason; the row's own column holds the path
    ok = [i for i in range(len(items)) if i not in bad]
    assert np.array_equal(out["embedding"][ok], reference(model, "image_encode", [items[i] for i in ok]))
    assert np.isnan(out["embedding"][bad]).all()
    # more refusals than one batch retries: the rest go row by row, with the same results
    many: list[Any] = [b"junk %d" % i if i % 2 else good[i % 8] for i in range(12)]
    out = enc({"img": np.array(many, dtype=object)})
    assert [bool(e) for e in out["error"]] == [bool(i % 2) for i in range(12)]
    assert np.array_equal(out["embedding"][0::2], reference(model, "image_encode", many[0::2]))
    enc.close()
    # an error that is no row's fault (here: the model is gone) fails the batch rather than every row
    enc = Encoder(checkpoint, "text", "t", threads=1)
    enc.model.close()
    with pytest.raises(ValueError, match="closed"):
        enc({"t": np.array(["a", "b"], dtype=object)})


def test_plan_follows_the_cluster() -> None:
    pytest.importorskip("ray", reason="ray[data] is not installed (pip install 'uform[ray]')")
    from uform.ray import Plan, plan

    assert plan({"CPU": 2.0}) == Plan(actors=2, threads=1, gpus=0.0, batch_size=64, cpus=0.5)
    assert plan({"CPU": 16.0}, threads_per_actor=4) == Plan(4, 4, 0.0, 64, 2.0)
    assert plan({"CPU": 16.0}, actors=2, cpus_per_actor=8) == Plan(2, 8, 0.0, 64, 8.0)
    assert plan({"CPU": 32.0, "GPU": 4.0}) == Plan(4, 8, 1.0, 256, 4.0)
    assert plan({"CPU": 32.0, "GPU": 4.0}, gpus_per_actor=0) == Plan(32, 1, 0.0, 64, 0.5)
    assert plan({"CPU": 8.0, "GPU": 2.0}, batch_size=32).placement == "vram"


def test_without_ray_the_import_says_how_to_install_it() -> None:
    """Python's 'No module named 'ray'' named no way out; the error now names the extra."""
    hide = ("import importlib.abc, sys\n"
            "class Hide(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'ray':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "try:\n"
            "    import uform.ray\n"
            "except ModuleNotFoundError as exc:\n"
            "    print(exc.name, exc)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == "ray uform.ray needs Ray Data, which is not installed: pip install 'uform[ray]' (ray[data] >= 2.51)\n"


# -- on a local Ray runtime -------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """One local runtime for the module, its files and auth token under a temporary folder."""
    if not HAVE_RAY:
        pytest.skip("ray[data] is not installed (pip install 'uform[ray]')")
    import ray

    home_token_before = HOME_TOKEN.exists()
    root = Path(tempfile.mkdtemp(prefix="uray-"))  # short: Ray's socket paths must fit in 107 bytes
    token = root / "auth_token"
    token.write_text(secrets.token_hex(32))
    # Ray's session files under root/ray: Ray takes TMPDIR/ray on Linux (ray.init's own _temp_dir is private)
    env = {"RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0", "TMPDIR": str(root)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        assert [p.name for p in (root / "ray").glob("session_*")], "Ray's session files are not under TMPDIR/ray"
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(root, ignore_errors=True)
    assert HOME_TOKEN.exists() == home_token_before, "Ray wrote its auth token under the home folder"


def counting_encoder(markers: Path) -> type:
    """An Encoder that leaves a file per model load and tags rows with the actor's process."""
    from uform.ray import Encoder

    class Counting(Encoder):
        def load_model(self) -> uform.Model:
            (markers / f"{os.getpid()}-{secrets.token_hex(4)}").touch()
            return super().load_model()

        def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            out = super().__call__(batch)
            out["pid"] = np.full(len(batch[self.column]), os.getpid())
            return out

    return Counting


def test_texts_on_two_actors_equal_model_rows_keep_identity_one_load_each(
    local_ray: Any, checkpoint: Path, model: uform.Model, tmp_path: Path
) -> None:
    from uform.ray import count_errors, encode_dataset

    n = 120
    t: list[Any] = texts(n, seed=5)
    bad = {7, 64, 101}
    for i in bad:
        t[i] = "\ud800 lone surrogate" if i % 2 else None  # refused by text_encode: InputError
    ds = local_ray.data.from_items([{"id": i, "text": x} for i, x in enumerate(t)], override_num_blocks=6)
    markers = tmp_path / "loads"
    markers.mkdir()
    out = within(120, encode_dataset(
        ds, "text", "text", str(checkpoint), batch_size=8, preserve_order=True, encoder=counting_encoder(markers)
    ).materialize)
    rows = out.take_all()
    assert [r["id"] for r in rows] == list(range(n))  # preserve_order=True keeps the order
    assert all(r["text"] == t[r["id"]] for r in rows)  # and every row its columns
    ok = [i for i in range(n) if i not in bad]
    want = reference(model, "text_encode", [t[i] for i in ok])
    got = np.stack([rows[i]["embedding"] for i in ok])
    assert got.dtype == np.float32 and np.array_equal(got, want)  # 15 batches per actor's arena: 0 wrong rows
    assert {i for i, r in enumerate(rows) if r["error"]} == bad
    assert all(rows[i]["error"].startswith("InputError: ") for i in bad)
    counts = count_errors(out)
    assert (counts.rows, counts.encoded, counts.failed, counts.errors) == (n, n - 3, 3, {"InputError": 3})
    loads = sorted(p.name.split("-")[0] for p in markers.iterdir())
    assert len(loads) == 2, loads  # one model per actor, for 15 batches
    assert {str(r["pid"]) for r in rows} <= set(loads)


def test_image_files_with_a_corrupt_one_checkpoint_from_the_object_store(
    local_ray: Any, checkpoint: Path, model: uform.Model, tmp_path: Path
) -> None:
    from uform.ray import count_errors, encode_dataset

    folder = tmp_path / "images"
    folder.mkdir()
    data = images(20)
    data[13] = data[13][: len(data[13]) // 3]  # a truncated file among the others
    for i, d in enumerate(data):
        (folder / f"{i:02d}.img").write_bytes(d)
    ds = local_ray.data.read_binary_files(str(folder), include_paths=True)
    # read tasks upstream of the actors: they need CPUs the actor pool must leave them
    out = within(120, encode_dataset(ds, "bytes", "image", checkpoint.read_bytes(), batch_size=4, outputs_scalar="i8").materialize)
    rows = {Path(r["path"]).name: r for r in out.take_all()}  # no order asked for: keyed by path
    assert sorted(rows) == [f"{i:02d}.img" for i in range(20)]
    ok = [i for i in range(20) if i != 13]
    want = uform.Arena()
    encoded = model.image_encode([data[i] for i in ok], want, outputs_scalar=uform.Scalar.I8)
    assert np.array_equal(np.stack([rows[f"{i:02d}.img"]["embedding"] for i in ok]), encoded.embeddings)
    assert encoded.embedding_scales is not None
    assert np.array_equal(np.array([rows[f"{i:02d}.img"]["embedding_scale"] for i in ok]), encoded.embedding_scales)
    assert rows["13.img"]["error"].startswith("InputError: ") and np.isnan(rows["13.img"]["embedding_scale"])
    assert count_errors(out).errors == {"InputError": 1}
