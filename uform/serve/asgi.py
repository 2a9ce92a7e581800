"""The ASGI layer: one small application of this package's own on the ASGI interface alone
(any ASGI server runs it; ``uform serve`` runs uvicorn). :class:`App` answers the lifespan and
each HTTP request: refused without the API key (401) or over the size limit (413, on its
``Content-Length``, before any of the body is read), else routed to its handler, answered in
two ASGI messages, counted by route and status, and logged; :meth:`App.refused` counts and logs
the same way what the guard in front refused (414, 431).

Handlers read bodies through :func:`read_body`, which bounds what they hold (:class:`Bodies`:
413 past a body's size, 503 past what every body still arriving holds, 408 past a body's time).

A handler is ``async (scope, receive) -> Answer``; it raises :class:`ApiError` for an answer
in OpenAI's error shape and ``ConnectionError`` when the client went away (nothing is sent:
counted as 499). A request whose connection is gone by the time its answer is ready is a 499
too (under the guard, which knows: uvicorn drops an answer to a closed connection silently)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO
from urllib.parse import quote

from .connections import left
from .errors import ApiError
from .metrics import FOLD, Metrics

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
JSON = b"application/json"
# status, body, headers beyond content-type and content-length, content type
Answer = tuple[int, bytes, list[tuple[bytes, bytes]], bytes]
Handler = Callable[[Scope, Receive], Awaitable[Answer]]
OPEN_PATHS = {"/health"}  # served without the API key
MODELS = "/v1/models"  # also answers /v1/models/{id}
_log = logging.getLogger("uform.serve")


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
            self.stream.write("".join([f'{c[0]}:{c[1]} "{m} {logged(p)}" {s} {t * 1000:.2f}ms\n' if c else f'- "{m} {logged(p)}" {s} {t * 1000:.2f}ms\n'
                                       for c, m, p, s, t in lines]))  # fmt: skip
            self.stream.flush()


def logged(path: str) -> str:
    """``path`` as the access log writes it: as it is when it is printable ASCII without a quote,
    else percent-encoded as uvicorn's own access log writes it (a decoded ``%0A`` would start a
    line of the client's making, ``%1B`` a terminal's escape)."""
    return path if path.isascii() and path.isprintable() and '"' not in path else quote(path)


class App:
    """The ASGI application: ``routes`` maps a path to its handler by method (``/v1/models/{id}``
    goes to ``/v1/models``'s); ``startup`` and ``shutdown`` run at the lifespan's start and end."""

    def __init__(self, routes: dict[str, dict[str, Handler]], *, api_key: str | None, max_request_bytes: int, metrics: Metrics,
                 log: AccessLog | None, startup: Callable[[], Awaitable[None]], shutdown: Callable[[], Awaitable[None]]) -> None:  # fmt: skip
        self.routes = routes
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.limit = max_request_bytes
        self.metrics = metrics
        self.log = log
        self.startup, self.shutdown = startup, shutdown
        self._counted = metrics.requests.counts  # (route, status) -> requests
        self._timed = {route: metrics.request_seconds.values(route) for route in (*routes, "other")}
        self.answered: set[Any] = set()  # clients whose request the guard answered while it was here (its end is no 499 of its own)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)
        elif kind == "websocket":  # not served
            await send({"type": "websocket.close", "code": 1000})

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        began = time.perf_counter()
        path: str = scope["path"]
        method: str = scope["method"]
        route = path if path in self.routes else (MODELS if path.startswith(MODELS + "/") else "other")
        status = 500
        try:
            try:
                self.check(scope, path)
                handlers = self.routes.get(route)
                if handlers is None:
                    raise ApiError(404, f"{method} {path}: Not Found", code="not_found")
                handler = handlers.get(method) or (handlers.get("GET") if method == "HEAD" else None)
                if handler is None:
                    raise ApiError(405, f"{method} {path}: Method Not Allowed", headers={"Allow": ", ".join(handlers)})
                status, body, headers, content_type = await handler(scope, receive)
                if left():  # the client reset or closed the connection while it was computed: nothing can be sent
                    raise ConnectionError("the client went away")
                await respond(send, status, body, headers, content_type)
            except Exception as exc:  # noqa: BLE001 - every failure is an answer
                status = await answer(send, exc)
        finally:
            if status == 499 and self.answered and scope.get("client") in self.answered:
                self.answered.discard(scope.get("client"))  # counted and logged as the guard's answer (a 413 or 400 mid-body)
            else:
                self.record(scope, path, route, status, began)

    def check(self, scope: Scope, path: str) -> None:
        """Raise the refusal of a request without the API key or over the size limit."""
        headers = dict(scope["headers"])
        if self.expected is not None and path not in OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                raise ApiError(401, "a valid API key is required: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        length = headers.get(b"content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                raise ApiError(400, "Content-Length is not a number", code="bad_content_length") from None
            if size > self.limit:
                raise too_large(self.limit)

    def refused(self, client: Any, method: str, path: str, status: int, began: float, handed: bool = False) -> None:
        """A request the guard in front refused (serve.guard): counted and logged as an answer of
        the route its path names. Most never reached the application (414, 431); one ``handed``
        to it (a chunked body refused 413 mid-way, or found malformed) ends here when its
        connection closes, and is not counted again as a client that left (499)."""
        if handed:
            self.answered.add(client)
        route = path if path in self.routes else (MODELS if path.startswith(MODELS + "/") else "other")
        self.record({"client": client, "method": method}, path, route, status, began)

    def record(self, scope: Scope, path: str, route: str, status: int, began: float) -> None:
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

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # noqa: BLE001 - the server reports it and exits
                    await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over the limit of {limit} bytes (--max-request-bytes)", code="request_too_large",
                    headers={"Connection": "close"})  # fmt: skip


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]], content_type: bytes = JSON) -> None:
    """A whole response in two ASGI messages."""
    head = [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def answer(send: Send, exc: Exception) -> int:
    """Answer a handler's failure: an ``ApiError`` as itself, a client gone away (nothing
    sent: 499), anything else a 500 in OpenAI's shape; answers the status."""
    if isinstance(exc, ConnectionError) or left():
        return 499
    if not isinstance(exc, ApiError):
        _log.error("a request failed", exc_info=exc)
        exc = ApiError(500, f"the server failed: {type(exc).__name__}: {exc}", code="internal_error")
    await respond(send, exc.status, exc.encoded(), [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()])
    return exc.status


