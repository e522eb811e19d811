"""Prometheus helpers: a registry per app (multi-process aware) and the ``/metrics`` response."""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client import multiprocess as _multiprocess
from starlette.responses import Response

# Latency buckets in seconds, from 50 µs (a coalesced hot-path call) to 10 s (a retrain).
LATENCY_BUCKETS_S = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
ROW_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def new_registry() -> CollectorRegistry:
    """A fresh registry, so apps created in one process (tests) never share metric state."""
    return CollectorRegistry(auto_describe=True)


def metrics_response(registry: CollectorRegistry) -> Response:
    """Render ``registry``; with ``PROMETHEUS_MULTIPROC_DIR`` set, aggregate every worker process."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        collected = CollectorRegistry()
        _multiprocess.MultiProcessCollector(collected)
        data = generate_latest(collected)
    else:
        data = generate_latest(registry)
    return Response(data, media_type=CONTENT_TYPE_LATEST)


def counter_totals(counter: Counter, *, nonzero: bool = False) -> dict[str, int]:
    """A counter's totals by its (single) label value, or ``{"": total}`` without labels: one
    source for both ``/metrics`` and the counts a ``/status`` shows (``nonzero``: skip zeros)."""
    totals: dict[str, int] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                label = next(iter(sample.labels.values()), "")
                if sample.value or not nonzero:
                    totals[label] = int(sample.value)
    return totals
