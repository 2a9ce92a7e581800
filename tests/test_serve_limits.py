"""The server's limits over loopback, on a thread of the test process: 413 before the body is
read whole, 429 with Retry-After on a full queue, the API key (401, constant-time compare,
/health open), /health while draining, batching off, and a client that disconnects while its
items are queued (they are dropped, never computed)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

import uform
from serving import host_port, thread_server
from uform.serve import ServeConfig


@pytest.fixture(scope="module")
def model() -> Iterator[uform.Model]:
    with uform.Model.load_ram() as m:
        yield m


def raw_request(url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send ``head`` (and ``body``), answer what came back before the server closed or 2 s passed."""
    with socket.create_connection(host_port(url), timeout=5) as s:
        s.sendall(head + body)
        s.settimeout(2)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
                if b"\r\n\r\n" in got and b'"error"' in got:
                    break
        except TimeoutError:
            pass
        return got


def test_request_size_queue_and_item_limits(model: uform.Model) -> None:
    config = ServeConfig(model_id="default", max_request_bytes=1000, max_queue_items=4, max_items_per_request=3)
    with thread_server(model, config) as (url, _):
        # a declared length over the limit is refused before a byte of the body is sent
        head = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
        answer = raw_request(url, head)
        assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer, answer
        # a chunked body is cut off as soon as it passes the limit
        chunks = iter([b'{"input": ["' + b"x" * 600, b"y" * 600, b'"]}'])
        big = httpx.post(url + "/v1/embeddings", content=chunks, headers={"content-type": "application/json"})
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        assert httpx.post(url + "/v1/embeddings", json={"input": ["a"] * 3}).status_code == 200
        too_many = httpx.post(url + "/v1/embeddings", json={"input": ["a"] * 4})
        assert too_many.status_code == 400 and too_many.json()["error"]["code"] == "too_many_items"
    # a worker waiting out its batch window holds what comes next in the queue
    config = ServeConfig(model_id="default", max_queue_items=4, batch_window_ms=5000)
    with thread_server(model, config) as (url, state):
        # more items than the queue holds could never be queued: a 400, not a 429 to retry forever
        never = httpx.post(url + "/v1/embeddings", json={"input": ["a"] * 5})
        assert never.status_code == 400 and never.json()["error"]["code"] == "too_many_items", never.text
        assert never.json()["error"]["message"] == "'input' holds 5 items, more than the queue holds (4, --max-queue-items); send fewer items a request"
        answers: list[httpx.Response] = []

        def post(texts: list[str]) -> threading.Thread:
            thread = threading.Thread(target=lambda: answers.append(httpx.post(url + "/v1/embeddings", json={"input": texts}, timeout=60)))
            thread.start()
            return thread

        posted = [post(["a"])]
        deadline = time.monotonic() + 30
        while (state.batcher is None or not state.batcher.lanes["text"].running) and time.monotonic() < deadline:
            time.sleep(0.002)  # until the worker took it and waits its window
        assert state.batcher is not None and state.batcher.lanes["text"].running, "the worker never took the first request"
        lane = state.batcher.lanes["text"]
        posted.append(post(["b", "c", "d"]))
        while lane.queued_items < 3 and time.monotonic() < deadline:
            time.sleep(0.002)
        full = httpx.post(url + "/v1/embeddings", json={"input": ["e", "f"]})
        assert lane.queued_items == 3, "the window ended before the queue was full; lengthen it"
        assert full.status_code == 429 and full.headers["retry-after"] == "1"
        assert full.json()["error"]["type"] == "rate_limit_error"
        for thread in posted:
            thread.join(60)
        assert sorted(len(a.json()["data"]) for a in answers) == [1, 3]


def test_api_key(model: uform.Model) -> None:
    with thread_server(model, ServeConfig(model_id="default", api_key="s3cret")) as (url, _):
        doc = {"input": "a red circle"}
        missing = httpx.post(url + "/v1/embeddings", json=doc)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["type"] == "authentication_error"
        for wrong in ("Bearer s3cre", "Bearer s3cret2", "s3cret", "Basic s3cret"):
            assert httpx.post(url + "/v1/embeddings", json=doc, headers={"authorization": wrong}).status_code == 401
        ok = {"authorization": "Bearer s3cret"}
        assert httpx.post(url + "/v1/embeddings", json=doc, headers=ok).status_code == 200
        for path in ("/v1/models", "/metrics"):
            assert httpx.get(url + path).status_code == 401 and httpx.get(url + path, headers=ok).status_code == 200
        assert httpx.get(url + "/health").status_code == 200  # open: load balancers probe it without the key


