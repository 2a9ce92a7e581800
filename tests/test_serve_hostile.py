"""``uform serve`` under hostile clients, over loopback: heads over their limits (431, 414)
refused before they are read whole, the drain's deadline closing what still runs (no 500,
no traceback), JSON nested too deep, a ``file://`` path that is not UTF-8, booleans as
token ids, and a temperature group out of range, each a JSON 400 naming what is wrong."""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

import media as media_module
import uform
from serving import Proc, host_port, subprocess_server, thread_server
from uform.serve import ServeConfig

LONG = [("a long text about circles and squares " * 4)[:120] + str(i) for i in range(1024)]


def exchange(url: str, data: bytes, chunk: int = 1 << 16, first: bytes = b"") -> tuple[int, bytes]:
    """Send ``data`` a chunk at a time until the server stops taking it; answer the bytes
    it took (sent before the connection refused more) and what it answered. ``first``: a
    request sent and answered on the connection before."""
    sent = 0
    with socket.create_connection(host_port(url), timeout=10) as s:
        early = b""
        if first:
            s.sendall(first)
            while b"\r\n\r\n" not in early or not early.endswith(b"}"):
                early += s.recv(65536)
        try:
            while sent < len(data):
                s.sendall(data[sent : sent + chunk])
                sent += chunk
        except OSError:  # the server closed: the rest was never read
            pass
        got = b""
        try:
            while part := s.recv(65536):
                got += part
        except OSError:
            pass
        return min(sent, len(data)), early + got


def answer_of(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head.split()[1]), json.loads(body)


@pytest.fixture(scope="module")
def limited() -> Iterator[Proc]:
    with subprocess_server(["--max-header-bytes", "4096", "--max-url-bytes", "1024", "--max-request-bytes", "2048"]) as proc:
        yield proc


def test_a_head_over_the_limit_is_431_before_it_is_read_whole(limited: Proc) -> None:
    huge = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"y" * (32 << 20) + b"\r\n\r\n"
    taken, raw = exchange(limited.url, huge)
    status, doc = answer_of(raw)
    assert status == 431 and doc["error"]["code"] == "headers_too_large" and "--max-header-bytes" in doc["error"]["message"]
    assert taken < 24 << 20, f"the server read {taken} bytes of a 32 MiB head"  # the limit, a lingering MiB, the sockets' buffers
    many = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(1000)) + b"\r\n"
    status, doc = answer_of(exchange(limited.url, many)[1])
    assert status == 431, doc
    # after a request with an Upgrade header (uvicorn answers it as HTTP, and reads on), the same
    upgrade = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: foo\r\n\r\n"
    taken, raw = exchange(limited.url, huge, first=upgrade)
    assert raw.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 431" in raw and taken < 24 << 20, raw[:300]
    # a head within the limit, before and after the refusals, and one cut across several writes
    assert httpx.get(limited.url + "/health", headers={"x-padding": "y" * 3000}).status_code == 200
    split = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"y" * 5000 + b"\r\n\r\n"
    status, doc = answer_of(exchange(limited.url, split, chunk=1000)[1])
    assert status == 431, doc


@pytest.mark.parametrize(("request_bytes", "reason"), [
    *[(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b'\r\n\r\n"abc"', "Invalid character in Content-Length")
      for length in (b"-5", b"+5", b"0x10")],
    (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n\"abc\"", "Invalid character in Content-Length"),
    (b"BREW /health HTTP/1.1\r\nHost: x\r\n\r\n", "Invalid method encountered"),
    (b"GET /health HTTP/1.1\r\nHost x\r\n\r\n", "Invalid header token"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "Invalid method encountered"),  # TLS to a plain-HTTP port
    (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "Invalid character in chunk size"),
])  # fmt: skip
def test_malformed_http_is_a_json_400_naming_the_reason(limited: Proc, request_bytes: bytes, reason: str) -> None:
    """As docs/serve.md says: what llhttp refuses is answered in OpenAI's error shape (not uvicorn's
    plain text), naming llhttp's reason, and the connection closed (answer_of checks)."""
    status, doc = answer_of(exchange(limited.url, request_bytes)[1])
    assert status == 400 and doc["error"] == {"message": f"the request is not valid HTTP: {reason}", "type": "invalid_request_error",
                                              "param": None, "code": "invalid_http"}, doc  # fmt: skip


