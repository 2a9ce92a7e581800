"""``uform serve`` with a converted CLIP (random weights, a word-level tokenizer of its own),
over loopback: ``usage`` counts each text's tokens in the model's tokenizer, per request,
also for requests coalesced into one call, and a token-id array that is not UTF-8 is named
before anything is queued."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import uform
from serving import thread_server
from uform.serve import ServeConfig

pytest.importorskip("torch")
pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from test_converted import _clip  # noqa: E402
from v2ckpt import clip_file, word_tokenizer  # noqa: E402

CONTEXT = 16  # the test CLIP's max_position_embeddings


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[uform.Model]:
    path = clip_file(_clip(), tmp_path_factory.mktemp("clip") / "clip.safetensors")
    with uform.Model.load_ram(path) as model:
        yield model


def tokens(text: str) -> int:
    """The text's tokens as the model reads them: <bos> words <eos>, cut at the context."""
    tok = tokenizers.Tokenizer.from_str(word_tokenizer())
    tok.enable_truncation(CONTEXT)
    return len(tok.encode(text).ids)


def test_usage_counts_the_models_own_tokens_in_each_coalesced_request(clip: uform.Model) -> None:
    first = ["a cat on the mat", "dog"]
    second = ["red blue sky !", "the " * 40]  # 40 words: cut at the context
    assert [tokens(t) for t in first + second] == [7, 3, 6, CONTEXT]
    expected = np.array(clip.text_encode(first + second, uform.Arena()).embeddings)
    with thread_server(clip, ServeConfig(model_id="clip", batch_window_ms=1000)) as (url, state):

        async def both() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                return list(await asyncio.gather(*(client.post(url + "/v1/embeddings", json={"input": texts}) for texts in (first, second))))

        answers = asyncio.run(both())
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        assert [a.headers["x-uform-batch-items"] for a in answers] == ["4", "4"]  # one call for both
        assert [a.json()["usage"] for a in answers] == [{"prompt_tokens": 10, "total_tokens": 10}, {"prompt_tokens": 6 + CONTEXT, "total_tokens": 6 + CONTEXT}]
        rows = np.array([d["embedding"] for a in answers for d in a.json()["data"]], np.float32)
        np.testing.assert_array_equal(rows, expected)
        ids = httpx.post(url + "/v1/embeddings", json={"input": [list(b"dog"), [255, 1]]})
        assert ids.status_code == 400 and ids.json()["error"]["param"] == "input[1]", ids.text
        assert ids.json()["error"]["message"] == "input[1]: bytes are not UTF-8 (invalid start byte at byte 0); this model's tokenizer reads text"
        # refused as the request was read, before anything was queued: no verb call refused it
        assert state.metrics.registry.get_sample_value("uform_failed_items_total", {"verb": "text_encode"}) is None
        assert state.metrics.registry.get_sample_value("uform_called_items_total", {"verb": "text_encode"}) == 4
        one = httpx.post(url + "/v1/embeddings", json={"input": list(b"dog")})  # token ids are UTF-8 bytes, tokenized as text
        assert one.json()["usage"]["prompt_tokens"] == 3
