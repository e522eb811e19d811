"""The coalescer's Prometheus metrics, one registry per app.

Gauges that mirror live state (queue depth, in-flight calls, per-replica health, relay rate and
buffer) are read at scrape time through callbacks, so the hot path pays nothing for them; only
counters and histograms are touched per caller or per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.metrics import LATENCY_BUCKETS_S, ROW_BUCKETS, new_registry

CALLER_BUCKETS = (1, 2, 3, 5, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024)


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
    callers: Counter
    rejections: Counter
    call_seconds: Histogram
    queue_wait: Histogram
    batch_rows: Histogram
    batch_callers: Histogram
    upstream_seconds: Histogram
    upstream_failures: Counter
    retries: Counter
    dropped_callers: Counter
    relay_accepted: Counter
    relay_relayed: Counter
    relay_dropped: Counter
    relay_batches: Counter


def create_metrics() -> CoalescerMetrics:
    registry = new_registry()
    return CoalescerMetrics(
        registry=registry,
        callers=Counter(
            "coalescer_calls", "Prediction calls received, by endpoint", ["endpoint"], registry=registry
        ),
        rejections=Counter(
            "coalescer_rejections",
            "Calls answered with an error, by reason (overloaded, deadline_exceeded, invalid_input, ...)",
            ["reason"],
            registry=registry,
        ),
        call_seconds=Histogram(
            "coalescer_call_duration_seconds",
            "Prediction calls from the first byte read to the answer, by endpoint and status code",
            ["endpoint", "code"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        ),
        queue_wait=Histogram(
            "coalescer_queue_wait_seconds",
            "Time a caller waited before its batch left for a replica",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        ),
        batch_rows=Histogram(
            "coalescer_batch_rows", "Rows per upstream call", buckets=ROW_BUCKETS, registry=registry
        ),
        batch_callers=Histogram(
            "coalescer_batch_callers", "Callers per upstream call", buckets=CALLER_BUCKETS, registry=registry
        ),
        upstream_seconds=Histogram(
            "coalescer_upstream_call_seconds",
            "Duration of upstream batch calls, successful or not",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        ),
        upstream_failures=Counter(
            "coalescer_upstream_failures",
            "Failed upstream batch calls, by kind (connect, timeout, status, protocol)",
            ["kind"],
            registry=registry,
        ),
        retries=Counter(
            "coalescer_retries", "Batches retried on another replica after a failure", registry=registry
        ),
        dropped_callers=Counter(
            "coalescer_dropped_callers",
            "Callers dropped before dispatch, by reason (deadline_exceeded, disconnected)",
            ["reason"],
            registry=registry,
        ),
        relay_accepted=Counter(
            "coalescer_relay_samples_accepted", "Training samples accepted (202)", registry=registry
        ),
        relay_relayed=Counter(
            "coalescer_relay_samples_relayed",
            "Training samples the training server accepted from us",
            registry=registry,
        ),
        relay_dropped=Counter(
            "coalescer_relay_samples_dropped",
            "Accepted training samples that never reached the training server, by reason",
            ["reason"],
            registry=registry,
        ),
        relay_batches=Counter(
            "coalescer_relay_batches",
            "Relayed bulk calls by outcome (accepted, throttled, server_error, timeout, network, rejected)",
            ["outcome"],
            registry=registry,
        ),
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
