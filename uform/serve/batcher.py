"""The lanes of every verb the model serves, admission into a bounded queue, and draining.

``submit`` splits a request's items by kind into one job per lane and answers them; a full
queue is a 429 with ``Retry-After``, a draining server a 503. ``gather`` awaits a request's
jobs; when the future it is given resolves first (the client went away), the jobs still
queued are dropped and the request fails with ``ConnectionError``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from uform import Arena, TextItemStats
from uform.verbs import CHOOSE_VERB, ITEM_VERBS

from .config import ServeConfig
from .errors import ApiError
from .lane import Budget, Counted, Depth, Job, Lane
from .metrics import Metrics

if TYPE_CHECKING:
    from uform import Model


def _encoder(model: Model, verb: str) -> Any:
    method = getattr(model, verb)

    def call(payloads: list[Any], arena: Arena) -> np.ndarray:
        return np.array(method(payloads, arena).embeddings)  # copied out of the arena

    return call


def tokenizer_of(model: Model) -> Any:
    """The text tower's own tokenizer (a converted CLIP or SigLIP: ``HeldTokenizer``), or None
    for a byte-level tower or a model without one."""
    from uform.model import runtime_of

    tower = runtime_of(model).towers.get("text")
    return getattr(tower.parsed, "tokenizer", None) if tower is not None else None


def _text_encoder(model: Model) -> Any:
    """``text_encode``'s call; for a model with its own tokenizer, the rows with each text's
    tokens, as the call counted them (``TextItemStats``: the texts are tokenized once)."""
    if tokenizer_of(model) is None:
        return _encoder(model, "text_encode")
    method = model.text_encode

    def call(payloads: list[bytes], arena: Arena) -> Counted:
        stats = TextItemStats()
        rows = np.array(method(payloads, arena, stats=stats).embeddings)
        return Counted(rows, np.asarray(stats.item_tokens, np.int64))

    return call


def _chooser(model: Model) -> Any:
    def call(payloads: list[tuple[bytes, bytes, int]], arena: Arena) -> tuple[np.ndarray, np.ndarray]:
        texts, choices, groups = zip(*payloads)
        return model.text_choose(list(texts), list(choices), arena, temperature_groups=list(groups)).to_numpy()

    return call


UNBATCHED_CALLS = 16  # verb calls each lane runs at once with batching off (one a request)
_IDENTITY = np.arange(4096)
_IDENTITY.flags.writeable = False


def _identity(n: int) -> np.ndarray:
    """Positions ``0..n-1`` (a read-only view for the common sizes)."""
    return _IDENTITY[:n] if n <= len(_IDENTITY) else np.arange(n)


class Batcher:
    def __init__(self, model: Model, config: ServeConfig, metrics: Metrics) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()  # made on the event loop it serves
        self.draining = False
        self.lanes: dict[str, Lane] = {}
        self.depth = Depth()  # items queued in every lane
        served = model.served.verbs
        workers = config.batches_at_once if config.batching else UNBATCHED_CALLS
        window = config.batch_window_ms / 1000
        for kind, verb in [*ITEM_VERBS.items(), ("choose", CHOOSE_VERB)]:
            if verb not in served:
                continue
            items = config.max_batch_items if config.batching else 1
            budget = Budget(items, config.budget(kind) if config.batching else 1, window if config.batching else 0.0)
            call = _chooser(model) if kind == "choose" else _text_encoder(model) if kind == "text" else _encoder(model, verb)
            self.lanes[kind] = Lane(verb, call, budget, metrics, workers, param="input", depth=self.depth, nice=config.model_nice)

    def busy(self) -> bool:
        """Whether a verb call is still running (its thread cannot be stopped)."""
        return any(lane.running for lane in self.lanes.values())

    def queued_items(self) -> int:
        return self.depth.items

    def submit(self, kinds: Sequence[str], payloads: Sequence[Any], costs: Sequence[int]) -> list[tuple[Lane, Job]]:
        """Queue a request's items (``kinds[i]`` is item ``i``'s lane), one job per lane."""
        if self.draining:
            raise ApiError(503, "the server is shutting down and takes no new requests", code="draining")
        if len(payloads) > self.config.max_queue_items:  # would never fit: retrying cannot help
            raise ApiError(400, f"'input' holds {len(payloads)} items, more than the queue holds ({self.config.max_queue_items}, "
                                "--max-queue-items); send fewer items a request", param="input", code="too_many_items")  # fmt: skip
        if self.depth.items + len(payloads) > self.config.max_queue_items:
            raise ApiError(429, f"the queue is full ({self.config.max_queue_items} items); retry shortly", code="queue_full",
                           headers={"Retry-After": str(self.config.retry_after_seconds)})  # fmt: skip
        loop = self.loop
        if len(payloads) == 1 or kinds.count(kinds[0]) == len(kinds):  # one lane: no splitting
            lane = self.lanes.get(kinds[0])
            if lane is None:
                raise self._unsupported(kinds[0])
            job = Job(list(payloads), _identity(len(payloads)), costs[0] if len(costs) == 1 else sum(costs), loop.create_future())
            lane.put(job)
            return [(lane, job)]
        distinct = list(dict.fromkeys(kinds))
        missing = [kind for kind in distinct if kind not in self.lanes]
        if missing:
            raise self._unsupported(missing[0])
        cost_array = np.asarray(costs, dtype=np.int64)
        kind_array = np.asarray(kinds)
        jobs = []
        for kind in distinct:
            positions = np.flatnonzero(kind_array == kind)
            items = [payloads[i] for i in positions.tolist()]
            jobs.append((self.lanes[kind], Job(items, positions, int(cost_array[positions].sum()), loop.create_future())))
        for lane, job in jobs:
            lane.put(job)
        return jobs

    def _unsupported(self, kind: str) -> ApiError:
        return ApiError(400, f"this model serves no {kind} items (it serves {', '.join(self.lanes)})", param="input", code="unsupported_modality")

    async def gather(self, jobs: list[tuple[Lane, Job]], disconnected: asyncio.Future[Any] | None) -> list[Any]:
        """Each job's result, in order; a bad item's ``ApiError`` is raised once every job ended.
        When ``disconnected`` resolves first, queued jobs are dropped and ``ConnectionError`` raised."""
        if disconnected is not None:
            self.drop_when(jobs, disconnected)
        if len(jobs) == 1:
            return [await jobs[0][1].future]  # raises the job's error
        outcomes = await asyncio.gather(*[job.future for _, job in jobs], return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return list(outcomes)

    @staticmethod
    def drop_when(jobs: list[tuple[Lane, Job]], disconnected: asyncio.Future[Any]) -> None:
        """Once ``disconnected`` resolves (not cancelled), drop ``jobs`` still queued and fail
        every one not yet answered with ``ConnectionError``."""
        disconnected.add_done_callback(functools.partial(_drop, jobs))

    async def close(self) -> None:
        self.draining = True
        await asyncio.gather(*(lane.close() for lane in self.lanes.values()))


def _drop(jobs: list[tuple[Lane, Job]], disconnected: asyncio.Future[Any]) -> None:
    """The client went away: its jobs still queued leave the queue, and every job not yet
    answered fails with ``ConnectionError`` (one in a verb call is computed and discarded)."""
    if disconnected.cancelled():
        return
    for lane, job in jobs:
        if not job.future.done():
            lane.discard(job)
            job.future.set_exception(ConnectionError("the client went away"))
