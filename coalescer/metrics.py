"""The coalescer's Prometheus metrics, one registry per app.

The coalescer is one process with one event-loop thread, so its counters and histograms are
plain Python numbers updated without locks (``LoopCounter``/``LoopHistogram``) and turned into
Prometheus families only when ``/metrics`` is scraped. ``prometheus_client``'s own metric
objects take a lock per increment; with five histogram observations per call that was a
measurable share of the per-call CPU on the hot path. Gauges that mirror live state (queue
depth, in-flight calls, per-replica health, relay rate and bytes in flight) are read at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.metrics import LATENCY_BUCKETS_S, ROW_BUCKETS, new_registry

CALLER_BUCKETS = (1, 2, 3, 5, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024)


class LoopCounter:
    """A counter for the event-loop thread only (no lock)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LoopHistogram:
    """A histogram for the event-loop thread only: one bisect and two additions per observation."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # Prometheus buckets are "<= bound"
        self.sum += value


Child = TypeVar("Child", LoopCounter, LoopHistogram)


class Family(Generic[Child]):
    """A metric with labels; ``labels(...)`` returns (and keeps) the child for those values."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], make: Callable[[], Child]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._make: Callable[[], Child] = make
        self.children: dict[tuple[str, ...], Child] = {}

    def labels(self, *values: str) -> Child:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = self._make()
        return child