def test_a_request_pipelined_after_one_that_closes_is_not_malformed(limited: Proc) -> None:
    """uvicorn reads past a ``Connection: close`` request (answering it and closing); the guard reads alike, no 400."""
    _, raw = exchange(limited.url, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200 ") and raw.count(b"HTTP/1.1 ") == 1, raw


CHUNKED = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


def sent_in_reads(url: str, pieces: list[bytes]) -> bytes:
    """Send each piece as a read of its own (a pause between), then nothing more; answer what
    the server answered before it closed (b"" if it did not within 10 s: the body timeout is 60 s)."""
    with socket.create_connection(host_port(url), timeout=10) as s:
        for piece in pieces:
            s.sendall(piece)
            time.sleep(0.2)
        got = b""
        try:
            while part := s.recv(65536):
                got += part
        except OSError:
            pass
        return got


@pytest.mark.parametrize("pieces", [
    [CHUNKED + b"174876e800\r\n{"],  # one chunk of 100 GB declared, with the head, a byte of it sent
    [CHUNKED, b"1748", b"76e800;name=value\r\n{"],  # its size line cut over reads, with an extension
    [CHUNKED + b"400\r\n" + b" " * 1024 + b"\r\n", b"401\r\n "],  # 1,024 + 1,025 bytes declared, over the limit of 2,048
], ids=["100GB", "split", "two-chunks"])  # fmt: skip
def test_a_chunked_body_declaring_more_than_the_limit_is_413_at_once(limited: Proc, pieces: list[bytes]) -> None:
    """Refused when the chunk size saying so arrives, not once 2,048 bytes did (or at --body-timeout,
    60 s, for a client trickling them), and counted once: as the 413, not also as a client that left (499)."""
    before = requests_counted(limited.url)
    status, doc = answer_of(sent_in_reads(limited.url, pieces))
    assert status == 413 and doc["error"] == {"message": "the request body is over the limit of 2048 bytes (--max-request-bytes)",
                                              "type": "invalid_request_error", "param": None, "code": "request_too_large"}, doc  # fmt: skip
    time.sleep(0.5)  # the application sees its request's connection close
    after = requests_counted(limited.url)
    changed = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0) and key[0] != "/metrics"}
    assert changed == {("/v1/embeddings", "413"): 1}, changed


def test_a_chunked_body_under_the_limit_is_answered_whatever_its_chunks() -> None:
    """Chunk sizes read by the guard are the body's: small chunks, extensions, a size line cut over
    reads, a chunk of the whole limit less the rest: answered 200 with the rows of the same body sent whole."""
    body = b'{"input": ["a red circle", "' + b"x" * 1900 + b'"]}'
    chunks = [body[:5], body[5:6], body[6:40], body[40:]]
    framed = b"".join(b"%x;ext=%d\r\n" % (len(c), i) + c + b"\r\n" for i, c in enumerate(chunks)) + b"0\r\n\r\n"
    with subprocess_server(["--max-request-bytes", str(len(body))]) as proc:
        raw = sent_in_reads(proc.url, [CHUNKED[:-2] + b"Connection: close\r\n\r\n", framed[:3], framed[3:50], framed[50:]])
        whole = httpx.post(proc.url + "/v1/embeddings", content=body).json()
    head, _, answer = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), raw[:300]
    assert json.loads(answer)["data"] == whole["data"]


