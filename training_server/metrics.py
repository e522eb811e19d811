"""Prometheus metrics of the training server (one registry per app instance)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.metrics import LATENCY_BUCKETS_S, ROW_BUCKETS

_MODEL_METRICS = {"coverage": "coverage", "pinball_loss_ms": "pinball", "mape": "mape"}


class TrainingMetrics:
    """Every metric the service exports; names start with ``training_``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.samples_accepted = Counter(
            "training_samples_accepted", "Samples accepted (202) for the window", registry=r
        )
        self.samples_rejected = Counter(
            "training_samples_rejected",
            "Samples in rejected ingest requests, by reason (0 counted when the body was unreadable)",
            ["reason"],
            registry=r,
        )
        self.requests_rejected = Counter(
            "training_ingest_requests_rejected", "Rejected ingest requests, by reason", ["reason"], registry=r
        )
        self.samples_evicted = Counter(
            "training_window_evicted_samples",
            "Samples that left the window: cap (stratum full), age, flush; stale: too old on arrival",
            ["reason"],
            registry=r,
        )
        self.window_samples = Gauge("training_window_samples", "Samples in the window", registry=r)
        self.window_strata = Gauge("training_window_strata", "Non-empty strata in the window", registry=r)
        self.intake_pending = Gauge(
            "training_intake_pending_samples", "Accepted samples not yet inserted", registry=r
        )
        self.ingest_seconds = Histogram(
            "training_ingest_seconds",
            "Time to read, validate and queue one ingest request",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.ingest_rows = Histogram(
            "training_ingest_batch_samples",
            "Samples per accepted ingest request",
            buckets=ROW_BUCKETS,
            registry=r,
        )
        self.journal_records = Counter(
            "training_journal_records", "Records (batches, flushes) written to the journal", registry=r
        )
        self.journal_replayed = Counter(
            "training_journal_replayed_samples", "Samples re-inserted from the journal at start-up", registry=r
        )
        self.duplicates = Counter(
            "training_ingest_duplicate_batches",
            "Batches answered 202 without inserting: their Idempotency-Key was already accepted",
            registry=r,
        )
        self.quarantined = Counter(
            "training_quarantined_files",
            "Corrupt files moved aside, by kind (window, journal, current, version)",
            ["kind"],
            registry=r,
        )
        self.training_seconds = Histogram(
            "training_run_seconds", "Wall time of one retrain", buckets=LATENCY_BUCKETS_S, registry=r
        )
        self.training_runs = Counter("training_runs", "Retrains by outcome", ["outcome"], registry=r)
        self.publishes = Counter("training_publishes", "Model versions published", registry=r)
        self.candidates_rejected = Counter(
            "training_candidates_rejected",
            "Candidate models refused by the publish guard",
            ["model"],
            registry=r,
        )
        self.last_run = Gauge(
            "training_last_run_timestamp_seconds", "Unix time the last retrain finished", registry=r
        )
        self.coverage = Gauge(
            "training_model_coverage",
            "Held-out coverage (actual <= prediction) of the current model or the last candidate",
            ["model", "role"],
            registry=r,
        )
        self.pinball = Gauge(
            "training_model_pinball_loss_ms", "Held-out pinball loss (ms)", ["model", "role"], registry=r
        )
        self.mape = Gauge("training_model_mape", "Held-out MAPE", ["model", "role"], registry=r)
        self.version_info = Gauge(
            "training_model_version_info",
            "The current model version (value 1)",
            ["version", "kind"],
            registry=r,
        )

        # Export zeros for the known label values, so dashboards and alerts see them from the start.
        for reason in ("invalid_input", "payload_too_large", "ingest_saturated", "unauthorized"):
            self.samples_rejected.labels(reason)
            self.requests_rejected.labels(reason)
        for reason in ("cap", "age", "flush", "stale"):
            self.samples_evicted.labels(reason)
        for outcome in ("published", "rejected", "skipped", "failed", "cancelled"):
            self.training_runs.labels(outcome)
        for model in ("ttft", "tpot"):
            self.candidates_rejected.labels(model)

    def bind(
        self, window_size: Callable[[], int], strata: Callable[[], int], pending: Callable[[], int]
    ) -> None:
        """Sample these values at scrape time."""
        self.window_samples.set_function(window_size)
        self.window_strata.set_function(strata)
        self.intake_pending.set_function(pending)

    def reject(self, reason: str, samples: int) -> None:
        self.requests_rejected.labels(reason).inc()
        self.samples_rejected.labels(reason).inc(samples)

    def set_model_metrics(self, model: str, role: str, overall: dict[str, Any] | None) -> None:
        for key, attr in _MODEL_METRICS.items():
            value = (overall or {}).get(key)
            gauge: Gauge = getattr(self, attr)
            if isinstance(value, int | float):
                gauge.labels(model, role).set(value)

    def set_version(self, version: str, kind: str) -> None:
        self.version_info.clear()
        self.version_info.labels(version, kind).set(1)