class Bodies:
    """What request bodies may take: ``each`` bytes a body (413 beyond), ``pending`` bytes of
    bodies still arriving held at once over every connection (``held``; 503 beyond), and
    ``seconds`` from the start of its reading to a body's last byte (408 beyond).

    The time is kept by one timer for every body being read, not one a request (a timer a
    request cost more than the rest of the reading): while any is read, every ``TICK`` seconds
    it cancels the tasks reading a body past its deadline, which answer 408 (so a body gets
    ``seconds`` and at most ``TICK`` more)."""

    TICK = 0.5

    __slots__ = ("each", "pending", "seconds", "held", "reading", "expired", "timer")

    def __init__(self, each: int, pending: int, seconds: float) -> None:
        self.each, self.pending, self.seconds = each, pending, seconds
        self.held = 0
        self.reading: dict[asyncio.Task[Any], float] = {}  # the tasks reading a body, and their deadlines
        self.expired: set[asyncio.Task[Any]] = set()  # those cancelled for passing it
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> asyncio.Task[Any]:
        """The current task starts reading a body: its deadline is from now."""
        task = asyncio.current_task()
        assert task is not None
        self.reading[task] = time.monotonic() + self.seconds
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(self.TICK, self.sweep)
        return task

    def sweep(self) -> None:
        now = time.monotonic()
        for task, deadline in self.reading.items():
            if deadline <= now and task not in self.expired:
                self.expired.add(task)
                task.cancel()
        self.timer = asyncio.get_running_loop().call_later(self.TICK, self.sweep) if self.reading else None


async def read_body(receive: Receive, bodies: Bodies) -> bytes:
    """The body from ASGI messages; refused with 413 once more than ``bodies.each`` bytes arrived
    (a chunked body: a declared length was checked by :class:`App`), 503 when what it holds
    would take the bodies still arriving past ``bodies.pending``, 408 when it is not whole by
    its deadline (:class:`Bodies`); ``ConnectionError`` when the client left first. A refusal
    closes the connection (the rest of the body is never read)."""
    size = 0  # what this body adds to bodies.held
    task = bodies.start()
    try:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client went away")
        body: bytes = message.get("body", b"")
        if len(body) > bodies.each:
            raise too_large(bodies.each)
        if not message.get("more_body", False):
            return body  # a body that arrived whole: this one message
        chunks = [body]
        hold(bodies, len(body))
        size = len(body)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ConnectionError("the client went away")
            chunk = message.get("body", b"")
            if size + len(chunk) > bodies.each:
                raise too_large(bodies.each)
            hold(bodies, len(chunk))
            size += len(chunk)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
    except asyncio.CancelledError:
        if task not in bodies.expired:
            raise
        bodies.expired.discard(task)
        task.uncancel()
        raise ApiError(408, f"the request body did not arrive whole within {bodies.seconds:g} s (--body-timeout)", code="body_timeout",
                       headers={"Connection": "close"}) from None  # fmt: skip
    finally:
        bodies.held -= size
        del bodies.reading[task]


def hold(bodies: Bodies, n: int) -> None:
    """Count ``n`` more bytes of a body still arriving; a 503 (``Retry-After``) when they would
    take what bodies hold past ``bodies.pending``."""
    if bodies.held + n > bodies.pending:
        raise ApiError(503, f"the server holds {bodies.held} bytes of request bodies still arriving, and this one's would pass "
                            f"the limit of {bodies.pending} (--max-pending-body-bytes); retry shortly", code="server_busy",
                       headers={"Retry-After": "1", "Connection": "close"})  # fmt: skip
    bodies.held += n


async def gone(receive: Receive) -> Message:
    """Resolves when the client disconnects (the body having been read already): the ASGI
    server answers ``receive`` with ``http.disconnect`` then."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return message
