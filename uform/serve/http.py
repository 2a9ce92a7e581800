"""The ASGI layer around the routes: API-key checks, the request-size limit, and per-route
request metrics; plus reading a body within its limit and noticing a client that left.

``POST /v1/embeddings`` is answered by a raw ASGI handler (:class:`Guard`'s ``fast`` routes):
no framework routing, middleware or request object on the path every embedding takes; every
other route goes through Starlette."""

from __future__ import annotations

import asyncio
import hmac
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError
from .metrics import FOLD, Metrics

OPEN_PATHS = {"/health"}  # served without the API key
# a raw ASGI handler answering one route: the status it sent (499: the client went away)
Handler = Callable[[Scope, Receive, Send], Awaitable[int]]
ROUTES = {"/v1/embeddings", "/v1/choose", "/v1/models", "/health", "/metrics"}


class AccessLog:
    """One line per request (``127.0.0.1:50312 "POST /v1/embeddings" 200 1.84ms``), buffered and
    written every 0.1 s: a request costs a tuple of its fields, formatted with the others at
    the write, not a ``logging`` record and a write of its own."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.lines: list[tuple[Any, str, str, int, float]] = []  # client, method, path, status, seconds

    def add(self, client: Any, method: str, path: str, status: int, seconds: float) -> None:
        if not self.lines:
            asyncio.get_running_loop().call_later(0.1, self.flush)
        self.lines.append((client, method, path, status, seconds))

    def flush(self) -> None:
        lines, self.lines = self.lines, []
        if lines:
            self.stream.write("".join([f'{c[0]}:{c[1]} "{m} {p}" {s} {t * 1000:.2f}ms\n' if c else f'- "{m} {p}" {s} {t * 1000:.2f}ms\n'
                                       for c, m, p, s, t in lines]))  # fmt: skip
            self.stream.flush()


class Guard:
    """Refuses a request without the API key (401) or whose ``Content-Length`` is over the
    limit (413, before any of the body is read), counts every answer by route and status, and
    logs a line for it. ``fast`` maps a path to the raw handler answering POSTs to it."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_request_bytes: int, metrics: Metrics, log: AccessLog | None,
                 fast: dict[str, Handler] | None = None) -> None:  # fmt: skip
        self.app = app
        self.fast = fast or {}
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.limit = max_request_bytes
        self.metrics = metrics
        self.log = log
        self._counted = metrics.requests.counts  # (route, status) -> requests
        self._timed = {route: metrics.request_seconds.values(route) for route in (*ROUTES, "other")}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        path: str = scope["path"]
        handler = self.fast.get(path) if scope["method"] == "POST" else None
        if handler is not None:
            status = 500
            try:
                refusal = self._refusal(scope, path)
                status = await (_answer(refusal, send) if refusal is not None else handler(scope, receive, send))
            finally:
                self._record(scope, path, path, status, began)
            return
        route = path if path in ROUTES else ("/v1/models" if path.startswith("/v1/models/") else "other")
        status = 500

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope, path)
            if refusal is not None:
                await _answer(refusal, counted)
            else:
                await self.app(scope, receive, counted)
        finally:
            self._record(scope, path, route, status, began)

    def _record(self, scope: Scope, path: str, route: str, status: int, began: float) -> None:
        took = time.perf_counter() - began
        key = (route, status)
        counted = self._counted
        counted[key] = counted.get(key, 0) + 1
        timed = self._timed[route]
        timed.append(took)
        if len(timed) >= FOLD:
            self.metrics.request_seconds.fold(route)
        if self.log is not None:
            self.log.add(scope.get("client"), scope["method"], path, status, took)

    def _refusal(self, scope: Scope, path: str) -> ApiError | None:
        headers = dict(scope["headers"])
        if self.expected is not None and path not in OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                return ApiError(401, "a valid API key is required: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        length = headers.get(b"content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                return ApiError(400, "Content-Length is not a number", code="bad_content_length")
            if size > self.limit:
                return too_large(self.limit)
        return None


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over the limit of {limit} bytes (--max-request-bytes)", code="request_too_large",
                    headers={"Connection": "close"})  # fmt: skip


async def _answer(error: ApiError, send: Send) -> int:
    """Send ``error`` as the response; answers its status."""
    await respond(send, error.status, error.encoded(), [(k.lower().encode(), v.encode()) for k, v in error.headers.items()])
    return error.status


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A whole JSON response in two ASGI messages."""
    head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *(headers or ())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def answer(send: Send, exc: Exception) -> int:
    """Answer a raw handler's failure: an ``ApiError`` as itself, a client gone away (nothing
    sent: 499), anything else a 500 in OpenAI's shape; answers the status."""
    if isinstance(exc, ConnectionError):
        return 499
    if not isinstance(exc, ApiError):
        exc = ApiError(500, f"the server failed: {type(exc).__name__}: {exc}", code="internal_error")
    return await _answer(exc, send)


async def read_body(request: Request, limit: int) -> bytes:
    """The body; one without a ``Content-Length`` (chunked) is refused with 413 as soon as more
    than ``limit`` bytes arrived (a declared length was checked by :class:`Guard`)."""
    if "content-length" in request.headers:
        return await request.body()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_raw(receive: Receive, limit: int, message: Message | None = None) -> bytes:
    """The body from ASGI messages (``message``: the first, already received); refused with 413
    once more than ``limit`` bytes arrived (a chunked body: a declared length was checked by
    :class:`Guard`), ``ConnectionError`` when the client left first."""
    if message is None:
        message = await receive()
    if message["type"] == "http.disconnect":
        raise ConnectionError("the client went away")
    body: bytes = message.get("body", b"")
    if len(body) > limit:
        raise too_large(limit)
    if not message.get("more_body", False):
        return body
    chunks, size = [body], len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def disconnect_probe(receive: Receive) -> Callable[[], bool] | None:
    """A cheap test of whether the client left: uvicorn's request cycle (whose method
    ``receive`` is) records it as ``disconnected``; None on servers that keep no such record."""
    cycle = getattr(receive, "__self__", None)
    if cycle is None or not isinstance(getattr(cycle, "disconnected", None), bool):
        return None
    return lambda: bool(cycle.disconnected)


async def gone(receive: Receive) -> Any:
    """Resolves when the client disconnects (the body having been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return message
