"""Prometheus metrics of the training server (one registry per app instance)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.artifacts import MODEL_NAMES, Manifest
from shared.errors import ArtifactError
from shared.features import FEATURE_NAMES
from shared.identity import MODEL_TYPE
from shared.metrics import LATENCY_BUCKETS_S, ROW_BUCKETS
from shared.model_store import ModelStore

_MODEL_METRICS = {"coverage": "coverage", "pinball_loss_ms": "pinball", "mape": "mape"}


class TrainingMetrics:
    """Every metric the service exports; names start with ``training_``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = self.registry = registry
        self._llmd: LlmdSeries | None = None
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
            "training_journal_replayed_samples",
            "Samples re-inserted from the journal at start-up",
            registry=r,
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
        self.model_age = Gauge(
            "training_model_age_seconds",
            "Seconds since the current (serving) model version was published",
            registry=r,
        )
        self.version_info = Gauge(
            "training_model_version_info",
            "The current model version (value 1)",
            ["version", "kind"],
            registry=r,
        )
        self.live_scored = Counter(
            "training_live_scored_samples",
            "Arriving samples scored against the version that served them",
            ["model"],
            registry=r,
        )
        self.live_skipped = Counter(
            "training_live_skipped_samples",
            "Arriving samples not scored because live scoring was behind (ingestion never waits for it)",
            registry=r,
        )
        self.live_coverage = Gauge(
            "training_live_coverage",
            "Live coverage (actual <= served prediction) over the recent samples of a regime",
            ["model", "regime"],
            registry=r,
        )
        self.live_pinball = Gauge(
            "training_live_pinball_loss_ms",
            "Live pinball loss (ms) over the recent samples of a regime",
            ["model", "regime"],
            registry=r,
        )
        self.regime_offset = Gauge(
            "training_regime_offset",
            "Online calibration offset (log-latency units) of a regime in the current version",
            ["model", "regime"],
            registry=r,
        )
        self.drift_events = Counter(
            "training_drift_events",
            "Drift events (sustained coverage drop or loss rise in a regime); each asks for a retrain",
            ["model", "regime"],
            registry=r,
        )
        self.calibration_publishes = Counter(
            "training_calibration_publishes",
            "Calibration versions published (same trees, new per-regime offsets)",
            registry=r,
        )
        self.seconds_since_drift = Gauge(
            "training_seconds_since_regime_change",
            "Seconds since the last drift event (-1: none yet)",
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
            self.live_scored.labels(model)

    def bind(
        self,
        window_size: Callable[[], int],
        strata: Callable[[], int],
        pending: Callable[[], int],
        model_age_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """Sample these values at scrape time."""
        self.model_age.set_function(model_age_s)
        self.window_samples.set_function(window_size)
        self.window_strata.set_function(strata)
        self.intake_pending.set_function(pending)

    def bind_drift(self, seconds_since: Callable[[], float | None]) -> None:
        self.seconds_since_drift.set_function(lambda: _or_minus_one(seconds_since()))

    def set_live(
        self,
        model: str,
        regimes: list[str],
        coverage: np.ndarray,
        pinball: np.ndarray,
        offsets: tuple[float, ...],
    ) -> None:
        """Live figures of one model per regime (regimes without recent samples are left out)."""
        for r, regime in enumerate(regimes):
            self.regime_offset.labels(model, regime).set(offsets[r])
            if np.isfinite(coverage[r]):
                self.live_coverage.labels(model, regime).set(float(coverage[r]))
                self.live_pinball.labels(model, regime).set(float(pinball[r]))

    def bind_model(self, current: Callable[[], Manifest | None], store: ModelStore) -> None:
        """Export the llm-d predictor's series for the current version (see ``LlmdSeries``);
        binding again (a new service on the same app) replaces the sources."""
        if self._llmd is None:
            self._llmd = LlmdSeries(current, store)
            self.registry.register(self._llmd)
        else:
            self._llmd.rebind(current, store)

    def clear_model_metrics(self) -> None:
        """Forget the held-out quality gauges (``POST /flush`` with ``flush_metrics``); the next
        publish sets them again."""
        for gauge in (self.coverage, self.pinball, self.mape):
            gauge.clear()

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


def _or_minus_one(value: float | None) -> float:
    return -1.0 if value is None else value


class LlmdSeries(Collector):
    """The llm-d latency predictor's series names, so its dashboards keep working.

    ``model_type{model,type}``, ``ttft_importance{feature}`` / ``tpot_importance{feature}`` (the
    booster's total gain per feature, normalised to sum to 1, as scikit-learn's
    ``feature_importances_``), ``training_samples_count{model}``, ``ensemble_active`` and
    ``ensemble_mode`` (0: we serve one model per target). Importances are computed once per version.
    """

    def __init__(self, current: Callable[[], Manifest | None], store: ModelStore) -> None:
        self.rebind(current, store)

    def rebind(self, current: Callable[[], Manifest | None], store: ModelStore) -> None:
        self._current = current
        self._store = store
        self._importance: tuple[str, dict[str, dict[str, float]]] | None = None

    def collect(self) -> Iterable[Metric]:
        manifest = self._current()
        model_type = GaugeMetricFamily("model_type", "Model type per model (1)", labels=["model", "type"])
        samples = GaugeMetricFamily(
            "training_samples_count", "Samples the current model was trained on", labels=["model"]
        )
        for name in MODEL_NAMES:
            model_type.add_metric([name, MODEL_TYPE], 1.0)
            samples.add_metric([name], float(manifest.training_samples.get(name, 0)) if manifest else 0.0)
        yield model_type
        yield samples
        importance = self._importances(manifest)
        for name in MODEL_NAMES:
            family = GaugeMetricFamily(
                f"{name}_importance", f"Feature gain share of the {name} model", labels=["feature"]
            )
            for feature, value in importance.get(name, {}).items():
                family.add_metric([feature], value)
            yield family
        yield GaugeMetricFamily("ensemble_active", "1 if an ensemble answers (never: one model)", value=0.0)
        yield GaugeMetricFamily("ensemble_mode", "1 if ensemble mode is configured (never)", value=0.0)

    def _importances(self, manifest: Manifest | None) -> dict[str, dict[str, float]]:
        if manifest is None:
            return {}
        if self._importance is not None and self._importance[0] == manifest.version:
            return self._importance[1]
        try:
            model_set = self._store.load(manifest.version)
        except ArtifactError:
            return {}  # pruned or unreadable: nothing to say this scrape
        result = {name: gain_shares(data) for name, data in model_set.files.items()}
        self._importance = (manifest.version, result)
        return result


def gain_shares(model: bytes) -> dict[str, float]:
    """Total gain per feature of a native XGBoost model, as shares summing to 1 (0 for unused features)."""
    import xgboost as xgb

    booster = xgb.Booster(params={"nthread": 1})
    booster.load_model(bytearray(model))
    gains = booster.get_score(importance_type="total_gain")
    by_index = {
        int(key[1:]): value
        for key, value in gains.items()
        if key[:1] == "f" and key[1:].isdigit() and isinstance(value, float | int)
    }
    by_name = {name: float(by_index.get(i, 0.0)) for i, name in enumerate(FEATURE_NAMES)}
    total = sum(by_name.values())
    return {name: (value / total if total > 0 else 0.0) for name, value in by_name.items()}