def test_a_url_over_the_limit_is_414(limited: Proc) -> None:
    status, doc = answer_of(exchange(limited.url, b"GET /health?" + b"q" * 2000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")[1])
    assert status == 414 and doc["error"]["code"] == "url_too_long" and "--max-url-bytes" in doc["error"]["message"]
    assert httpx.get(limited.url + "/health?" + "q" * 900).status_code == 200


def requests_counted(url: str) -> dict[tuple[str, str], float]:
    """``uform_requests_total`` by (route, status), as /metrics says."""
    text = httpx.get(url + "/metrics").text
    found = re.findall(r'^uform_requests_total\{route="([^"]*)",status="(\d+)"\} (\S+)$', text, re.M)
    return {(route, status): float(n) for route, status, n in found}


def test_the_guards_refusals_are_counted_and_logged(limited: Proc) -> None:
    """A 431 or 414 never reaches the application, yet /metrics counts it under the route its path
    names (``other`` where the URL was cut before its path ended), and the access log has its line."""
    before = requests_counted(limited.url)
    heads = [b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"y" * 8000 + b"\r\n\r\n",  # 431, route /v1/embeddings
             b"GET /v1/models/default HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(1000)) + b"\r\n",  # 431, /v1/models
             b"GET /health?" + b"q" * 2000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # 414, /health
             b"GET /" + b"p" * 2000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"]  # 414, a path cut short: other  # fmt: skip
    assert [answer_of(exchange(limited.url, head)[1])[0] for head in heads] == [431, 431, 414, 414]
    after = requests_counted(limited.url)
    grown = {key: n - before.get(key, 0) for key, n in after.items() if n != before.get(key, 0)}
    assert grown == {("/v1/embeddings", "431"): 1, ("/v1/models", "431"): 1, ("/health", "414"): 1, ("other", "414"): 1,
                     ("/metrics", "200"): 1}  # fmt: skip
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any('"GET /pppp' in line for line in limited.lines):
        time.sleep(0.05)  # the access log is written every 0.1 s
    logged = [line for line in limited.lines if '" 431 ' in line or '" 414 ' in line]
    assert any('"POST /v1/embeddings" 431 ' in line for line in logged) and any('"GET /health" 414 ' in line for line in logged), logged
    assert any(line.split('"')[1].startswith("GET /pppp") and line.split('"')[1].endswith("...") for line in logged), logged


def read_all(s: socket.socket) -> bytes:
    """What the server sends on ``s`` until it closes it (waiting up to 30 s a read)."""
    s.settimeout(30)
    got = b""
    try:
        while part := s.recv(65536):
            got += part
    except ConnectionResetError:
        pass
    return got


def test_a_connection_past_max_connections_is_503_and_the_next_one_after_a_close_is_served() -> None:
    """Connections are counted: with three open (silent), a fourth is answered 503 at once and
    closed; once one of the three closes, a new client is served."""
    with subprocess_server(["--max-connections", "3", "--header-timeout", "600"]) as server:
        held = [socket.create_connection(host_port(server.url), timeout=30) for _ in range(3)]
        with socket.create_connection(host_port(server.url), timeout=30) as extra:
            raw = read_all(extra)
        status, doc = answer_of(raw)
        assert status == 503 and doc["error"]["code"] == "too_many_connections", raw
        assert "--max-connections" in doc["error"]["message"] and b"retry-after: 1" in raw.lower(), raw
        held.pop().close()
        for _ in range(100):  # the server sees the close when it next reads; until then a client is turned away
            with socket.create_connection(host_port(server.url), timeout=30) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                raw = read_all(s)
            if not raw.startswith(b"HTTP/1.1 503"):
                break
            time.sleep(0.1)
        assert raw.startswith(b"HTTP/1.1 200") and raw.endswith(b'"queued_items":0}'), raw
        for s in held:
            s.close()


def test_a_head_that_never_arrives_whole_is_408_and_a_kept_alive_connection_closes() -> None:
    """A client that connects and sends nothing, or part of a head, was held for good (uvicorn
    times only connections kept alive after an answer): now each is answered 408 and closed
    after --header-timeout; one kept alive after an answer closes after --keep-alive-seconds."""
    with subprocess_server(["--header-timeout", "1", "--keep-alive-seconds", "1", "--body-timeout", "1"]) as server:
        silent = socket.create_connection(host_port(server.url), timeout=30)
        partial = socket.create_connection(host_port(server.url), timeout=30)
        partial.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"y" * 1000)
        kept = socket.create_connection(host_port(server.url), timeout=30)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        for s in (silent, partial):
            status, doc = answer_of(read_all(s))
            assert status == 408 and doc["error"]["code"] == "header_timeout" and "--header-timeout" in doc["error"]["message"], doc
            s.close()
        raw = read_all(kept)  # the answer, then the close
        assert raw.startswith(b"HTTP/1.1 200") and raw.endswith(b'"queued_items":0}'), raw
        kept.close()
        assert httpx.get(server.url + "/health").status_code == 200


def test_a_body_the_server_never_reads_cannot_hold_the_connection_a_byte_at_a_time() -> None:
    """A request answered without reading its body (a 405 here) whose client then sends its
    declared body a byte now and then: each byte restarted uvicorn's keep-alive time, and the
    connection was held for good; now it is closed --header-timeout + --body-timeout after the
    request began."""
    with subprocess_server(["--header-timeout", "1", "--body-timeout", "1"]) as server:
        with socket.create_connection(host_port(server.url), timeout=30) as s:
            s.sendall(b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 30000000\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 405 "), "the answer without the body"
            for _ in range(600):  # up to 2 minutes of a byte every 0.2 s
                try:
                    s.sendall(b"x")
                except OSError:  # closed by the server
                    break
                time.sleep(0.2)
            else:
                pytest.fail("the connection was still open after 2 minutes of a byte every 0.2 s")


def test_a_client_that_never_reads_its_answers_is_cut_off_after_send_timeout() -> None:
    """Four requests of 2,048 texts pipelined and never read: the answers past what the sockets
    buffer waited in the server for good; now the connection is reset --send-timeout after the
    server could write no more (the client reads a reset, not every answer)."""
    body = json.dumps({"input": [f"text number {i}" for i in range(2048)]}).encode()
    request = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with subprocess_server(["--send-timeout", "1"]) as server:
        with socket.create_connection(host_port(server.url), timeout=30) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(request * 4)
            time.sleep(20)  # the four are computed, and the server's writes stall
            got, answers = b"", 0
            with pytest.raises(ConnectionResetError):
                while part := s.recv(1 << 20):
                    got += part
                answers = got.count(b"HTTP/1.1 200 ")  # read to the end: every answer came
            assert answers == 0
        assert httpx.get(server.url + "/health").status_code == 200


def test_a_client_that_resets_right_after_its_request_is_logged_and_counted_499_not_200() -> None:
    """A short request whose client resets the connection (SO_LINGER 0) as soon as it is sent:
    uvicorn drops the answer without a word, and the access log and the metrics said 200 (5 of
    5, ~2 ms each). Now each is a 499, in the log and in uform_requests_total alike; the server
    answers the next client."""
    body = json.dumps({"input": "a short text"}).encode()
    request = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with subprocess_server([]) as server:
        for _ in range(5):
            with socket.create_connection(host_port(server.url), timeout=10) as s:
                s.sendall(request)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() resets
            time.sleep(0.2)
        metrics = httpx.get(server.url + "/metrics").text
        assert httpx.post(server.url + "/v1/embeddings", json={"input": "a short text"}).status_code == 200
        time.sleep(0.3)  # the access log is written every 0.1 s
    logged = [line for line in server.lines if '"POST /v1/embeddings"' in line]
    assert len(logged) >= 2 and all(' 499 ' in line for line in logged[:-1]) and ' 200 ' in logged[-1], logged
    counted = re.search(r'uform_requests_total\{route="/v1/embeddings",status="499"\} (\d+)', metrics)
    assert counted is not None and int(counted.group(1)) == len(logged) - 1, metrics
    assert 'route="/v1/embeddings",status="200"' not in metrics, metrics


def test_the_drain_deadline_closes_what_still_runs_without_a_500_or_a_traceback() -> None:
    args = ["--drain-seconds", "0.5", "--max-items", "16384", "--max-queue-items", "16384", "--max-batch-items", "16384", "--max-batch-tokens", "100000000"]
    with subprocess_server(args) as server:
        outcome: list[Any] = []

        def send() -> None:
            try:
                outcome.append(httpx.post(server.url + "/v1/embeddings", json={"input": LONG * 16}, timeout=60))
            except httpx.HTTPError as exc:
                outcome.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the long request's items were received
            if 'uform_items_total{modality="text"} 16384.0' in httpx.get(server.url + "/metrics").text:
                break
            time.sleep(0.01)
        with socket.create_connection(host_port(server.url), timeout=10) as half:  # a body that never comes whole
            half.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"in")
            time.sleep(0.1)
            server.proc.send_signal(signal.SIGTERM)
            got = b""
            while part := half.recv(65536):
                got += part
        sender.join(30)
        assert server.proc.wait(20) == 0
        time.sleep(0.2)  # the log reader's last lines
    assert got == b"", got  # the connection closed, no answer
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.RemoteProtocolError), outcome  # closed without an answer
    log = "".join(server.lines)
    assert "Traceback" not in log and "CancelledError" not in log and "Exception in ASGI" not in log, log
    assert log.count('"POST /v1/embeddings" 499') == 2, log


# -- bodies: one in-process server --------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Iterator[uform.Model]:
    with uform.Model.load_ram() as m:
        yield m


@pytest.fixture(scope="module")
def served(model: uform.Model, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("media")
    with thread_server(model, ServeConfig(model_id="default", media_root=root)) as (url, _):
        yield url, root


def post(url: str, body: bytes, path: str = "/v1/embeddings") -> httpx.Response:
    return httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=30)


def error_of(answer: httpx.Response) -> dict[str, Any]:
    assert answer.headers["content-type"] == "application/json", answer.text
    return answer.json()["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "body",
    [  # orjson refuses the lone surrogate, so the standard library reads the rest, 1,024 levels deep
        b'{"input": "\\ud800", "x": ' + b"[" * 1024 + b"]" * 1024 + b"}",
        b'{"input": "x", "dimensions": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # a value nested past any repr
        b'{"input": [{"type": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
    ],
    ids=["fallback-1024-deep", "dimensions-100000-deep", "part-type-100000-deep"],
)
def test_json_nested_too_deep_is_a_400_naming_the_body(served: tuple[str, Path], body: bytes) -> None:
    answer = post(served[0], body)
    error = error_of(answer)
    assert answer.status_code == 400 and error["code"] in ("invalid_json", "invalid_value", "invalid_item"), error
    assert "nested too deep" in error["message"] or "a list" in error["message"], error


def test_a_file_path_that_is_not_utf8_is_named_escaped(served: tuple[str, Path]) -> None:
    url, root = served
    missing = json.dumps({"input": ["fine", {"type": "image_url", "image_url": {"url": f"file://{root}/a\udc80.png"}}]}).encode()
    answer = post(url, missing)  # the JSON holds "\udc80": a lone surrogate escape, the byte 0x80 of a file name
    error = error_of(answer)
    assert answer.status_code == 400 and error["param"] == "input[1]" and f"no such file {root}/a\\x80.png" in error["message"], error
    picture = media_module.encode_image(media_module.pattern(40, 50), "PNG")
    name = os.fsencode(str(root)) + b"/b\x80.png"
    with open(name, "wb") as f:
        f.write(picture)
    found = json.dumps({"input": [{"type": "image_url", "image_url": {"url": f"file://{root}/b\udc80.png"}}]}).encode()
    as_data = json.dumps({"input": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(picture).decode()}}]})
    assert post(url, found).json()["data"] == post(url, as_data.encode()).json()["data"]  # the file is served by its bytes' name
    lone = json.dumps({"input": [{"type": "image_url", "image_url": {"url": f"file://{root}/c\ud800.png"}}]}).encode()
    error = error_of(post(url, lone))
    assert error["param"] == "input[0]" and "c\\ud800.png is not a file name" in error["message"], error