def test_health_while_draining_and_batching_off(model: uform.Model) -> None:
    texts = [f"text {i}" for i in range(8)]
    expected = np.array(model.text_encode(texts, uform.Arena()).embeddings)
    with thread_server(model, ServeConfig(model_id="default", batching=False)) as (url, state):
        rows = [httpx.post(url + "/v1/embeddings", json={"input": t}) for t in texts]
        assert all(r.headers["x-uform-batch-items"] == "1" for r in rows)
        np.testing.assert_array_equal(np.array([r.json()["data"][0]["embedding"] for r in rows], np.float32), expected)
        state.draining = True
        assert httpx.get(url + "/health").status_code == 503
        state.draining = False
        assert httpx.get(url + "/health").status_code == 200


def test_a_client_that_goes_away_has_its_queued_items_dropped(model: uform.Model) -> None:
    long = [("a long text about circles and squares " * 4)[:128] + str(i) for i in range(768)]
    with thread_server(model, ServeConfig(model_id="default")) as (url, state):
        answers: list[httpx.Response] = []
        first = threading.Thread(target=lambda: answers.append(httpx.post(url + "/v1/embeddings", json={"input": long}, timeout=60)))
        first.start()
        lane = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait for the long call to be running
            lane = state.batcher.lanes["text"] if state.batcher else None
            if lane is not None and lane.running:
                break
            time.sleep(0.005)
        assert lane is not None and lane.running
        body = b'{"input": ["one", "two", "three"]}'
        head = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        with socket.create_connection(host_port(url)) as s:
            s.sendall(head + body)
            while lane.queued_items == 0:  # queued behind the long call
                time.sleep(0.002)
        assert lane.running, "the long call ended before the client left; lengthen it"
        first.join(60)  # the client is gone: its items are dropped when the next batch forms
        deadline = time.monotonic() + 5
        while lane.queued_items and time.monotonic() < deadline:
            time.sleep(0.002)
        assert answers[0].status_code == 200 and len(answers[0].json()["data"]) == 768
        dropped = state.metrics.registry.get_sample_value("uform_dropped_items_total", {"verb": "text_encode"})
        assert dropped == 3
        computed = state.metrics.registry.get_sample_value("uform_batch_items_sum", {"verb": "text_encode"})
        assert computed == 768  # the dropped items were never computed


def test_a_future_resolved_by_the_disconnect_drops_queued_jobs(model: uform.Model) -> None:
    """``gather`` given a future that resolves when the client leaves (the server's task
    awaiting ``http.disconnect``) drops the request's queued jobs."""
    import asyncio

    from uform.serve.batcher import Batcher
    from uform.serve.metrics import Metrics

    long = [(b"a long text about circles and squares " * 4)[:120] + str(i).encode() for i in range(768)]

    async def scenario() -> tuple[float | None, int]:
        loop = asyncio.get_running_loop()
        metrics = Metrics(lambda: 0.0)
        batcher = Batcher(model, ServeConfig(model_id="default"), metrics)
        lane = batcher.lanes["text"]
        first = batcher.submit(["text"] * len(long), long, [len(t) for t in long])
        while not lane.running:
            await asyncio.sleep(0.001)
        queued = batcher.submit(["text"] * 3, [b"one", b"two", b"three"], [3, 3, 5])
        disconnected: asyncio.Future[None] = loop.create_future()
        loop.call_later(0.01, disconnected.set_result, None)
        with pytest.raises(ConnectionError):
            await batcher.gather(queued, disconnected)
        left = lane.queued_items
        assert lane.running, "the long call ended before the disconnect; lengthen it"
        rows = await batcher.gather(first, None)
        assert len(rows[0]) == len(long)
        await batcher.close()
        return metrics.registry.get_sample_value("uform_dropped_items_total", {"verb": "text_encode"}), left

    dropped, left = asyncio.run(scenario())
    assert dropped == 3 and left == 0


