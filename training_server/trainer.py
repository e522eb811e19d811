"""Retraining: fit, calibrate, evaluate, guard and publish the TTFT and TPOT models.

``Trainer.run`` is blocking and runs in the service's single trainer thread (never on the
event loop). For each model it keeps the samples whose target is non-zero (0 means the
sample carries no such latency), orders them by (timestamp, arrival) and holds out the
newest part, so evaluation predicts the future as production does. The rest is split into
*train* and *calibration* parts, the calibration part spread over the whole span in short
runs (``evaluation.calibration_mask``): under bursty traffic a contiguous stretch holds one
regime and would make the offset swing with it. A quantile (or mean) XGBoost model is fitted
on log1p(latency), calibrated with a conformal offset on the calibration part, and scored on
the held-out part. The current published version is scored on the same held-out samples;
the candidate replaces it only if it is not worse. A model that cannot be trained or loses
keeps the current one, so a version may update just one of the two models.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import xgboost as xgb

from shared.artifacts import MODEL_NAMES, Manifest, ModelSpec, ModelStore, to_latency_ms, to_margin_target
from shared.errors import ArtifactError
from shared.features import build_features
from shared.logging import log_event
from shared.prior import build_prior_models
from training_server import evaluation
from training_server.config import TrainingSettings
from training_server.window import WindowSnapshot, fair_quota

log = logging.getLogger(__name__)

TARGETS = {"ttft": "actual_ttft_ms", "tpot": "actual_tpot_ms"}
MIN_TAIL_SAMPLES = 5  # samples a leaf needs beyond its quantile for that quantile to mean anything
Outcome = Literal["published", "rejected", "skipped", "failed", "cancelled"]


class TrainingCancelled(Exception):
    """The service is shutting down; the run stopped without publishing."""


@dataclass
class TrainingOutcome:
    """What one run did, for /status, metrics and logs."""

    outcome: Outcome
    detail: str
    duration_s: float = 0.0
    version: str | None = None
    window_samples: int = 0
    models: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Candidate:
    name: str
    samples: dict[str, int]
    booster: xgb.Booster | None = None
    offset: float = 0.0
    metrics: dict[str, Any] | None = None
    current_metrics: dict[str, Any] | None = None
    accepted: bool = False
    reason: str = ""


@dataclass
class _Current:
    manifest: Manifest
    files: dict[str, bytes]
    boosters: dict[str, xgb.Booster]


class _StopWhenSet(xgb.callback.TrainingCallback):
    def __init__(self, stop: threading.Event) -> None:
        super().__init__()
        self._stop = stop

    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        return self._stop.is_set()


class Trainer:
    """Fits and publishes model versions into ``store`` (see the module docstring)."""

    def __init__(self, store: ModelStore, settings: TrainingSettings) -> None:
        self.store = store
        self.settings = settings
        self._current: _Current | None = None
        self.stop = threading.Event()

    def params(self) -> dict[str, Any]:
        s = self.settings
        params: dict[str, Any] = {
            "tree_method": "hist",
            "max_depth": s.max_depth,
            "eta": s.learning_rate,
            "max_bin": s.max_bin,
            "min_child_weight": min_leaf_samples(s.objective, s.quantile),
            "nthread": s.training_threads,
            "seed": 0,
            "verbosity": 0,
        }
        if s.objective == "quantile":
            params.update(objective="reg:quantileerror", quantile_alpha=s.quantile)
        else:
            params["objective"] = "reg:squarederror"
        return params

    def run(
        self, snapshot: WindowSnapshot, now_s: float, window_samples: int | None = None
    ) -> TrainingOutcome:
        """Train on ``snapshot`` and publish if the guard allows; blocking.

        ``window_samples`` is the window's size when ``snapshot`` is already a thinned copy.
        """
        started = time.perf_counter()
        snap = thin(snapshot, self.settings.max_train_samples)
        features = build_features(snap.columns()) if len(snap) else np.empty((0, 0), np.float32)
        current = self._load_current()
        candidates = {name: self._fit(name, snap, features, current, now_s) for name in MODEL_NAMES}
        window = len(snapshot) if window_samples is None else window_samples
        outcome = self._decide_and_publish(candidates, current, window, len(snap))
        outcome.duration_s = time.perf_counter() - started
        return outcome

    def _fit(
        self, name: str, snap: WindowSnapshot, features: np.ndarray, current: _Current | None, now_s: float
    ) -> _Candidate:
        s = self.settings
        actual = snap.column(TARGETS[name]) if len(snap) else np.empty(0)
        rows = np.flatnonzero(actual > 0)
        if len(rows) < s.min_train_samples:
            return _Candidate(name, {"usable": len(rows)}, reason=f"only {len(rows)} samples")
        rows = rows[np.lexsort((snap.column("seq")[rows], snap.column("timestamp")[rows]))]
        n_hold = max(1, round(len(rows) * s.holdout_fraction))
        n_cal = max(1, round(len(rows) * s.calibration_fraction))
        fit_rows, hold = rows[: len(rows) - n_hold], rows[len(rows) - n_hold :]
        is_cal = evaluation.calibration_mask(len(fit_rows), n_cal)
        train, cal = fit_rows[~is_cal], fit_rows[is_cal]
        target = to_margin_target(actual, "log1p")
        weight = None
        if s.recency_half_life_s > 0:
            age_s = np.maximum(now_s - snap.column("timestamp")[train], 0.0)
            weight = 0.5 ** (age_s / s.recency_half_life_s)
        dtrain = xgb.QuantileDMatrix(
            features[train], label=target[train], weight=weight, max_bin=s.max_bin, nthread=s.training_threads
        )
        booster = xgb.train(
            self.params(),
            dtrain,
            num_boost_round=s.n_estimators,
            callbacks=[_StopWhenSet(self.stop)],
        )
        if self.stop.is_set():
            raise TrainingCancelled()
        margin_cal = booster.inplace_predict(features[cal], predict_type="margin")
        if s.objective == "quantile":
            offset = evaluation.conformal_offset(target[cal] - margin_cal, s.quantile)
        else:
            offset = evaluation.mean_offset(target[cal], margin_cal)
        spec = ModelSpec(file="", sha256="", size_bytes=0, calibration_offset=offset)
        predicted = to_latency_ms(booster.inplace_predict(features[hold], predict_type="margin"), spec)
        metrics = evaluation.evaluate(actual[hold], predicted, snap.strata[hold], s.objective, s.quantile)
        metrics["calibration_coverage"] = float(np.mean(actual[cal] <= to_latency_ms(margin_cal, spec)))
        candidate = _Candidate(
            name,
            {"train": len(train), "calibration": len(cal), "holdout": len(hold)},
            booster=booster,
            offset=offset,
            metrics=metrics,
        )
        if current is not None and name in current.boosters:
            cur_spec = current.manifest.models[name]
            cur_margin = current.boosters[name].inplace_predict(features[hold], predict_type="margin")
            cur_pred = to_latency_ms(cur_margin, cur_spec)
            candidate.current_metrics = evaluation.evaluate(
                actual[hold], cur_pred, snap.strata[hold], s.objective, s.quantile
            )
        return candidate

    def _decide_and_publish(
        self, candidates: dict[str, _Candidate], current: _Current | None, window: int, used: int
    ) -> TrainingOutcome:
        s = self.settings
        comparable = current is not None and current.manifest.kind != "prior" and self._compatible(current)
        for c in candidates.values():
            if c.booster is None or c.metrics is None:
                continue
            if not comparable or c.current_metrics is None:
                c.accepted, c.reason = True, "replaces a prior or incompatible version"
                continue
            new_loss = c.metrics["overall"]["loss"]
            old_loss = c.current_metrics["overall"]["loss"]
            c.accepted = new_loss <= old_loss * (1.0 + s.publish_tolerance)
            c.reason = f"held-out loss {new_loss:.4g} vs current {old_loss:.4g}"
        summary = {name: _summary(c) for name, c in candidates.items()}
        if not any(c.booster is not None for c in candidates.values()):
            return TrainingOutcome("skipped", "not enough samples", window_samples=window, models=summary)
        if not any(c.accepted for c in candidates.values()):
            return TrainingOutcome(
                "rejected", "no candidate beat the current version", window_samples=window, models=summary
            )
        carry_from = current if current is not None and self._compatible(current) else None
        manifest = self._publish(candidates, carry_from, window, used)
        self._current = None  # reload (and verify) the new version on the next run
        return TrainingOutcome(
            "published", "new version", version=manifest.version, window_samples=window, models=summary
        )

    def _publish(
        self, candidates: dict[str, _Candidate], current: _Current | None, window: int, used: int
    ) -> Manifest:
        s = self.settings
        models: dict[str, bytes] = {}
        offsets: dict[str, float] = {}
        samples: dict[str, int] = {}
        metrics: dict[str, Any] = {"window_samples": window, "samples_used": used}
        prior: dict[str, bytes] | None = None
        for name, c in candidates.items():
            entry: dict[str, Any] = {"guard": c.reason, "samples": c.samples}
            if c.accepted and c.booster is not None and c.metrics is not None:
                models[name] = bytes(c.booster.save_raw("ubj"))
                offsets[name] = c.offset
                samples[name] = c.samples["train"]
                entry.update(source="trained", calibration_offset=c.offset, **c.metrics)
            elif current is not None:
                spec = current.manifest.models[name]
                models[name] = current.files[name]
                offsets[name] = spec.calibration_offset
                samples[name] = current.manifest.training_samples.get(name, 0)
                previous = dict(current.manifest.metrics.get(name, {}))
                previous.pop("current_on_same_holdout", None)
                entry = {
                    **previous,
                    **entry,
                    "source": "carried" if current.manifest.kind != "prior" else "prior",
                }
                entry["from_version"] = previous.get("from_version", current.manifest.version)
            else:
                if prior is None:
                    prior = build_prior_models(s.quantile)[0]
                models[name], offsets[name], samples[name] = prior[name], 0.0, 0
                entry["source"] = "prior"
            if c.current_metrics is not None:
                entry["current_on_same_holdout"] = c.current_metrics["overall"]
            metrics[name] = entry
        return self.store.publish(
            "trained",
            models,
            objective=s.objective,
            quantile=s.quantile,
            target_transforms={name: "log1p" for name in models},
            calibration_offsets=offsets,
            training_samples=samples,
            metrics=metrics,
            xgboost_version=xgb.__version__,
        )

    def _compatible(self, current: _Current) -> bool:
        m = current.manifest
        same_quantile = self.settings.objective == "mean" or abs(m.quantile - self.settings.quantile) < 1e-9
        return m.objective == self.settings.objective and same_quantile

    def _load_current(self) -> _Current | None:
        version = self.store.current_version()
        if version is None:
            return None
        if self._current is not None and self._current.manifest.version == version:
            return self._current
        try:
            model_set = self.store.load(version)
        except ArtifactError as exc:
            log_event(log, "current_version_unusable", logging.WARNING, version=version, error=str(exc))
            return None
        boosters = {}
        for name in MODEL_NAMES:
            booster = xgb.Booster(params={"nthread": self.settings.training_threads})
            booster.load_model(bytearray(model_set.files[name]))
            boosters[name] = booster
        self._current = _Current(model_set.manifest, model_set.files, boosters)
        return self._current


def min_leaf_samples(objective: str, quantile: float) -> int:
    """XGBoost's ``min_child_weight``: the fewest samples per leaf (the hessian is 1 per sample).

    A quantile leaf's value is the q-quantile of its samples' residuals, so it needs
    ``MIN_TAIL_SAMPLES`` samples beyond that quantile: 50 for p90 instead of a flat 5, which let
    p90 leaves follow single samples (docs/benchmarks-accuracy.md: lower pinball loss for both
    models on the simulator).
    """
    if objective != "quantile":
        return MIN_TAIL_SAMPLES
    return math.ceil(MIN_TAIL_SAMPLES / min(quantile, 1.0 - quantile) - 1e-9)


def thin(snapshot: WindowSnapshot, max_samples: int) -> WindowSnapshot:
    """At most ``max_samples`` rows: every stratum keeps its newest ``min(size, quota)`` rows,
    with one quota for all strata (water-filling), so small strata are kept whole."""
    if len(snapshot) <= max_samples:
        return snapshot
    _, starts, counts = np.unique(snapshot.strata, return_index=True, return_counts=True)
    quota = fair_quota(counts, max_samples)
    keep_from = np.repeat(starts + counts - np.minimum(counts, quota), counts)
    return snapshot.take(np.flatnonzero(np.arange(len(snapshot)) >= keep_from))


def _summary(c: _Candidate) -> dict[str, Any]:
    return {
        "accepted": c.accepted,
        "reason": c.reason,
        "samples": c.samples,
        "candidate": c.metrics["overall"] if c.metrics else None,
        "current": c.current_metrics["overall"] if c.current_metrics else None,
    }
