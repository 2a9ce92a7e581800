"""A row's bits do not depend on its batch, on the tiles' arithmetic, on every machine.

The rule the system stands on (docs/checkpoint.md: results do not depend on the batch): the
server coalesces clients' items into one call, Ray cuts and regroups blocks, the index runs
rows again. On an AMX CPU the e4m3 backend runs the ``amx`` kernels; these tests load the same
kernels over the scalar model of the tile instructions (``amx-model``, which answers the real
tiles' bits: tests/test_amx.py), so a machine without AMX fails them where a change makes a
row's bits depend on the rows beside it (as a small-row path of other kernels once did). The
model is slow: a tiny checkpoint, a few dozen rows.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from oplibrary import runnable

import uform
from ckpt import make_checkpoint
from media import encode_image, pattern
from serving import Conn, host_port, thread_server
from uform.plugins import e4m3
from uform.serve import ServeConfig

HAVE_RAY = importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.data") is not None


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("rows") / "tiny.safetensors", "tiny", 3, ["text", "image"])


@pytest.fixture(scope="module", params=[uform.Scalar.BF16, uform.Scalar.E4M3], ids=["bf16", "e4m3"])
def tiles(request: pytest.FixtureRequest, checkpoint: Path) -> Iterator[uform.Model]:
    """The checkpoint on the e4m3 backend, every product on ``amx-model`` (the amx kernels as
    they ship, over the model of the tiles), two threads."""
    runnable("amx-model")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(e4m3, "variant_of", lambda cpu_class: "amx-model")
        with uform.Executor(2) as ex, uform.Model.load_ram(checkpoint, quantization=request.param, executor=ex) as model:
            assert "amx-model kernels" in model.compute
            yield model


def texts(n: int) -> list[str]:
    rng = np.random.default_rng(n)
    return [f"row {i}: " + "".join(rng.choice(list("abcdefgh ij"), int(rng.integers(0, 40)))) for i in range(n)]


def rows(model: uform.Model, verb: str, items: list[object]) -> np.ndarray:
    return np.array(getattr(model, verb)(items, uform.Arena()).embeddings)


def test_encode_gives_each_row_its_bits_in_any_batch(tiles: uform.Model) -> None:
    """Texts alone, in batches of 2, 3, 4 and 7, shuffled, and all 20 at once (every row count
    from 1 up, where the products' tiles are mostly empty or full); pictures alone and together."""
    t = texts(20)
    whole = rows(tiles, "text_encode", t)
    assert np.array_equal(whole, np.concatenate([rows(tiles, "text_encode", [x]) for x in t]))
    for size in (2, 3, 4, 7):
        parts = np.concatenate([rows(tiles, "text_encode", t[i : i + size]) for i in range(0, len(t), size)])
        assert np.array_equal(whole, parts), f"batches of {size}"
    order = np.random.default_rng(1).permutation(len(t))
    assert np.array_equal(whole[order], rows(tiles, "text_encode", [t[i] for i in order]))
    pictures = [encode_image(pattern(24 + 5 * i, 30 + 3 * i, i), "PNG") for i in range(5)]
    together = rows(tiles, "image_encode", pictures)
    assert np.array_equal(together, np.concatenate([rows(tiles, "image_encode", [p]) for p in pictures]))


@pytest.mark.skipif(not HAVE_RAY, reason="ray[data] is not installed (pip install 'uform[ray]')")
def test_ray_blocks_of_any_size_give_the_rows_bits(tiles: uform.Model, checkpoint: Path) -> None:
    """uform.ray's actor callable (in this process) on blocks of 1, 3 and 16 rows, and a block
    with a refused row, against the model's rows one at a time."""
    from uform.ray import Encoder

    t = texts(16)
    alone = np.concatenate([rows(tiles, "text_encode", [x]) for x in t])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(e4m3, "variant_of", lambda cpu_class: "amx-model")
        enc = Encoder(str(checkpoint), "text", "caption", quantization=tiles.describe().quantization, threads=2)
    try:
        assert "amx-model kernels" in enc.model.compute
        for size in (1, 3, 16):
            got = np.concatenate([enc({"caption": np.array(t[i : i + size], dtype=object)})["embedding"] for i in range(0, 16, size)])
            assert np.array_equal(got, alone), f"blocks of {size}"
        refused = enc({"caption": np.array([t[0], 7, t[1], t[2]], dtype=object)})
        assert list(refused["error"])[1] != "" and np.array_equal(np.asarray(refused["embedding"])[[0, 2, 3]], alone[:3])
    finally:
        enc.close()


def test_the_servers_coalesced_rows_are_each_texts_bits_alone(tiles: uform.Model) -> None:
    """8 clients at once, each a text a request, coalesced by the server into calls of several
    texts: every answer is the text's row encoded alone."""
    t = texts(24)
    alone = {x: rows(tiles, "text_encode", [x])[0] for x in t}
    with thread_server(tiles, ServeConfig(model_id="default")) as (url, state):
        host, port = host_port(url)

        async def client(c: int) -> list[str]:
            conn = Conn(host, port)
            wrong = []
            try:
                for x in t[c::8]:
                    status, _, body = await conn.post_json("/v1/embeddings", {"input": x})
                    row = np.array(body["data"][0]["embedding"], np.float32) if status == 200 else None
                    if row is None or not np.array_equal(row, alone[x]):
                        wrong.append(x)
            finally:
                await conn.close()
            return wrong

        async def main() -> list[str]:
            return [x for wrong in await asyncio.gather(*(client(c) for c in range(8))) for x in wrong]

        assert asyncio.run(main()) == []
        registry = state.metrics.registry
        requests = registry.get_sample_value("uform_batch_requests_sum", {"verb": "text_encode"})
        calls = registry.get_sample_value("uform_batch_requests_count", {"verb": "text_encode"})
        assert requests == 24 and calls < 24, f"nothing was coalesced: {requests} requests in {calls} calls"
