"""The server's Prometheus metrics, in a registry of its own (``GET /metrics``).

What every request and every batch updates costs a list append or a dict increment on the
event loop, not a ``prometheus_client`` metric's lock and bucket search: :class:`Tally`
keeps a histogram's observations and folds them into bucket counts in bulk (numpy, every
``FOLD`` observations and at each scrape), :class:`Counts` keeps a counter's values by
label, and a collector of this module's own hands both to ``prometheus_client``'s registry
as metric families at each scrape. Rare events (items refused or dropped) are
``prometheus_client`` counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE = CONTENT_TYPE_LATEST
FOLD = 4096  # observations a label keeps before they are folded into its buckets


class Tally:
    """A histogram by one label: ``values(label).append(x)`` observes ``x`` (the list is the
    label's; :meth:`fold` empties it into bucket counts, here once it holds ``FOLD``)."""

    def __init__(self, name: str, documentation: str, label: str, buckets: Sequence[float]) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.bounds = np.asarray(buckets, np.float64)
        self._pending: dict[str, list[float]] = {}
        self._counts: dict[str, np.ndarray] = {}  # per bucket (the last: above every bound)
        self._sums: dict[str, float] = {}

    def values(self, label: str) -> list[float]:
        """The list observations of ``label`` are appended to (look it up once and keep it)."""
        found = self._pending.get(label)
        if found is None:
            found = self._pending[label] = []
            self._counts[label] = np.zeros(len(self.bounds) + 1, np.int64)
            self._sums[label] = 0.0
        return found

    def observe(self, label: str, value: float) -> None:
        pending = self.values(label)
        pending.append(value)
        if len(pending) >= FOLD:
            self.fold(label)

    def observe_many(self, label: str, values: Sequence[float]) -> None:
        pending = self.values(label)
        pending.extend(values)
        if len(pending) >= FOLD:
            self.fold(label)

    def due(self, label: str) -> None:
        """Fold ``label``'s observations when it holds ``FOLD`` or more."""
        if len(self._pending[label]) >= FOLD:
            self.fold(label)

    def fold(self, label: str) -> None:
        pending = self._pending[label]
        if not pending:
            return
        n = len(pending)
        values = np.asarray(pending[:n], np.float64)
        del pending[:n]  # the same list (whoever holds it keeps appending), less what was read
        # a value equal to a bound counts in that bound's bucket (Prometheus's le)
        self._counts[label] += np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.bounds) + 1)
        self._sums[label] += float(values.sum())

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for label in self._pending:
            self.fold(label)
            cumulative = np.cumsum(self._counts[label]).tolist()
            buckets = [(repr(b), c) for b, c in zip(self.bounds.tolist(), cumulative)] + [("+Inf", cumulative[-1])]
            family.add_metric([label], buckets, self._sums[label])
        return family


class Counts:
    """A counter by labels: ``counts[key] = counts.get(key, 0) + n``, ``key`` the labels' values
    in a tuple (any values: each is written with ``str``)."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.counts: dict[tuple[object, ...], float] = {}

    def inc(self, key: tuple[object, ...], amount: float = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + amount

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, value in list(self.counts.items()):
            family.add_metric([str(k) for k in key], value)
        return family


class _Collector:
    def __init__(self, metrics: Sequence[Tally | Counts]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for metric in self.metrics:
            yield metric.family()

    def describe(self) -> list[Metric]:
        return []  # families are made at each scrape; names are not checked against others'


class Metrics:
    """Requests by route and status, items by modality, batch sizes, queue depth, queue and
    inference time; one instance per application. Updated on the event loop only (``failed``
    and ``called_items``, ``prometheus_client`` counters, from the verbs' threads too)."""

    def __init__(self, queue_depth: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counts("uform_requests", "HTTP requests answered, by route and status", ["route", "status"])
        self.items = Counts("uform_items", "items received in requests, by modality", ["modality"])
        self.dropped = Counter("uform_dropped_items", "queued items dropped because their client went away", ["verb"], registry=r)
        self.failed = Counter("uform_failed_items", "items refused by a verb (the request got a 400)", ["verb"], registry=r)
        self.called_items = Counter("uform_called_items", "items handed to verb calls (an item again in each call made again after a bad item)",
                                    ["verb"], registry=r)  # fmt: skip
        self.batch_items = Tally("uform_batch_items", "items in one verb call", "verb", _SIZES)
        self.batch_requests = Tally("uform_batch_requests", "requests coalesced into one verb call", "verb", _SIZES)
        self.queue_seconds = Tally("uform_queue_seconds", "time an item waited before its verb call began", "verb", _SECONDS)
        self.inference_seconds = Tally("uform_inference_seconds", "time of one verb call", "verb", _SECONDS)
        self.request_seconds = Tally("uform_request_seconds", "time from a request's arrival to its response", "route", _SECONDS)
        r.register(_Collector([self.requests, self.items, self.batch_items, self.batch_requests, self.queue_seconds,
                               self.inference_seconds, self.request_seconds]))  # fmt: skip
        depth = Gauge("uform_queue_items", "items queued and not yet in a verb call", registry=r)
        depth.set_function(queue_depth)

    def batch(self, verb: str, items: int, requests: int, seconds: float, waited: Sequence[float]) -> None:
        """One verb call's figures: its items, requests, time, and each request's wait."""
        self.batch_items.observe(verb, items)
        self.batch_requests.observe(verb, requests)
        self.inference_seconds.observe(verb, seconds)
        self.queue_seconds.observe_many(verb, waited)

    def item_count(self, kind: str, n: int = 1) -> None:
        key = (kind,)
        counts = self.items.counts
        counts[key] = counts.get(key, 0) + n

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
