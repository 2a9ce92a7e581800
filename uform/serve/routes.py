"""The routes: ``/v1/embeddings``, ``/v1/choose``, ``/v1/models``, ``/health``, ``/metrics``
(docs/serve.md), each a handler of :class:`Routes` on :class:`asgi.App`. Parsing large bodies,
reading files and writing large responses run on the server's threads, verbs on the lanes'
(``batcher``): the event loop never waits on them."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from . import requests
from . import respond as respond_
from .batcher import Batcher, tokenizer_of
from .config import ServeConfig
from .errors import ApiError
from .asgi import JSON, Answer, App, AccessLog, Bodies, Receive, Scope, gone, read_body
from .lane import Counted, Job, Lane
from .metrics import CONTENT_TYPE, Metrics

if TYPE_CHECKING:
    from uform import Model

Jobs = list[tuple[Lane, Job]]
WATCH_AFTER = 0.01  # seconds a request waits before a task awaits its client's disconnect (Watcher)


class Routes:
    """What the routes share: the model, its batcher (made at startup), limits and metrics."""

    def __init__(self, model: Model, config: ServeConfig, announce: Callable[[], None] | None = None) -> None:
        self.model = model
        self.config = config
        self.description = model.describe()
        self.modalities = model.served.modalities  # each served modality and its verbs, by name
        self.utf8 = tokenizer_of(model) is not None  # its texts are tokenized: token-id arrays must be UTF-8
        self.batcher: Batcher | None = None
        self.watcher: Watcher | None = None
        self.draining = False
        self.drain_ends: float | None = None  # time.monotonic() when the drain's time runs out (set on SIGTERM)
        self.announce = announce
        self.bodies = Bodies(config.max_request_bytes, config.pending_body_bytes, config.body_seconds)
        self.pool = cf.ThreadPoolExecutor(4, thread_name_prefix="uform-serve")  # parsing and writing large bodies
        self.metrics = Metrics(lambda: float(self.batcher.queued_items()) if self.batcher else 0.0)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.model_id:
            raise ApiError(404, f"the model {name!r} does not exist here; this server serves {self.config.model_id!r}", param="model", code="model_not_found")

    async def run_jobs(self, receive: Receive, kinds: list[str], payloads: list[Any], costs: list[int]) -> tuple[Jobs, list[Any]]:
        """Queue a request's items and await their results; one still waiting after
        ``WATCH_AFTER`` has its queued items dropped if its client leaves (:class:`Watcher`)."""
        assert self.batcher is not None
        jobs = self.batcher.submit(kinds, payloads, costs)
        if len(jobs) == 1:
            self.metrics.item_count(kinds[0], len(kinds))
        else:
            for kind, count in Counter(kinds).items():
                self.metrics.item_count(kind, count)
        watcher = self.watcher
        assert watcher is not None
        key = watcher.add(jobs, receive)
        try:
            return jobs, await self.batcher.gather(jobs, None)
        finally:
            watcher.remove(key)

    @staticmethod
    def timing(jobs: Jobs, began: float) -> list[tuple[bytes, bytes]]:
        """The timing headers: queue, inference and total milliseconds (the longest over the
        request's jobs), the items of the largest verb call its items rode in."""
        if len(jobs) == 1:
            job = jobs[0][1]
            queue, compute, batch = (job.started - job.enqueued) * 1000, (job.finished - job.started) * 1000, job.batch_items
        else:
            queue = max(job.started - job.enqueued for _, job in jobs) * 1000
            compute = max(job.finished - job.started for _, job in jobs) * 1000
            batch = max(job.batch_items for _, job in jobs)
        q, c, t = b"%.3f" % queue, b"%.3f" % compute, b"%.3f" % ((time.perf_counter() - began) * 1000)
        return [(b"x-uform-queue-ms", q), (b"x-uform-inference-ms", c), (b"x-uform-total-ms", t), (b"x-uform-batch-items", b"%d" % batch),
                (b"server-timing", b"queue;dur=" + q + b", inference;dur=" + c + b", total;dur=" + t)]  # fmt: skip

    async def embeddings(self, scope: Scope, receive: Receive) -> Answer:
        began = time.perf_counter()
        c = self.config
        body = await read_body(receive, self.bodies)
        if len(body) <= c.inline_json_bytes and not (c.media_root is not None and _may_name_files(body)):
            req = requests.embeddings(body, max_items=c.max_items_per_request, media_root=c.media_root, limit=c.max_request_bytes, utf8=self.utf8)
        else:  # large, or naming files: parsed (base64 decoded, files read) on a thread
            parse = functools.partial(requests.embeddings, body, max_items=c.max_items_per_request, media_root=c.media_root, limit=c.max_request_bytes,
                                      utf8=self.utf8)  # fmt: skip
            req = await asyncio.get_running_loop().run_in_executor(self.pool, parse)
        self.check_model(req.model)
        dims = self.description.dimensions
        respond_.check_dimensions(req.dimensions, dims)
        items = req.items
        kinds = [item.kind for item in items]
        payloads: list[Any] = [item.payload for item in items]
        jobs, results = await self.run_jobs(receive, kinds, payloads, [item.cost for item in items])
        counted = [r.tokens for r in results if isinstance(r, Counted)]  # the model's own tokenizer's
        if counted:
            tokens = int(sum(t.sum() for t in counted))
            results = [r.rows if isinstance(r, Counted) else r for r in results]
        else:  # a byte a token, up to the context
            context = self.description.context
            tokens = sum([min(len(p), context) for k, p in zip(kinds, payloads) if k == "text"])
        write = functools.partial(_embeddings_body, req, jobs, results, dims, c.model_id, tokens)
        out = write() if len(items) * dims <= c.inline_response_values else await asyncio.get_running_loop().run_in_executor(self.pool, write)
        return 200, out, self.timing(jobs, began), JSON

    async def choose(self, scope: Scope, receive: Receive) -> Answer:
        began = time.perf_counter()
        c = self.config
        body = await read_body(receive, self.bodies)
        parse = functools.partial(requests.choose, body, max_items=c.max_items_per_request, groups=self.description.choice_temperature_groups)
        req = parse() if len(body) <= c.inline_json_bytes else await asyncio.get_running_loop().run_in_executor(self.pool, parse)
        self.check_model(req.model)
        payloads: list[Any] = list(zip(req.texts, req.choices, req.groups))
        jobs, results = await self.run_jobs(receive, ["choose"] * len(payloads), payloads, [len(t) for t in req.texts])
        values, offsets = results[0]
        tokens = sum(min(len(t), self.description.context) for t in req.texts)
        out = respond_.choose_body(values, offsets, req.choices, c.model_id, tokens)
        return 200, out, self.timing(jobs, began), JSON

    def model_card(self) -> dict[str, Any]:
        d = self.description
        return {"id": self.config.model_id, "object": "model", "created": 0, "owned_by": "uform",
                "modalities": list(self.modalities), "verbs": sorted({v for vs in self.modalities.values() for v in vs}),
                "dimensions": d.dimensions, "context": d.context, "quantization": d.quantization.value,
                "backend": self.model.backend} | ({"source": self.model.source} if self.model.source else {})  # fmt: skip

    async def models(self, scope: Scope, receive: Receive) -> Answer:
        path: str = scope["path"]
        if path.startswith("/v1/models/"):
            self.check_model(path.removeprefix("/v1/models/"))
            return 200, orjson.dumps(self.model_card()), [], JSON
        return 200, orjson.dumps({"object": "list", "data": [self.model_card()]}), [], JSON

    async def health(self, scope: Scope, receive: Receive) -> Answer:
        if self.draining or self.batcher is None or self.batcher.draining:
            return 503, b'{"status":"draining"}', [], JSON
        return 200, orjson.dumps({"status": "ok", "queued_items": self.batcher.queued_items()}), [], JSON

    async def metrics_route(self, scope: Scope, receive: Receive) -> Answer:
        return 200, self.metrics.exposition(), [], CONTENT_TYPE.encode()

    async def startup(self) -> None:
        self.batcher = Batcher(self.model, self.config, self.metrics)
        self.watcher = Watcher(self.batcher)
        if self.announce is not None:
            self.announce()

    async def shutdown(self) -> None:
        assert self.batcher is not None
        left = self.config.drain_seconds if self.drain_ends is None else self.drain_ends - time.monotonic()
        try:  # queued jobs are answered within what is left of the drain time, the call under way too
            await asyncio.wait_for(self.batcher.close(), timeout=max(left, 0.1))
        except TimeoutError:
            pass
        self.pool.shutdown(wait=False, cancel_futures=True)


def _may_name_files(body: bytes) -> bool:
    """Whether a body might hold a ``file://`` URL: ``file:`` in any case (``FILE:`` is one too), or a
    JSON escape that may spell it (``\\u0066ile:``)."""
    return b"\\u" in body or b"file:" in body.lower()


def _embeddings_body(req: requests.EmbeddingsRequest, jobs: Jobs, results: list[Any], dims: int, model_id: str, tokens: int) -> bytes:
    """The response to ``req``: its jobs' rows in the order of its items, cut to its ``dimensions``."""
    rows = respond_.assemble([(job.positions, r) for (_, job), r in zip(jobs, results)], len(req.items), dims)
    return respond_.embeddings_body(respond_.prefix(rows, req.dimensions, dims), req.encoding_format, model_id, tokens)


class Watcher:
    """Requests waiting for their verbs. One timer, running while any waits unwatched, gives each
    request still waiting ``WATCH_AFTER`` after it was queued a task awaiting its client's
    disconnect (``http.disconnect``); when that comes, the request's queued jobs are dropped and
    its wait fails with ``ConnectionError``. Most requests are answered sooner and cost a dict
    entry, not a task or a timer of their own."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher
        self.waiting: dict[int, tuple[Jobs, Receive]] = {}  # unwatched, in the order queued
        self.watched: dict[int, asyncio.Future[Any]] = {}
        self.timer: asyncio.TimerHandle | None = None

    def add(self, jobs: Jobs, receive: Receive) -> int:
        key = id(jobs)
        self.waiting[key] = (jobs, receive)
        if self.timer is None:
            self.timer = self.batcher.loop.call_later(WATCH_AFTER, self.sweep)
        return key

    def remove(self, key: int) -> None:
        if self.waiting.pop(key, None) is None:
            self.watched.pop(key).cancel()

    def sweep(self) -> None:
        due = time.perf_counter() - WATCH_AFTER
        keys = []
        for key, (jobs, _) in self.waiting.items():
            if jobs[0][1].enqueued > due:
                break
            keys.append(key)
        for key in keys:
            jobs, receive = self.waiting.pop(key)
            task = self.watched[key] = asyncio.ensure_future(gone(receive))
            self.batcher.drop_when(jobs, task)
        self.timer = self.batcher.loop.call_later(WATCH_AFTER, self.sweep) if self.waiting else None


def create_app(model: Model, config: ServeConfig, log: AccessLog | None = None,
               announce: Callable[[], None] | None = None) -> tuple[App, Routes]:  # fmt: skip
    """The ASGI application serving ``model``, and the :class:`Routes` state behind it;
    ``log`` writes a line per request, ``announce`` is called once the model serves."""
    server = Routes(model, config, announce)
    routes: dict[str, dict[str, Callable[[Scope, Receive], Awaitable[Answer]]]] = {
        "/v1/embeddings": {"POST": server.embeddings},
        "/v1/choose": {"POST": server.choose},
        "/v1/models": {"GET": server.models},  # and /v1/models/{id}
        "/health": {"GET": server.health},
        "/metrics": {"GET": server.metrics_route},
    }
    app = App(routes, api_key=config.api_key, max_request_bytes=config.max_request_bytes, metrics=server.metrics, log=log,
              startup=server.startup, shutdown=server.shutdown)  # fmt: skip
    return app, server