class LoopMetrics(Collector):
    """Every loop-local family of one app, exported at scrape time."""

    def __init__(self) -> None:
        self._counters: list[Family[LoopCounter]] = []
        self._histograms: list[Family[LoopHistogram]] = []

    def counter(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> Family[LoopCounter]:
        family = Family(name, documentation, labelnames, LoopCounter)
        self._counters.append(family)
        return family

    def histogram(
        self, name: str, documentation: str, buckets: Sequence[float], labelnames: Sequence[str] = ()
    ) -> Family[LoopHistogram]:
        family = Family(name, documentation, labelnames, lambda: LoopHistogram(buckets))
        self._histograms.append(family)
        return family

    def collect(self) -> Iterator[Metric]:
        for counters in self._counters:
            counter_family = CounterMetricFamily(
                counters.name, counters.documentation, labels=counters.labelnames
            )
            for values, child in list(counters.children.items()):
                counter_family.add_metric(list(values), child.value)
            yield counter_family
        for histograms in self._histograms:
            histogram_family = HistogramMetricFamily(
                histograms.name, histograms.documentation, labels=histograms.labelnames
            )
            for values, hist in list(histograms.children.items()):
                cumulative, buckets = 0, []
                for bound, count in zip((*hist.bounds, float("inf")), hist.counts, strict=True):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
                histogram_family.add_metric(list(values), buckets, hist.sum)
            yield histogram_family

    def describe(self) -> Iterator[Metric]:
        return iter(())


class ReplicaView(Protocol):
    """What the per-replica collector reads from a replica."""

    url: str
    inflight_calls: int
    inflight_rows: int

    @property
    def healthy(self) -> bool: ...


@dataclass
class CoalescerMetrics:
    registry: CollectorRegistry
    callers: Family[LoopCounter]
    rejections: Family[LoopCounter]
    call_seconds: Family[LoopHistogram]
    queue_wait: LoopHistogram
    batch_rows: LoopHistogram
    batch_callers: LoopHistogram
    upstream_seconds: LoopHistogram
    upstream_failures: Family[LoopCounter]
    retries: LoopCounter
    dropped_callers: Family[LoopCounter]
    relay_samples_accepted: LoopCounter
    relay_requests: Family[LoopCounter]
    relay_batches: Family[LoopCounter]
    relay_retries: LoopCounter


def create_metrics() -> CoalescerMetrics:
    registry = new_registry()
    m = LoopMetrics()
    registry.register(m)
    return CoalescerMetrics(
        registry=registry,
        callers=m.counter("coalescer_calls", "Prediction calls received, by endpoint", ["endpoint"]),
        rejections=m.counter(
            "coalescer_rejections",
            "Calls answered with an error, by reason (overloaded, deadline_exceeded, invalid_input, ...)",
            ["reason"],
        ),
        call_seconds=m.histogram(
            "coalescer_call_duration_seconds",
            "Prediction calls from their estimated arrival (the handler's start plus the event loop's lag) "
            "to the answer, by endpoint and status code",
            LATENCY_BUCKETS_S,
            ["endpoint", "code"],
        ),
        queue_wait=m.histogram(
            "coalescer_queue_wait_seconds",
            "Time a caller waited before its batch left for a replica",
            LATENCY_BUCKETS_S,
        ).labels(),
        batch_rows=m.histogram("coalescer_batch_rows", "Rows per upstream call", ROW_BUCKETS).labels(),
        batch_callers=m.histogram(
            "coalescer_batch_callers", "Callers per upstream call", CALLER_BUCKETS
        ).labels(),
        upstream_seconds=m.histogram(
            "coalescer_upstream_call_seconds",
            "Duration of upstream batch calls, successful or not",
            LATENCY_BUCKETS_S,
        ).labels(),
        upstream_failures=m.counter(
            "coalescer_upstream_failures",
            "Failed upstream batch calls, by kind (connect, timeout, status, protocol)",
            ["kind"],
        ),
        retries=m.counter("coalescer_retries", "Batches retried on another replica after a failure").labels(),
        dropped_callers=m.counter(
            "coalescer_dropped_callers",
            "Callers dropped before dispatch, by reason (deadline_exceeded, disconnected)",
            ["reason"],
        ),
        relay_samples_accepted=m.counter(
            "coalescer_relay_samples_accepted",
            "Training samples the training server accepted (202) and we acknowledged with 202",
        ).labels(),
        relay_requests=m.counter(
            "coalescer_relay_requests",
            "Sample requests by the answer the sender got (accepted, rate_limited, inflight_full, too_large, "
            "invalid, upstream_throttled, upstream_rejected, upstream_error, timeout, unreachable, "
            "shutting_down)",
            ["outcome"],
        ),
        relay_batches=m.counter(
            "coalescer_relay_batches",
            "Relayed bulk calls to the training server by outcome (accepted, throttled, server_error, "
            "timeout, network, rejected, unauthorized)",
            ["outcome"],
        ),
        relay_retries=m.counter(
            "coalescer_relay_retries",
            "Relayed bulk calls resent with the same Idempotency-Key after a timeout or a network error",
        ).labels(),
    )


def gauge_from(registry: CollectorRegistry, name: str, documentation: str, read: Callable[[], float]) -> None:
    """A gauge whose value is read from live state at scrape time."""
    Gauge(name, documentation, registry=registry).set_function(read)


class ReplicaCollector(Collector):
    """Per-replica health and outstanding work, generated from the current replica set at scrape time.

    Replicas come and go with DNS; generating the series on each scrape leaves no stale labels behind.
    """

    def __init__(self, replicas: Callable[[], Iterable[ReplicaView]]) -> None:
        self._replicas = replicas

    def collect(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(
            "coalescer_replica_healthy", "1 if the replica receives traffic, 0 if ejected", labels=["replica"]
        )
        calls = GaugeMetricFamily(
            "coalescer_replica_inflight_calls", "Upstream calls in flight per replica", labels=["replica"]
        )
        rows = GaugeMetricFamily(
            "coalescer_replica_outstanding_rows", "Rows in flight per replica", labels=["replica"]
        )
        for replica in self._replicas():
            healthy.add_metric([replica.url], 1.0 if replica.healthy else 0.0)
            calls.add_metric([replica.url], replica.inflight_calls)
            rows.add_metric([replica.url], replica.inflight_rows)
        yield from (healthy, calls, rows)

    def describe(self) -> Iterator[Metric]:
        return iter(())
