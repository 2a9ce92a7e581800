"""``uform serve`` under hostile clients, over loopback: heads over their limits (431, 414)
refused before they are read whole, malformed HTTP and chunked bodies, connections past the
limit, heads and bodies that never arrive, clients that never read or reset, the drain's
deadline closing what still runs (no 500, no traceback), each answered and counted by name.
Hostile bodies: tests/test_serve_bodies.py. ``python tests/test_serve_hostile.py ...`` prints
the figures of docs/serve.md (tests/serve_figures.py)."""

from __future__ import annotations

import json
import re
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from serving import CHUNKED, exchange, host_port, Proc, subprocess_server


LONG = [("a long text about circles and squares " * 4)[:120] + str(i) for i in range(1024)]


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


def test_a_body_in_more_chunks_than_the_limit_is_413_and_one_under_it_is_answered() -> None:
    """A chunk costs the event loop alike whatever its size: 34 MB in chunks of one byte took 40 s
    of it to reach the 413 (/health answered in up to 357 ms meanwhile). Now a body in over
    chunks.MAX_CHUNKS (65,536) chunks is refused 413 when the chunk too many begins, counted
    once; one in 60,000 chunks is answered with the rows of the same
    body sent whole."""
    from uform.serve import chunks

    def framed(text: bytes) -> bytes:
        body = b'{"input": "' + text + b'"}'
        return b"".join(b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body))) + b"0\r\n\r\n"

    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    under, over = b"a" * (60_000 - 13), b"a" * (70_000 - 13)
    with subprocess_server([]) as server:
        before = requests_counted(server.url)
        status, doc = answer_of(exchange(server.url, head + framed(over))[1])
        time.sleep(0.5)  # the application sees its request's connection close
        after = requests_counted(server.url)
        with socket.create_connection(host_port(server.url), timeout=30) as s:
            s.sendall(head + framed(under))
            raw = b""
            while not (raw.count(b"\r\n\r\n") and raw.endswith(b"}")):
                raw += s.recv(1 << 20)
        whole = httpx.post(server.url + "/v1/embeddings", json={"input": under.decode()}).json()
    assert status == 413 and doc["error"] == {
        "message": "the request body is sent in over 65536 chunks, the limit of uform.serve.chunks.MAX_CHUNKS (each costs the server "
                   "alike whatever its size): send it in fewer, larger chunks, or with a Content-Length",
        "type": "invalid_request_error", "param": None, "code": "too_many_chunks"}, doc  # fmt: skip
    changed = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0) and key[0] != "/metrics"}
    assert changed == {("/v1/embeddings", "413"): 1}, changed
    assert raw.startswith(b"HTTP/1.1 200 ") and json.loads(raw.partition(b"\r\n\r\n")[2])["data"] == whole["data"], raw[:300]


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


if __name__ == "__main__":  # python tests/test_serve_hostile.py [COUNT [same-bytes] | head | slow [ARGS] | idle [ARGS] | chunked [ARGS] | values [ARGS]]: the figures of docs/serve.md
    import sys

    from serve_figures import chunked, huge_head, idle_connections, json_values, server_memory, slow_bodies

    what = sys.argv[1] if len(sys.argv) > 1 else "1"
    if what == "slow":
        print(slow_bodies(args=tuple(sys.argv[2:])))
    elif what == "idle":
        print(idle_connections(args=tuple(sys.argv[2:])))
    elif what == "chunked":
        print(chunked(tuple(sys.argv[2:])))
    elif what == "values":
        print(json_values(tuple(sys.argv[2:])))
    else:
        print(huge_head() if what == "head" else server_memory(int(what), sys.argv[2:] == ["same-bytes"]))
