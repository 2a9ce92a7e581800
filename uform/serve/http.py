"""The ASGI layer around the routes: API-key checks, the request-size limit, and per-route
request metrics; plus reading a body within its limit and noticing a client that left."""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError
from .metrics import Metrics

OPEN_PATHS = {"/health"}  # served without the API key
ROUTES = {"/v1/embeddings", "/v1/choose", "/v1/models", "/health", "/metrics"}


class Guard:
    """Refuses a request without the API key (401) or whose ``Content-Length`` is over the
    limit (413, before any of the body is read), and counts every answer by route and status."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_request_bytes: int, metrics: Metrics) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.limit = max_request_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        path: str = scope["path"]
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
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - began)

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


async def _answer(error: ApiError, send: Send) -> None:
    body = error.encoded()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as more than ``limit`` bytes arrived (chunked bodies)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def gone(receive: Receive) -> Any:
    """Resolves when the client disconnects (the body having been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return message