def _answer(s: socket.socket) -> tuple[int, dict[str, str], dict[str, object]]:
    """The answer on ``s`` (read until the server closes it): status, headers, JSON body."""
    s.settimeout(30)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_bodies_still_arriving_are_bounded_over_all_connections_and_in_time(model: uform.Model) -> None:
    """Slow clients hold at most ``max_pending_body_bytes`` of unfinished bodies between them
    (the next is a 503 with Retry-After, its connection closed), and a body not whole within
    ``body_seconds`` is a 408; a body that arrives whole is never refused for what others hold."""
    config = ServeConfig(model_id="default", max_request_bytes=4096, max_pending_body_bytes=5000, body_seconds=2.0)
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
    part = b'{"input": ["' + b"x" * 2988
    with thread_server(model, config) as (url, state):
        deadline = time.monotonic() + 30

        def held(n: int) -> None:
            while state.bodies.held != n:
                assert time.monotonic() < deadline, f"the server holds {state.bodies.held} bytes of bodies, not {n}"
                time.sleep(0.002)

        with socket.create_connection(host_port(url)) as slow, socket.create_connection(host_port(url)) as late:
            slow.sendall(head + part)  # 3000 of 4000 bytes, then nothing
            held(3000)
            whole = httpx.post(url + "/v1/embeddings", json={"input": "a red circle"})
            assert whole.status_code == 200, whole.text
            late.sendall(head + part)  # 3000 more would hold 6000
            status, headers, body = _answer(late)
            assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
            error = body["error"]
            assert isinstance(error, dict) and (error["type"], error["code"]) == ("server_error", "server_busy")
            assert re.fullmatch(r"the server holds (3000|[3-5]\d{3}) bytes of request bodies still arriving, and this one's would pass the "
                                r"limit of 5000 \(--max-pending-body-bytes\); retry shortly", error["message"]), error  # fmt: skip
            held(3000)
            status, headers, body = _answer(slow)  # the rest never came
            assert (status, headers["connection"]) == (408, "close")
            assert body["error"] == {"message": "the request body did not arrive whole within 2 s (--body-timeout)", "type": "invalid_request_error",
                                     "param": None, "code": "body_timeout"}  # fmt: skip
        held(0)
        chunked = httpx.post(url + "/v1/embeddings", content=iter([b'{"input": ["' + b"y" * 2988, b'"]}']), headers={"content-type": "application/json"})
        assert chunked.status_code == 200, chunked.text
        assert state.bodies.held == 0
        requests = state.metrics.registry.get_sample_value
        assert requests("uform_requests_total", {"route": "/v1/embeddings", "status": "503"}) == 1
        assert requests("uform_requests_total", {"route": "/v1/embeddings", "status": "408"}) == 1


def test_the_pending_body_limit_and_the_body_timeout_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    from uform.cli import main

    assert ServeConfig().pending_body_bytes == 64 << 20
    assert ServeConfig(max_request_bytes=100 << 20).pending_body_bytes == 200 << 20  # one body of the largest size always fits
    assert main(["serve", "--max-pending-body-bytes", "1000"]) == 2  # refused before the model loads
    assert ("max-pending-body-bytes (1000) must be at least max-request-bytes (33554432): a body of the largest size could never be read"
            in capsys.readouterr().err)  # fmt: skip
    for value in ("0", "-1", "nan", "inf"):
        assert main(["serve", "--body-timeout", value]) == 2
        assert f"body-timeout must be a finite number of seconds over 0, got {float(value)}" in capsys.readouterr().err


def test_bad_items_of_several_requests_in_one_call_cost_a_bounded_number_of_calls(model: uform.Model) -> None:
    """Four requests each holding a corrupt picture, coalesced with a good one into one call:
    each bad request is a 400 naming its item, the good one gets the library's rows, and the
    items handed to the verb (``uform_called_items_total``) are the batch whole twice (the
    second time without the first bad request), then each request left alone: 16 + 14 + 12,
    where calling again without each bad request in turn handed 16 + 14 + 12 + 10 + 8."""
    import asyncio
    import base64

    import media as media_module

    picture = media_module.encode_image(media_module.pattern(48, 64), "PNG")
    good = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(picture).decode()}}
    corrupt = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()}}
    docs = [{"input": [good] * 8}] + [{"input": [good, corrupt]} for _ in range(4)]
    expected = np.array(model.image_encode([picture] * 8, uform.Arena()).embeddings)
    with thread_server(model, ServeConfig(model_id="default", batch_window_ms=1500)) as (url, state):

        async def all_at_once() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                return list(await asyncio.gather(*(client.post(url + "/v1/embeddings", json=doc) for doc in docs)))

        answers = asyncio.run(all_at_once())
        assert [a.status_code for a in answers] == [200, 400, 400, 400, 400], [a.text for a in answers]
        assert answers[0].headers["x-uform-batch-items"] == "16", "the requests were not coalesced into one call; lengthen the window"
        np.testing.assert_array_equal(np.array([d["embedding"] for d in answers[0].json()["data"]], np.float32), expected)
        for bad in answers[1:]:
            assert bad.json()["error"]["param"] == "input[1]" and bad.json()["error"]["code"] == "invalid_item", bad.text
        sample = state.metrics.registry.get_sample_value
        assert sample("uform_failed_items_total", {"verb": "image_encode"}) == 4
        assert sample("uform_called_items_total", {"verb": "image_encode"}) == 16 + 14 + 12
        assert f'uform_called_items_total{{verb="image_encode"}} {16 + 14 + 12:.1f}' in httpx.get(url + "/metrics").text
