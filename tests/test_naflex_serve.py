"""``uform serve`` with a SigLIP 2 NaFlex file (a random ``Siglip2Model`` at the base model's
pixel geometry, converted to float32), over real HTTP on loopback: pictures and clips of mixed
aspect ratios, hence of mixed grids, in one request and across concurrent requests coalesced
into one call, each answer equal to ``Model.image_encode`` (``video_encode``) of that item
alone (docs/models-naflex.md)."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import uform
from serving import subprocess_server, thread_server
from uform.plugins.media import naflex
from uform.serve import ServeConfig

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("torch")

from naflex_models import make_siglip2, picture  # noqa: E402
from test_naflex import _clip  # noqa: E402

# (width, height, format): square, 2:1, 1:3, tiny, a 50:1 strip, a 4:3 photo as JPEG; six grids
PICTURES = [(640, 640, "PNG"), (800, 400, "PNG"), (300, 900, "PNG"), (5, 3, "PNG"), (1000, 20, "PNG"), (640, 480, "JPEG")]
CLIPS = [(64, 32), (32, 64), (48, 48)]  # 2:1, 1:2 and square 8-frame clips: grids 11x22, 22x11, 16x16


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from uform.convert import convert

    out = tmp_path_factory.mktemp("naflex") / "naflex.safetensors"
    convert(make_siglip2(tmp_path_factory.mktemp("siglip2") / "tiny-siglip2"), out, dtype="f32")
    return out


@pytest.fixture(scope="module")
def model(converted: Path) -> Iterator[uform.Model]:
    with uform.Model.load_ram(converted, quantization=uform.Scalar.F32) as m:
        yield m


def _file(width: int, height: int, kind: str, seed: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(picture(width, height, seed)).save(out, kind)
    return out.getvalue()


@pytest.fixture(scope="module")
def files() -> list[bytes]:
    return [_file(w, h, kind, i) for i, (w, h, kind) in enumerate(PICTURES)]


@pytest.fixture(scope="module")
def clips() -> list[bytes]:
    return [_clip(w, h, 10 * i) for i, (w, h) in enumerate(CLIPS)]


def _part(data: bytes, kind: str) -> dict[str, Any]:
    mime = {"PNG": "image/png", "JPEG": "image/jpeg", "MP4": "video/mp4"}[kind]
    lane = "video_url" if kind == "MP4" else "image_url"
    return {"type": lane, lane: {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}}


def _alone(model: uform.Model, items: list[bytes], verb: str) -> np.ndarray:
    """Each item through the verb alone, one call each."""
    return np.concatenate([np.asarray(getattr(model, verb)([item], uform.Arena()).embeddings) for item in items])


def test_the_pictures_are_of_six_grids() -> None:
    grids = {naflex.grid_for(h, w, 16, 256) for w, h, _ in PICTURES}
    assert grids == {(16, 16), (11, 22), (27, 9), (12, 20), (2, 100), (14, 18)}


def test_one_request_of_mixed_grids_through_the_openai_client(converted: Path, model: uform.Model, files: list[bytes], clips: list[bytes]) -> None:
    openai = pytest.importorskip("openai")
    want_images, want_clips = _alone(model, files, "image_encode"), _alone(model, clips, "video_encode")
    with subprocess_server(["--model", str(converted), "--quantization", "f32", "--max-items", "64"]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        parts = [_part(f, kind) for f, (_, _, kind) in zip(files, PICTURES)] + [_part(c, "MP4") for c in clips]
        answer = client.embeddings.create(model="naflex", input=["a photo", *parts[:3], *parts[6:], *parts[3:6]])
        rows = np.array([d.embedding for d in answer.data], np.float32)
    assert [d.index for d in answer.data] == list(range(10))
    np.testing.assert_allclose(rows[1:4], want_images[:3], atol=0, rtol=0)
    np.testing.assert_allclose(rows[7:], want_images[3:], atol=0, rtol=0)
    np.testing.assert_allclose(rows[4:7], want_clips, atol=0, rtol=0)


def test_concurrent_requests_coalesced_into_one_call(model: uform.Model, files: list[bytes], clips: list[bytes]) -> None:
    """Three requests of pictures of different grids (one grid in two of them) and two of clips,
    at once: the server joins each lane's into one call; every row equals its item alone."""
    want_images, want_clips = _alone(model, files, "image_encode"), _alone(model, clips, "video_encode")
    picture_requests = [[0, 1], [2, 3, 0], [4, 5]]  # picture 0 twice, in two requests
    clip_requests = [[0, 2], [1, 0]]
    kinds = [kind for _, _, kind in PICTURES]
    with thread_server(model, ServeConfig(model_id="naflex", batch_window_ms=3000)) as (url, _):

        async def every() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as client:
                posts = [{"input": [_part(files[i], kinds[i]) for i in r]} for r in picture_requests]
                posts += [{"input": [_part(clips[i], "MP4") for i in r]} for r in clip_requests]
                return list(await asyncio.gather(*(client.post(url + "/v1/embeddings", json=doc) for doc in posts)))

        answers = asyncio.run(every())
    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]
    assert [a.headers["x-uform-batch-items"] for a in answers] == ["7", "7", "7", "4", "4"]  # one call a lane
    for answer, wanted in zip(answers, [want_images[r] for r in picture_requests] + [want_clips[r] for r in clip_requests]):
        rows = np.array([d["embedding"] for d in answer.json()["data"]], np.float32)
        np.testing.assert_allclose(rows, wanted, atol=0, rtol=0)
