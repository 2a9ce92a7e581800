"""The Starlette application: ``/v1/embeddings``, ``/v1/choose``, ``/v1/models``, ``/health``,
``/metrics`` (docs/serve.md). Parsing large bodies, reading files and writing large responses
run on the server's threads, verbs on the lanes' (``batcher``): the event loop never waits on them."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from . import requests
from . import respond as respond_
from .batcher import Batcher
from .catalog import served
from .config import ServeConfig
from .errors import ApiError
from .http import AccessLog, Guard, answer, disconnect_probe, gone, read_body, read_raw, respond, too_large
from .lane import Job, Lane
from .metrics import CONTENT_TYPE, Metrics
from .wire import write_whole

if TYPE_CHECKING:
    from uform import Model

T = TypeVar("T")
# the head of a 200 from /v1/embeddings after uvicorn's default headers: length, then the timing headers' values
_HEAD = (b"content-type: application/json\r\ncontent-length: %d\r\nx-uform-queue-ms: %s\r\nx-uform-inference-ms: %s\r\n"
         b"x-uform-total-ms: %s\r\nx-uform-batch-items: %d\r\nserver-timing: queue;dur=%s, inference;dur=%s, total;dur=%s\r\n\r\n")  # fmt: skip


def _timing_headers(q: bytes, c: bytes, t: bytes, batch: int) -> list[tuple[bytes, bytes]]:
    return [(b"x-uform-queue-ms", q), (b"x-uform-inference-ms", c), (b"x-uform-total-ms", t), (b"x-uform-batch-items", b"%d" % batch),
            (b"server-timing", b"queue;dur=" + q + b", inference;dur=" + c + b", total;dur=" + t)]  # fmt: skip


class Server:
    """What the routes share: the model, its batcher (made at startup), limits and metrics."""

    def __init__(self, model: Model, config: ServeConfig) -> None:
        self.model = model
        self.config = config
        self.description = model.describe()
        self.modalities = served(model)
        self.batcher: Batcher | None = None
        self.draining = False
        lanes = len(self.modalities)
        self.pool = cf.ThreadPoolExecutor(lanes * config.batches_at_once + 2 if config.batching else 16, thread_name_prefix="uform-serve")
        self.metrics = Metrics(lambda: float(self.batcher.queued_items()) if self.batcher else 0.0)

    async def off_loop(self, fn: Callable[[], T], inline: bool) -> T:
        return fn() if inline else await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.model_id:
            raise ApiError(404, f"the model {name!r} does not exist here; this server serves {self.config.model_id!r}", param="model", code="model_not_found")

    async def run_jobs(self, receive: Receive, kinds: list[str], payloads: list[Any], costs: list[int]) -> tuple[list[tuple[Lane, Job]], list[Any]]:
        assert self.batcher is not None
        probe = disconnect_probe(receive)
        jobs = self.batcher.submit(kinds, payloads, costs, probe)
        if len(jobs) == 1:
            self.metrics.item_count(kinds[0], len(kinds))
        else:
            for kind, count in Counter(kinds).items():
                self.metrics.item_count(kind, count)
        if probe is not None:  # uvicorn: the lane reads the connection's state when a batch forms
            return jobs, [await jobs[0][1].future] if len(jobs) == 1 else await self.batcher.gather(jobs, None)
        watcher = asyncio.ensure_future(gone(receive))  # another ASGI server: a task awaits the disconnect
        try:
            return jobs, await self.batcher.gather(jobs, watcher)
        finally:
            watcher.cancel()

    @staticmethod
    def figures(jobs: list[tuple[Lane, Job]], began: float) -> tuple[bytes, bytes, bytes, int]:
        """The timing headers' values: queue, inference and total milliseconds, batch items."""
        if len(jobs) == 1:
            job = jobs[0][1]
            queue, compute, batch = (job.started - job.enqueued) * 1000, (job.finished - job.started) * 1000, job.batch_items
        else:
            queue = max(job.started - job.enqueued for _, job in jobs) * 1000
            compute = max(job.finished - job.started for _, job in jobs) * 1000
            batch = max(job.batch_items for _, job in jobs)
        return b"%.3f" % queue, b"%.3f" % compute, b"%.3f" % ((time.perf_counter() - began) * 1000), batch

    def timing(self, jobs: list[tuple[Lane, Job]], began: float) -> list[tuple[bytes, bytes]]:
        return _timing_headers(*self.figures(jobs, began))

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> int:
        """``POST /v1/embeddings``, a raw ASGI handler (``Guard`` calls it); answers the status.
        The response goes out in one write where the server is uvicorn (``wire.write_whole``)."""
        try:
            body, jobs, began = await self._embeddings(receive)
            q, c, t, batch = self.figures(jobs, began)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer (http.answer)
            return await answer(send, exc)
        head = _HEAD % (len(body), q, c, t, batch, q, c, t)
        if not write_whole(send, 200, head, body):
            await respond(send, 200, body, _timing_headers(q, c, t, batch))
        return 200

    async def _embeddings(self, receive: Receive) -> tuple[bytes, list[tuple[Lane, Job]], float]:
        began = time.perf_counter()
        c = self.config
        message = await receive()  # a body that arrived whole is this one message
        if message["type"] == "http.request" and not message.get("more_body", False):
            body: bytes = message.get("body", b"")
            if len(body) > c.max_request_bytes:  # a chunked body the server had whole before this read
                raise too_large(c.max_request_bytes)
        else:
            body = await read_raw(receive, c.max_request_bytes, message)
        if len(body) <= c.inline_json_bytes and b"file:" not in body:
            req = requests.embeddings(body, max_items=c.max_items_per_request, media_root=c.media_root, limit=c.max_request_bytes)
        else:
            parse = functools.partial(requests.embeddings, body, max_items=c.max_items_per_request, media_root=c.media_root, limit=c.max_request_bytes)
            req = await self.off_loop(parse, False)
        self.check_model(req.model)
        dims = self.description.dimensions
        respond_.check_dimensions(req.dimensions, dims)
        items = req.items
        if len(items) == 1:
            item = items[0]
            probe = disconnect_probe(receive)
            if probe is not None:  # one item on uvicorn: what run_jobs does, without its layers
                assert self.batcher is not None
                jobs = self.batcher.submit((item.kind,), (item.payload,), (item.cost,), probe)
                self.metrics.item_count(item.kind)
                result = await jobs[0][1].future
                tokens = min(len(item.payload), self.description.context) if item.kind == "text" else 0
                rows = respond_.prefix(result, req.dimensions, dims)
                return respond_.embeddings_body(rows, req.encoding_format, c.model_id, tokens), jobs, began
            kinds, payloads, costs = [item.kind], [item.payload], [item.cost]
        else:
            kinds, payloads, costs = [i.kind for i in items], [i.payload for i in items], [i.cost for i in items]
        jobs, results = await self.run_jobs(receive, kinds, payloads, costs)
        context = self.description.context
        tokens = sum(min(len(p), context) for k, p in zip(kinds, payloads) if k == "text")

        def write() -> bytes:
            rows = respond_.assemble([(job.positions, r) for (_, job), r in zip(jobs, results)], len(items), dims)
            rows = respond_.prefix(rows, req.dimensions, dims)
            return respond_.embeddings_body(rows, req.encoding_format, c.model_id, tokens)

        if len(items) * dims <= c.inline_response_values:
            return write(), jobs, began
        return await self.off_loop(write, False), jobs, began

    async def choose(self, request: Request) -> Response:
        began = time.perf_counter()
        c = self.config
        body = await read_body(request, c.max_request_bytes)
        req = await self.off_loop(functools.partial(requests.choose, body, max_items=c.max_items_per_request), len(body) <= c.inline_json_bytes)
        self.check_model(req.model)
        payloads: list[Any] = list(zip(req.texts, req.choices, req.groups))
        n = len(payloads)
        jobs, results = await self.run_jobs(request.receive, ["choose"] * n, payloads, [len(t) for t in req.texts])
        values, offsets = results[0]
        tokens = sum(min(len(t), self.description.context) for t in req.texts)
        out = respond_.choose_body(values, offsets, req.choices, c.model_id, tokens)
        return Response(out, media_type="application/json", headers={k.decode(): v.decode() for k, v in self.timing(jobs, began)})

    def model_card(self) -> dict[str, Any]:
        d = self.description
        return {"id": self.config.model_id, "object": "model", "created": 0, "owned_by": "uform",
                "modalities": list(self.modalities), "verbs": sorted({v for vs in self.modalities.values() for v in vs}),
                "dimensions": d.dimensions, "context": d.context, "quantization": d.quantization.value,
                "backend": self.model.backend}  # fmt: skip

    async def models(self, request: Request) -> Response:
        name = request.path_params.get("name")
        if name is not None:
            self.check_model(name)
            return JSONResponse(self.model_card())
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def health(self, request: Request) -> Response:
        if self.draining or self.batcher is None or self.batcher.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok", "queued_items": self.batcher.queued_items()})

    async def metrics_route(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.batcher = Batcher(self.model, self.config, self.pool, self.metrics)
        try:
            yield
        finally:
            try:
                await asyncio.wait_for(self.batcher.close(), timeout=max(self.config.drain_seconds, 0.1))
            except TimeoutError:
                pass
            self.pool.shutdown(wait=False, cancel_futures=True)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return Response(exc.encoded(), status_code=exc.status, media_type="application/json", headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code="not_found" if exc.status_code == 404 else None)
    return await _api_error(request, error)


async def _internal(request: Request, exc: Exception) -> Response:
    error = ApiError(500, f"the server failed: {type(exc).__name__}: {exc}", code="internal_error")
    return Response(error.encoded(), status_code=500, media_type="application/json")


async def _disconnected(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # the client went away: nobody reads this


def create_app(model: Model, config: ServeConfig, log: AccessLog | None = None) -> tuple[Any, Server]:
    """The ASGI application serving ``model``, and the :class:`Server` state behind it;
    ``log`` writes a line per request."""
    server = Server(model, config)
    routes = [
        Route("/v1/embeddings", _Raw(server.embeddings), methods=["POST"]),  # POSTs are answered by Guard (fast)
        Route("/v1/choose", server.choose, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{name:path}", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics_route, methods=["GET"]),
    ]
    handlers: dict[Any, Callable[..., Any]] = {ApiError: _api_error, HTTPException: _http_error, ConnectionError: _disconnected,
                                                Exception: _internal}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=server.lifespan)
    guard = Guard(app, api_key=config.api_key, max_request_bytes=config.max_request_bytes, metrics=server.metrics, log=log,
                  fast={"/v1/embeddings": server.embeddings})  # fmt: skip
    return guard, server


class _Raw:
    """A raw handler as Starlette's route endpoint (an ASGI app): the route answers 405 to
    other methods; :class:`Guard` answers the POSTs before Starlette sees them."""

    def __init__(self, handler: Callable[[Scope, Receive, Send], Awaitable[int]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)
