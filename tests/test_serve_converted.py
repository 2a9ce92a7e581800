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


def test_usage_is_the_verbs_own_count_and_each_text_is_tokenized_once(clip: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server counted usage by tokenizing every text a second time on the lane's thread
    after the verb's call (two tokenizer passes a call); it now reads the verb's TextItemStats."""
    from uform.plugins.media.text import HeldTokenizer

    texts = ["a cat on the mat", "dog", "the " * 40]
    stats = uform.TextItemStats()
    clip.text_encode(texts, uform.Arena(), stats=stats)
    assert stats.item_tokens == [7, 3, CONTEXT] and stats.tokens == 10 + CONTEXT
    passes: list[int] = []
    encode = HeldTokenizer.encode
    monkeypatch.setattr(HeldTokenizer, "encode", lambda self, texts, count=True: passes.append(len(texts)) or encode(self, texts, count))
    with thread_server(clip, ServeConfig(model_id="clip")) as (url, _):
        answer = httpx.post(url + "/v1/embeddings", json={"input": texts})
    assert answer.status_code == 200 and answer.json()["usage"] == {"prompt_tokens": 10 + CONTEXT, "total_tokens": 10 + CONTEXT}, answer.text
    assert passes == [3]


def _usage_cost(path: str) -> str:
    """ms per 64 captions of the server's text call on the converted model at ``path``: as it
    was (the verb, then every text tokenized again to count usage) and as it is (the verb's
    TextItemStats), and the second pass alone; interleaved rounds."""
    import time

    from uform.model import runtime_of

    model = uform.Model.load_ram(path)
    tokenizer = runtime_of(model).towers["text"].parsed.tokenizer
    captions = [f"a photo of a {w} sitting on a wooden table next to a window, number {i}".encode() for i, w in enumerate(["cat", "dog", "bird", "horse"] * 16)]
    arena = uform.Arena()

    def before() -> np.ndarray:
        model.text_encode(captions, arena)
        return np.asarray(tokenizer.encode([c.decode() for c in captions], count=False).kept)

    def now() -> np.ndarray:
        stats = uform.TextItemStats()
        model.text_encode(captions, arena, stats=stats)
        return np.asarray(stats.item_tokens)

    def second_pass() -> np.ndarray:
        return np.asarray(tokenizer.encode([c.decode() for c in captions], count=False).kept)

    assert (before() == now()).all()
    took: dict[str, list[float]] = {"with the second pass": [], "the verb's count": [], "the second pass alone": []}
    for _ in range(8):
        for name, run in zip(took, (before, now, second_pass)):
            began = time.perf_counter()
            for _ in range(20):
                run()
            took[name].append((time.perf_counter() - began) / 20 * 1000)
    return ", ".join(f"{k}: {np.median(v):.2f} ms" for k, v in took.items()) + " per 64 captions (median of 8 interleaved rounds of 20 calls)"


if __name__ == "__main__":  # python tests/test_serve_converted.py CONVERTED.safetensors: the figure of docs/serve.md ("Tokens are bytes")
    import sys

    print(_usage_cost(sys.argv[1]))