@pytest.mark.parametrize(
    "route, body",
    [  # orjson reads no integer past a double, so the standard library reads it, which converts at most 4,300 digits
        ("/v1/embeddings", b'{"input": "x", "dimensions": ' + b"9" * 5000 + b"}"),
        ("/v1/embeddings", b'{"input": [' + b"1" * 5000 + b"]}"),
        ("/v1/choose", b'{"input": "x", "choices": "yn", "temperature_groups": [' + b"9" * 5000 + b"]}"),
    ],
    ids=["dimensions", "token-id", "temperature-group"],
)
def test_an_integer_too_long_to_convert_is_a_400_not_a_500(served: tuple[str, Path], route: str, body: bytes) -> None:
    answer = post(served[0], body, route)
    error = error_of(answer)
    assert answer.status_code == 400 and error["code"] == "invalid_json", error
    assert error["message"] == "the body holds an integer of more than 4300 digits, longer than this server reads"


def test_a_long_integer_under_the_limit_is_not_written_out_whole(served: tuple[str, Path]) -> None:
    error = error_of(post(served[0], b'{"input": "x", "dimensions": ' + b"9" * 1000 + b"}"))
    assert error["message"] == "'dimensions' is a huge integer, but this model's embeddings have 64", error


@pytest.mark.parametrize("scheme", ["file:", "FILE:", "\\u0066ile:"])
def test_a_file_url_is_read_off_the_event_loop_however_it_is_spelled(served: tuple[str, Path], scheme: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from uform.serve import parts

    url, root = served
    (root / "read.png").write_bytes(media_module.encode_image(media_module.pattern(40, 50), "PNG"))
    readers: list[str] = []

    def read_under(path: str, media_root: Path, limit: int) -> bytes:  # the server's own reading, its thread noted
        readers.append(threading.current_thread().name)
        return original(path, media_root, limit)

    original = parts.read_under
    monkeypatch.setattr(parts, "read_under", read_under)
    body = b'{"input": [{"type": "image_url", "image_url": {"url": "' + scheme.encode() + b"//" + str(root).encode() + b'/read.png"}}]}'
    answer = post(url, body)
    assert answer.status_code == 200, answer.text
    assert len(readers) == 1 and readers[0].startswith("uform-serve"), readers  # a thread of the server's pool, not the loop's


@pytest.mark.parametrize("tokens", [[[True, True]], [[104, True]], [[104, 105], [False]]])
def test_booleans_are_never_token_ids(served: tuple[str, Path], tokens: list[Any]) -> None:
    answer = post(served[0], json.dumps({"input": tokens}).encode())
    error = error_of(answer)
    bad = next(i for i, t in enumerate(tokens) if any(isinstance(v, bool) for v in t))
    assert answer.status_code == 400 and error["param"] == f"input[{bad}]" and "not booleans" in error["message"], error


@pytest.mark.parametrize("groups", [[-1], [3], [0, 99]])
def test_a_temperature_group_out_of_range_is_invalid_value(served: tuple[str, Path], groups: list[int]) -> None:
    texts = ["a red circle. Is it red? Answer y or n: "] * len(groups)
    answer = post(served[0], json.dumps({"input": texts, "choices": "yn", "temperature_groups": groups}).encode(), "/v1/choose")
    error = error_of(answer)
    bad = next(i for i, g in enumerate(groups) if not 0 <= g < 3)  # the default model has 3 groups
    assert answer.status_code == 400 and error["code"] == "invalid_value" and error["param"] == f"temperature_groups[{bad}]", error
    assert f"temperature group {groups[bad]} is out of range" in error["message"]


def _server_memory(count: int, same_bytes: bool = False) -> str:
    """Resident memory of ``uform serve`` (the default model) around one request of ``count``
    copies of the worst legal picture: a 10000×10000 16-bit RGBA PNG (100 M pixels); with
    ``same_bytes``, a request of as many bytes whose picture is small (noise, 1 M pixels): what
    the request's own bytes cost."""
    import numpy as np
    from test_image_memory import png16_rgba

    def status(pid: int) -> dict[str, int]:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "VmHWM")}

    png = png16_rgba(10000, 10000, every=10000)  # one row, repeated: 3.6 MB of file
    if same_bytes:  # 1000 rows of stored (uncompressed) RGBA noise, as many bytes
        noise = np.random.default_rng(0).integers(0, 256, (1000, len(png) // 4000, 4), dtype=np.uint8)
        png = media_module.encode_image(noise, "PNG", compress_level=0)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    with subprocess_server(["--max-request-bytes", str(max(32 << 20, count * 6 << 20))]) as server:
        small = "data:image/png;base64," + base64.b64encode(png16_rgba(64, 48)).decode()  # the image tower's first run, the threads
        assert httpx.post(server.url + "/v1/embeddings", json={"input": [{"type": "image_url", "image_url": {"url": small}}] * 4}).status_code == 200
        Path(f"/proc/{server.proc.pid}/clear_refs").write_text("5")  # its high-water mark starts again from here
        before = status(server.proc.pid)
        began = time.monotonic()
        answer = httpx.post(server.url + "/v1/embeddings", json={"input": [{"type": "image_url", "image_url": {"url": url}}] * count}, timeout=600)
        took = time.monotonic() - began
        assert answer.status_code == 200, answer.text
        after = status(server.proc.pid)
    picture = "1000x895 RGBA noise PNG" if same_bytes else "10000x10000 16-bit RGBA PNG"
    return (f"{count} x {picture} ({len(png) / 1e3:.0f} KB each): {took:.1f} s, RSS {before['VmRSS'] / 1e6:.0f} MB before, "
            f"peak {after['VmHWM'] / 1e6:.0f} MB (+{(after['VmHWM'] - before['VmRSS']) / 1e6:.0f} MB), {after['VmRSS'] / 1e6:.0f} MB after")


def rss_mb(pid: int) -> float:
    """Process ``pid``'s resident memory now, in MB."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _huge_head() -> str:
    """What a 96 MiB header costs ``uform serve`` (default limits): bytes it took, its answer, its CPU and RSS."""
    with subprocess_server([]) as server:
        pid = server.proc.pid

        def cpu() -> float:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        rss = functools.partial(rss_mb, pid)
        began, cpu0, rss0 = time.monotonic(), cpu(), rss()
        taken, raw = exchange(server.url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"y" * (96 << 20) + b"\r\n\r\n")
        return (f"a 96 MiB header: the server took {taken / 1e6:.1f} MB of it and answered {raw.split(b' ')[1].decode()} in "
                f"{time.monotonic() - began:.2f} s, {cpu() - cpu0:.2f} s of its CPU, RSS {rss0:.0f} -> {rss():.0f} MB")


def _slow_bodies(clients: int = 8, sent: int = 29 << 20, declared: int = 30 << 20, args: tuple[str, ...] = ()) -> str:
    """What ``clients`` clients cost ``uform serve`` (the default model, default limits and
    ``args``) when each sends ``sent`` bytes of a ``declared``-byte body and waits: RSS before,
    while they wait, and the answers they got."""
    with subprocess_server(list(args)) as server:
        pid = server.proc.pid
        rss = functools.partial(rss_mb, pid)
        assert httpx.post(server.url + "/v1/embeddings", json={"input": "warm up"}).status_code == 200
        before = rss()
        head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n").encode()
        chunk = b'{"input": ["' + b"x" * ((1 << 20) - 12)
        socks, answers = [], []
        for _ in range(clients):
            s = socket.create_connection(host_port(server.url), timeout=30)
            s.sendall(head)
            try:
                for at in range(0, sent, 1 << 20):
                    s.sendall(chunk if at == 0 else b"x" * min(1 << 20, sent - at))
            except OSError:  # refused and closed
                pass
            socks.append(s)
        time.sleep(2)  # everything sent has been read
        held = rss()
        for s in socks:
            s.settimeout(0.5)
            try:
                got = s.recv(65536)
            except (TimeoutError, OSError):
                got = b""
            answers.append(got.split(b" ", 2)[1].decode() if got.startswith(b"HTTP/1.1 ") else "none yet")
            s.close()
        time.sleep(1)
        after = rss()
    return (f"{clients} clients each sending {sent / 2**20:.0f} MiB of a {declared / 2**20:.0f} MiB body and waiting"
            f"{' (' + ' '.join(args) + ')' if args else ''}: RSS {before:.0f} MB before, {held:.0f} MB while they wait "
            f"(+{held - before:.0f} MB), {after:.0f} MB after they closed; answers: {', '.join(answers)}")


def _idle_connections(count: int = 2000, wait: float = 15, args: tuple[str, ...] = ()) -> str:
    """What ``count`` idle connections cost ``uform serve`` (the default model, default limits and
    ``args``): a third silent, a third with 60 KB of a head, a third kept alive after an answer;
    RSS before and while they are open, and how many the server closed within ``wait`` s."""
    with subprocess_server(list(args)) as server:
        pid = server.proc.pid
        rss = functools.partial(rss_mb, pid)
        assert httpx.post(server.url + "/v1/embeddings", json={"input": "warm up"}).status_code == 200
        before = rss()
        kinds: dict[str, list[socket.socket]] = {"silent": [], "part of a head": [], "kept alive": []}
        for i in range(count):
            kind, s = list(kinds)[i % 3], socket.create_connection(host_port(server.url), timeout=30)
            s.sendall(b"" if kind == "silent" else b"GET /health HTTP/1.1\r\nHost: x\r\n" + (b"X-Pad: " + b"y" * 60000 if kind != "kept alive" else b"\r\n"))
            kinds[kind].append(s)
        time.sleep(1)
        held = rss()
        time.sleep(wait)
        closed = {}
        for kind, socks in kinds.items():
            gone = 0
            for s in socks:
                s.setblocking(False)
                try:
                    while part := s.recv(1 << 20):  # an answer, then the close
                        pass
                    gone += 1
                except BlockingIOError:
                    pass
                except OSError:
                    gone += 1
                s.close()
            closed[kind] = f"{gone}/{len(socks)}"
    return (f"{count} idle connections{' (' + ' '.join(args) + ')' if args else ''}: RSS {before:.0f} MB before, {held:.0f} MB while open "
            f"(+{held - before:.0f} MB); closed by the server within {wait:g} s: " + ", ".join(f"{k} {v}" for k, v in closed.items()))


def _chunked(args: tuple[str, ...] = ()) -> str:
    """A chunked body declaring one chunk of 100 GB, sent a byte a second (for up to 70 s) and as
    fast as it goes (64 MiB at most), the server's peak RSS; then 2 Mi one-byte chunks and the
    server CPU they took; then the guard's own time a 121-byte request, handed to it 200,000 times,
    and for a 32 MiB body in reads of 256 KiB."""
    head = CHUNKED + b"%x\r\n" % (100 * 10**9)
    lines = []
    with subprocess_server(list(args)) as proc:

        def peak() -> float:
            return int(re.findall(r"VmHWM:\s+(\d+)", Path(f"/proc/{proc.proc.pid}/status").read_text())[0]) / 1000

        def cpu() -> float:
            fields = Path(f"/proc/{proc.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        before = peak()
        for name, fast in (("a byte a second", False), ("as fast as it goes", True)):
            began, got = time.monotonic(), b""
            with socket.create_connection(host_port(proc.url)) as s:
                s.sendall(head)
                s.settimeout(1)
                try:
                    if fast:
                        for _ in range(64):
                            s.sendall(b"x" * (1 << 20))
                    while b"\r\n\r\n" not in got and time.monotonic() - began < 70:
                        try:
                            got += s.recv(65536)
                        except socket.timeout:
                            s.sendall(b"x")
                except OSError:
                    got += s.recv(65536) if not got else b""
            status = got.split(b"\r\n")[0].decode()
            lines.append(f"100 GB chunk, {name}: {status} after {time.monotonic() - began:.2f} s")
        lines.append(f"peak RSS {before:.0f} -> {peak():.0f} MB")
        framed = b"1\r\nx\r\n" * (2 << 20) + b"0\r\n\r\n"
        used = cpu()
        with socket.create_connection(host_port(proc.url)) as s:
            s.sendall(CHUNKED[:-2] + b"Connection: close\r\n\r\n" + framed)
            status = s.recv(65536).split(b"\r\n")[0].decode()
        lines.append(f"2 Mi one-byte chunks: {status}, server CPU {cpu() - used:.2f} s")
    import asyncio

    from uform.serve import guard

    class Nothing(asyncio.Protocol):
        def __init__(self, **kwargs: Any) -> None:
            pass

    async def per_request() -> float:
        one = guarded_class(Nothing)()
        one.transport = cast(Any, type("T", (), {"get_extra_info": lambda self, key: None, "is_closing": lambda self: False})())
        request = b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\nContent-Length: 26\r\n\r\n"
        request += b'{"input": ["a red circle"]'
        began = time.process_time()
        for _ in range(200_000):
            one.data_received(request)
        return (time.process_time() - began) / 200_000 * 1e6

    def guarded_class(inner: type[asyncio.Protocol]) -> type[guard.Guard]:
        return guard.guarded(inner, 8192, 65536, guard.Connections(), None, 32 << 20)

    lines.append("the guard, a %d-byte request: %s us" % (121, ", ".join(f"{asyncio.run(per_request()):.2f}" for _ in range(3))))

    async def big_body() -> float:  # 32 MiB of Content-Length body in reads of 256 KiB
        one = guarded_class(Nothing)()
        one.transport = cast(Any, type("T", (), {"get_extra_info": lambda self, key: None, "is_closing": lambda self: False})())
        read = b"x" * (256 << 10)
        began = time.process_time()
        one.data_received(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (32 << 20))
        for _ in range(128):
            one.data_received(read)
        return (time.process_time() - began) * 1000

    lines.append("the guard, a 32 MiB body: %s ms" % ", ".join(f"{asyncio.run(big_body()):.2f}" for _ in range(3)))
    return "\n".join(lines)


if __name__ == "__main__":  # python tests/test_serve_hostile.py [COUNT [same-bytes] | head | slow [ARGS] | idle [ARGS] | chunked [ARGS]]: the figures of docs/serve.md
    import sys

    what = sys.argv[1] if len(sys.argv) > 1 else "1"
    if what == "slow":
        print(_slow_bodies(args=tuple(sys.argv[2:])))
    elif what == "idle":
        print(_idle_connections(args=tuple(sys.argv[2:])))
    elif what == "chunked":
        print(_chunked(tuple(sys.argv[2:])))
    else:
        print(_huge_head() if what == "head" else _server_memory(int(what), sys.argv[2:] == ["same-bytes"]))
