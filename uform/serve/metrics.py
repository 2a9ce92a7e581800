"""The server's Prometheus metrics, in a registry of its own (``GET /metrics``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """Requests by route and status, items by modality, batch sizes, queue depth, queue and
    inference time; one instance per application."""

    def __init__(self, queue_depth: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("uform_requests", "HTTP requests answered, by route and status", ["route", "status"], registry=r)
        self.items = Counter("uform_items", "items received in requests, by modality", ["modality"], registry=r)
        self.dropped = Counter("uform_dropped_items", "queued items dropped because their client went away", ["verb"], registry=r)
        self.failed = Counter("uform_failed_items", "items refused by a verb (the request got a 400)", ["verb"], registry=r)
        self.batch_items = Histogram("uform_batch_items", "items in one verb call", ["verb"], buckets=_SIZES, registry=r)
        self.batch_requests = Histogram("uform_batch_requests", "requests coalesced into one verb call", ["verb"], buckets=_SIZES, registry=r)
        self.queue_seconds = Histogram("uform_queue_seconds", "time an item waited before its verb call began", ["verb"], buckets=_SECONDS, registry=r)
        self.inference_seconds = Histogram("uform_inference_seconds", "time of one verb call", ["verb"], buckets=_SECONDS, registry=r)
        self.request_seconds = Histogram("uform_request_seconds", "time from a request's arrival to its response", ["route"], buckets=_SECONDS, registry=r)
        self._children: dict[tuple[str, str], Any] = {}
        depth = Gauge("uform_queue_items", "items queued and not yet in a verb call", registry=r)
        depth.set_function(queue_depth)

    def child(self, metric: Any, label: str) -> Any:
        """``metric.labels(label)``, looked up once (labels() costs a lock and a tuple a call)."""
        key = (metric._name, label)  # noqa: SLF001 - the metric's own name
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(label)
        return found

    def item_counter(self, kind: str) -> Any:
        return self.child(self.items, kind)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
