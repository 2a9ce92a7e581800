"""``uform serve``'s hostile bodies, on one in-process server: JSON nested too deep, a ``file://``
path that is not UTF-8, integers too long to convert, a ``file:`` URL however spelled read off
the event loop, booleans as token ids, and a temperature group out of range, each a JSON 400
naming what is wrong. Hostile connections and heads: tests/test_serve_hostile.py."""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import media as media_module
import uform
from serving import thread_server
from uform.serve import ServeConfig


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


@pytest.mark.parametrize("body", [
    b'{"input": "a", "x": [' + b"[]," * 10_000_000 + b"1]}",  # 30 MB of empty arrays in a field the server ignores: +900 MB, 11.5 s, a 200
    b'{"input": [' + b"[104]," * 4_000_000 + b"[104]]}",  # 4 M token-id arrays: +505 MB, 4.7 s, then a 400 for their count
], ids=["empty-arrays", "token-id-arrays"])  # fmt: skip
def test_a_body_of_more_json_values_than_the_limit_is_refused_before_it_is_read(served: tuple[str, Path], body: bytes) -> None:
    answer = post(served[0], body)
    assert answer.status_code == 400 and error_of(answer) == {
        "message": "the body holds over 524288 JSON values (arrays, objects, strings, numbers: commas outside its strings), the limit of "
                   "uform.serve.requests.MAX_COMMAS: read, they would take far more memory than its bytes",
        "type": "invalid_request_error", "param": None, "code": "too_many_values"}, answer.text  # fmt: skip


def test_commas_inside_texts_are_not_counted_as_values(served: tuple[str, Path]) -> None:
    texts = ['a, b, \\"c\\", [d], \\\\' * 300 + str(i) for i in range(2048)]  # 600 commas a text: 1.2 M in all
    body = json.dumps({"input": texts}).encode()
    assert body.count(b",") > 1_000_000
    answer = post(served[0], body)
    assert answer.status_code == 200 and len(answer.json()["data"]) == 2048, answer.text[:300]

