"""``uform serve`` over real HTTP on loopback, the server in a subprocess with the default
model: the official ``openai`` client unchanged, every modality in one request equal to the
library's verbs, ``file://`` under ``--media-root`` only, errors in OpenAI's shape, the
``text_choose`` route, models, health, metrics and timing headers, and a bounded load test."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import media as media_module
import uform
from serving import Conn, Proc, host_port, subprocess_server
from uform.cli import main
from uform.demo import write_media

IMAGE = media_module.encode_image(media_module.pattern(48, 64), "PNG")
IMAGE_URL = "data:image/png;base64," + base64.b64encode(IMAGE).decode()
TEXTS = ["a red circle", "a blue square moving up", "ünïcödé text", "x" * 300]


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("media")
    inside = root / "served"
    items = write_media(inside, per_modality=2)
    found = {f"{i.modality}{n % 2}": Path(i.path) for n, i in enumerate(items)}
    outside = root / "secret.png"
    outside.write_bytes(found["image0"].read_bytes())
    (inside / "escape.png").symlink_to(outside)
    found["root"], found["outside"] = inside, outside
    return found


@pytest.fixture(scope="module")
def server(media: dict[str, Path]) -> Iterator[Proc]:
    with subprocess_server(["--media-root", str(media["root"]), "--max-items", "64"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def model() -> Iterator[uform.Model]:
    with uform.Model.load_ram() as m:
        yield m


def data_url(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def post(server: Proc, doc: Any, path: str = "/v1/embeddings") -> httpx.Response:
    return httpx.post(server.url + path, json=doc, timeout=30)


def test_openai_client_float_base64_and_dimensions(server: Proc, model: uform.Model) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    expected = np.array(model.text_encode(TEXTS, uform.Arena()).embeddings)
    default = client.embeddings.create(model="default", input=TEXTS)  # the client asks for base64
    floats = client.embeddings.create(model="default", input=TEXTS, encoding_format="float")
    for answer in (default, floats):
        rows = np.array([d.embedding for d in answer.data], np.float32)
        assert [d.index for d in answer.data] == list(range(len(TEXTS)))
        np.testing.assert_array_equal(rows, expected)  # the same path: bit-equal
    assert floats.usage.prompt_tokens == sum(min(len(t.encode()), 128) for t in TEXTS)
    short = client.embeddings.create(model="default", input=TEXTS[0], dimensions=16)
    prefix = expected[0, :16] / np.linalg.norm(expected[0, :16])
    got = np.array(short.data[0].embedding)
    assert got.shape == (16,) and float(got @ prefix) >= 0.9999
    assert client.models.list().data[0].id == "default"
    picture = client.embeddings.create(model="default", input=["a red circle", {"type": "image_url", "image_url": {"url": IMAGE_URL}}])  # type: ignore[list-item]
    np.testing.assert_array_equal(np.array(picture.data[1].embedding, np.float32), model.image_encode([IMAGE], uform.Arena()).embeddings[0])
    with pytest.raises(openai.BadRequestError, match="remote URLs are refused"):
        client.embeddings.create(model="default", input=[{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])  # type: ignore[list-item]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="x")


def test_token_ids_are_bytes(server: Proc, model: uform.Model) -> None:
    expected = np.array(model.text_encode([b"hello", b"\xff\x00"], uform.Arena()).embeddings)
    answer = post(server, {"input": [list(b"hello"), [255, 0]]}).json()
    np.testing.assert_array_equal(np.array([d["embedding"] for d in answer["data"]], np.float32), expected)
    one = post(server, {"input": list(b"hello")}).json()
    np.testing.assert_array_equal(np.array(one["data"][0]["embedding"], np.float32), expected[0])
    bad = post(server, {"input": [[1, 2], [300]]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]"


def test_every_modality_in_one_request(server: Proc, model: uform.Model, media: dict[str, Path]) -> None:
    arena = uform.Arena()
    parts = [
        "a red circle",
        {"type": "image_url", "image_url": {"url": data_url(media["image0"], "image/png")}},
        {"type": "video_url", "video_url": {"url": data_url(media["video0"], "video/mp4")}},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(media["audio0"].read_bytes()).decode(), "format": "wav"}},
        {"type": "image_url", "image_url": {"url": "file://" + str(media["image1"])}},
        {"type": "audio_url", "audio_url": {"url": "file://" + str(media["audio1"])}},
        {"type": "text", "text": "a green square"},
        {"type": "video_url", "video_url": {"url": data_url(media["video1"], "video/webm")}},
    ]
    answer = post(server, {"input": parts, "model": "default", "encoding_format": "base64"})
    assert answer.status_code == 200, answer.text
    rows = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in answer.json()["data"]])
    texts = np.array(model.text_encode(["a red circle", "a green square"], arena).embeddings)
    images = np.array(model.image_encode([str(media["image0"]), str(media["image1"])], arena).embeddings)
    videos = np.array(model.video_encode([str(media["video0"]), str(media["video1"])], arena).embeddings)
    audio = np.array(model.audio_encode([str(media["audio0"]), str(media["audio1"])], arena).embeddings)
    expected = np.stack([texts[0], images[0], videos[0], audio[0], images[1], audio[1], texts[1], videos[1]])
    np.testing.assert_array_equal(rows, expected)


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ({"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}, "remote URLs are refused"),
        ({"type": "image_url", "image_url": {"url": "http://127.0.0.1/cat.jpg"}}, "remote URLs are refused"),
        ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}, "outside the media root"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "bad base64"),
        ({"type": "image_url", "image_url": {"url": "data:video/mp4;base64,AAAA"}}, "given as image"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAAAAAA"}}, "not a JPEG, PNG or WebP image"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "midi"}}, "format 'midi'"),
        ({"type": "hologram"}, "unknown content part type"),
        ({"type": "text"}, "needs 'text'"),
        ("", "the text is empty"),
        (3.5, "not float"),
    ],
)
def test_a_bad_item_is_a_400_naming_it(server: Proc, item: Any, reason: str) -> None:
    answer = post(server, {"input": ["fine", "also fine", item]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "input[2]" and error["message"].startswith("input[2]: ") and reason in error["message"], error
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


def test_media_root_escapes_are_refused(server: Proc, media: dict[str, Path]) -> None:
    root = media["root"]
    for url in ("file://" + str(root / "escape.png"), "file://" + str(root / ".." / "secret.png"), "file://" + str(media["outside"])):
        answer = post(server, {"input": [{"type": "image_url", "image_url": {"url": url}}]})
        assert answer.status_code == 400 and "outside the media root" in answer.json()["error"]["message"], url
    missing = post(server, {"input": [{"type": "image_url", "image_url": {"url": "file://" + str(root / "nope.png")}}]})
    assert missing.status_code == 400 and "no such file" in missing.json()["error"]["message"]
    folder = post(server, {"input": [{"type": "image_url", "image_url": {"url": "file://" + str(root)}}]})
    assert folder.status_code == 400 and "not a regular file" in folder.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b"{}", 400, "'input' is required"),
        (b'{"input": []}', 400, "'input' is empty"),
        (b'{"input": 5}', 400, "must be a string or an array"),
        (b'{"input": "x", "encoding_format": "int8"}', 400, "'encoding_format'"),
        (b'{"input": "x", "dimensions": 0}', 400, "'dimensions'"),
        (b'{"input": "x", "dimensions": 65}', 400, "embeddings have 64"),
        (json.dumps({"input": ["x"] * 65}).encode(), 400, "over the limit of 64"),
    ],
)
def test_malformed_requests(server: Proc, body: bytes, status: int, says: str) -> None:
    answer = httpx.post(server.url + "/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == status and says in answer.json()["error"]["message"], answer.text


def test_choose_route_equals_text_choose(server: Proc, model: uform.Model) -> None:
    texts = ["a red circle. Is it red? Answer y or n: ", "a blue square. Is it red? Answer y or n: ", "Which? A) x B) y. Answer:"]
    choices = ["yn", "yn", "AB"]
    tape = model.text_choose(texts, choices, uform.Arena(), temperature_groups=[0, 0, 1])
    answer = post(server, {"input": texts, "choices": choices, "temperature_groups": [0, 0, 1]}, "/v1/choose")
    assert answer.status_code == 200, answer.text
    for i, row in enumerate(answer.json()["data"]):
        assert row["choices"] == choices[i]
        np.testing.assert_array_equal(np.array(row["probabilities"], np.float32), tape[i])
    shared = post(server, {"input": texts[:2], "choices": "yn"}, "/v1/choose").json()
    assert len(shared["data"]) == 2
    bad = post(server, {"input": ["a", "b"], "choices": ["yn", "yy"]}, "/v1/choose")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "choices[1]", bad.text
    bad = httpx.post(server.url + "/v1/choose", content=b'{"input": ["a", "\\ud800"], "choices": "yn"}')  # a lone surrogate
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]", bad.text


def test_models_health_metrics_and_timing_headers(server: Proc) -> None:
    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert card["id"] == "default" and card["modalities"] == ["audio", "choose", "image", "text", "video"]
    assert "video_encode" in card["verbs"] and card["dimensions"] == 64
    assert httpx.get(server.url + "/v1/models/default").json()["id"] == "default"
    assert httpx.get(server.url + "/v1/models/other").status_code == 404
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    answer = post(server, {"input": ["timing"]})
    for header in ("x-uform-queue-ms", "x-uform-inference-ms", "x-uform-total-ms"):
        assert float(answer.headers[header]) >= 0
    assert float(answer.headers["x-uform-total-ms"]) >= float(answer.headers["x-uform-inference-ms"])
    assert "inference;dur=" in answer.headers["server-timing"] and int(answer.headers["x-uform-batch-items"]) >= 1
    text = httpx.get(server.url + "/metrics").text
    assert 'uform_requests_total{route="/v1/embeddings",status="200"}' in text
    assert 'uform_items_total{modality="text"}' in text and "uform_queue_items" in text
    assert 'uform_batch_items_count{verb="text_encode"}' in text and 'uform_inference_seconds_bucket{le="0.001",verb="text_encode"}' in text
    assert httpx.get(server.url + "/nowhere").json()["error"]["code"] == "not_found"
    deadline = time.monotonic() + 5  # a line per request, written every 0.1 s
    while not any('"POST /v1/embeddings" 200 ' in line for line in server.lines) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any('"POST /v1/embeddings" 200 ' in line for line in server.lines)


def test_the_documented_curl_examples_run_as_written(server: Proc, tmp_path: Path) -> None:
    """docs/serve.md's curl examples, word for word but for the server's address, in a folder
    where ``uform demo-media demo`` wrote its media (the ``file:///srv/media`` one is left out:
    it needs that folder)."""
    page = (Path(__file__).parent.parent / "docs" / "serve.md").read_text()
    block = page.split("## Examples", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [c for c in block.split("\n\n") if "file:///srv/media" not in c]
    assert len(commands) == 4, commands
    assert main(["demo-media", str(tmp_path / "demo")]) == 0
    script = "\n\n".join(commands).replace("http://127.0.0.1:8000", server.url)
    ran = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and not ran.stderr, ran.stderr
    assert '"error"' not in ran.stdout and ran.stdout.count('{"object":"list","data":[') == 3, ran.stdout[:2000]
    assert ran.stdout.count('"object":"embedding"') == 5 and '"object":"choice_probabilities"' in ran.stdout
    assert 'uform_batch_items_count{verb="audio_encode"} ' in ran.stdout


def test_a_path_cannot_write_lines_or_escapes_into_the_access_log(server: Proc) -> None:
    forged = '127.0.0.1:1 "POST /v1/embeddings" 200 0.01ms'
    assert httpx.get(server.url + "/v1/models/x%0A" + forged.replace(" ", "%20").replace('"', "%22")).status_code == 404
    assert httpx.get(server.url + "/nowhere%1B%5B31m%C3%A9").status_code == 404
    wanted = ['"GET /v1/models/x%0A127.0.0.1%3A1%20%22POST%20/v1/embeddings%22%20200%200.01ms" 404 ', '"GET /nowhere%1B%5B31m%C3%A9" 404 ']
    deadline = time.monotonic() + 5  # a line per request, written every 0.1 s
    while not all(any(w in line for line in server.lines) for w in wanted) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(any(w in line for line in server.lines) for w in wanted), server.lines[-5:]
    assert not any(line.startswith(forged) or "\x1b" in line for line in server.lines)


def test_embeddings_response_on_the_wire(server: Proc, model: uform.Model) -> None:
    """A 200 from /v1/embeddings on the wire: uvicorn's head (date and server first, then
    content-type, length and the timing headers), the body byte for byte what orjson writes
    for it, and the connection kept alive."""
    import orjson

    from uform.serve.respond import embeddings_body

    async def run() -> list[tuple[int, dict[str, str], bytes]]:
        conn = Conn(*host_port(server.url))
        try:
            out = []
            for doc in ({"input": "one write", "encoding_format": "base64"}, {"input": ["a", "b"], "encoding_format": "float"},
                        {"input": "one write", "encoding_format": "base64", "dimensions": 8}):  # fmt: skip
                out.append(await conn.request("POST", "/v1/embeddings", json.dumps(doc).encode()))
            return out
        finally:
            await conn.close()

    (s1, h1, b1), (s2, h2, b2), (s3, h3, b3) = asyncio.run(run())  # one connection, three requests
    assert (s1, s2, s3) == (200, 200, 200)
    for head in (h1, h2, h3):
        assert list(head)[:5] == ["date", "server", "content-type", "content-length", "x-uform-queue-ms"], head
        assert head["content-type"] == "application/json" and "connection" not in head
        assert head["server-timing"].startswith("queue;dur=") and int(head["x-uform-batch-items"]) >= 1
    rows = np.array(model.text_encode(["one write"], uform.Arena()).embeddings)
    doc = orjson.loads(b1)
    assert np.array_equal(np.frombuffer(base64.b64decode(doc["data"][0]["embedding"]), "<f4"), rows[0])
    assert b1 == embeddings_body(rows, "base64", doc["model"], 9)
    assert len(orjson.loads(b2)["data"]) == 2 and len(np.frombuffer(base64.b64decode(orjson.loads(b3)["data"][0]["embedding"]), "<f4")) == 8
    many = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    expected = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": base64.b64encode(r.tobytes()).decode()} for i, r in enumerate(many)],
                "model": 'm"x', "usage": {"prompt_tokens": 7, "total_tokens": 7}}  # fmt: skip
    assert embeddings_body(many, "base64", 'm"x', 7) == orjson.dumps(expected)  # the template is orjson's own bytes


def test_load_32_clients_coalesced_bad_items_isolated(server: Proc, model: uform.Model, media: dict[str, Path]) -> None:
    """32 clients × 50 requests of texts and pictures, every 7th carrying a corrupt picture."""
    image = data_url(media["image0"], "image/png")
    corrupt = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + os.urandom(64)).decode()
    arena = uform.Arena()
    picture = np.array(model.image_encode([str(media["image0"])], arena).embeddings)[0]
    host, port = host_port(server.url)

    async def client(c: int) -> list[str]:
        conn = Conn(host, port)
        problems = []
        try:
            for r in range(50):
                text = f"client {c} request {r}"
                bad = (c * 50 + r) % 7 == 0
                doc = {"input": [text, {"type": "image_url", "image_url": {"url": corrupt if bad else image}}]} if r % 5 == 0 else {"input": text}
                if bad and r % 5 != 0:
                    doc = {"input": [text, {"type": "image_url", "image_url": {"url": corrupt}}]}
                status, _, body = await conn.post_json("/v1/embeddings", doc)
                if bad:
                    if status != 400 or body["error"]["param"] != "input[1]":
                        problems.append(f"{c}/{r}: {status} {body}")
                    continue
                if status != 200:
                    problems.append(f"{c}/{r}: {status} {body}")
                    continue
                rows = np.array([d["embedding"] for d in body["data"]], np.float32)
                if not np.array_equal(rows[0], expected[text]) or (len(rows) == 2 and not np.array_equal(rows[1], picture)):
                    problems.append(f"{c}/{r}: wrong rows")
        finally:
            await conn.close()
        return problems

    all_texts = [f"client {c} request {r}" for c in range(32) for r in range(50)]
    expected = dict(zip(all_texts, np.array(model.text_encode(all_texts, arena).embeddings)))

    async def main() -> list[str]:
        return [p for problems in await asyncio.gather(*(client(c) for c in range(32))) for p in problems]

    assert asyncio.run(main()) == []
    assert httpx.get(server.url + "/health").status_code == 200
    metrics = httpx.get(server.url + "/metrics").text
    counts = [line for line in metrics.splitlines() if line.startswith('uform_batch_requests_sum{verb="text_encode"}')
              or line.startswith('uform_batch_requests_count{verb="text_encode"}')]  # fmt: skip
    total, batches = (float(line.split()[-1]) for line in sorted(counts, reverse=True))
    assert total / batches > 1.5, f"requests were not coalesced: {total} requests in {batches} text calls"


def test_pipelined_requests_on_one_connection_and_a_lone_surrogate(server: Proc, model: uform.Model) -> None:
    """Three requests written at once on one keep-alive connection are answered in order, each
    whole; a lone surrogate escape, which orjson
    refuses, is still read and named as its item."""
    host, port = host_port(server.url)
    texts = ["first text", "second text", "third text"]
    expected = np.array(model.text_encode(texts, uform.Arena()).embeddings)

    async def pipelined() -> list[tuple[int, bytes]]:
        reader, writer = await asyncio.open_connection(host, port)
        wire = b""
        for text in texts:
            body = json.dumps({"input": text, "encoding_format": "float"}).encode()
            wire += b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        writer.write(wire)
        answers = []
        for _ in texts:
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            answers.append((status, await reader.readexactly(length)))
        writer.close()
        return answers

    for (status, body), row in zip(asyncio.run(pipelined()), expected):
        assert status == 200
        np.testing.assert_array_equal(np.array(json.loads(body)["data"][0]["embedding"], np.float32), row)
    bad = httpx.post(server.url + "/v1/embeddings", content=b'{"input": ["a", "\\ud800"]}')
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]", bad.text
    assert "not encodable as UTF-8" in bad.json()["error"]["message"]
    with pytest.raises(uform.InputError) as refused:  # the server refuses it in the verb's words (it had its own: "the text is ...")
        model.text_encode(["a", "\ud800"], uform.Arena())
    assert bad.json()["error"]["message"] == f"input[1]: {refused.value.reason}" == "input[1]: text is not encodable as UTF-8 (surrogates not allowed at 0)"
