"""Prometheus metrics of the prediction server.

With several worker processes (``PROMETHEUS_MULTIPROC_DIR`` set by ``__main__``) counters and
histograms are summed over workers, and the model gauges are reported per worker (``pid``
label), so one scrape shows whether every worker serves the same version.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.errors import ServiceError
from shared.metrics import LATENCY_BUCKETS_S, ROW_BUCKETS

ENDPOINTS = ("predict_bulk_strict", "predict_bulk", "predict")


class PredictionMetrics:
    """Every metric the service exports, registered in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "prediction_requests",
            "Prediction calls by endpoint and HTTP status.",
            ["endpoint", "status"],
            registry=registry,
        )
        self.rows = Counter(
            "prediction_rows", "Rows predicted (successfully) by endpoint.", ["endpoint"], registry=registry
        )
        self.latency = Histogram(
            "prediction_request_duration_seconds",
            "Time from the start of handling to the encoded response, by endpoint.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.rows_per_call = Histogram(
            "prediction_rows_per_call",
            "Rows in each successful prediction call, by endpoint.",
            ["endpoint"],
            buckets=ROW_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            "prediction_errors", "Requests answered with an error, by kind.", ["kind"], registry=registry
        )
        self.item_errors = Counter(
            "prediction_item_errors",
            "Rows of POST /predict/bulk answered with a per-item error instead of a prediction.",
            registry=registry,
        )
        # Numbers, not a version label: labels would add a series per version forever (the
        # multiprocess files cannot drop one). Version names are "<sequence:06d>-<kind>".
        self.model_sequence = Gauge(
            "prediction_model_sequence",
            "Sequence number of the model version this worker serves (0: the built-in prior).",
            multiprocess_mode="liveall",
            registry=registry,
        )
        self.model_is_prior = Gauge(
            "prediction_model_is_prior",
            "1 while this worker serves a prior (no trained model yet), else 0.",
            multiprocess_mode="liveall",
            registry=registry,
        )
        self.model_age = Gauge(
            "prediction_model_age_seconds",
            "Seconds since the served model version was created (refreshed every store poll).",
            multiprocess_mode="liveall",
            registry=registry,
        )
        self.model_loaded = Gauge(
            "prediction_model_loaded_timestamp_seconds",
            "Unix time at which this worker started serving its current version.",
            multiprocess_mode="liveall",
            registry=registry,
        )
        self.model_loads = Counter(
            "prediction_model_loads", "Model versions accepted, by kind.", ["kind"], registry=registry
        )
        self.refused = Counter(
            "prediction_refused_versions",
            "Model versions refused (failed verification or self-test), by reason, counted per worker.",
            ["reason"],
            registry=registry,
        )
        self.store_reachable = Gauge(
            "prediction_store_reachable",
            "1 if the last poll of the model store succeeded.",
            multiprocess_mode="liveall",
            registry=registry,
        )
        self.store_poll_failures = Counter(
            "prediction_store_poll_failures",
            "Polls of the model store that failed (store unreachable or version vanished).",
            registry=registry,
        )
        # Children bound once: labels() costs a dict lookup and a lock on every call otherwise.
        self._ok = {e: self.requests.labels(e, "200") for e in ENDPOINTS}
        self._rows = {e: self.rows.labels(e) for e in ENDPOINTS}
        self._latency = {e: self.latency.labels(e) for e in ENDPOINTS}
        self._rows_per_call = {e: self.rows_per_call.labels(e) for e in ENDPOINTS}

    def observe_success(self, endpoint: str, rows: int, elapsed_s: float) -> None:
        self._ok[endpoint].inc()
        self._rows[endpoint].inc(rows)
        self._rows_per_call[endpoint].observe(rows)
        self._latency[endpoint].observe(elapsed_s)

    def observe_failure(self, endpoint: str, exc: BaseException, elapsed_s: float) -> None:
        status = exc.status_code if isinstance(exc, ServiceError) else 500
        self.requests.labels(endpoint, str(status)).inc()
        self._latency[endpoint].observe(elapsed_s)

    def count_error(self, exc: ServiceError) -> None:
        self.errors.labels(exc.reason).inc()

    def model_served(self, sequence: int, kind: str, created_at_s: float | None) -> None:
        self.model_sequence.set(sequence)
        self.model_is_prior.set(1 if kind == "prior" else 0)
        self.model_loaded.set(time.time())
        self.model_loads.labels(kind).inc()
        self.refresh_age(created_at_s)

    def refresh_age(self, created_at_s: float | None) -> None:
        if created_at_s is not None:
            self.model_age.set(max(0.0, time.time() - created_at_s))
