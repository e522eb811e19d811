"""Retraining: fit, calibrate, evaluate, guard and publish the TTFT and TPOT models.

``Trainer.run`` is blocking and runs in the service's single trainer thread (never on the
event loop). For each model it keeps the samples whose target is non-zero (0 means the
sample carries no such latency), orders them by (timestamp, arrival) and holds out the
newest part, so evaluation predicts the future as production does. The rest is split into
*train* and *calibration* parts, the calibration part spread over the whole span in short
runs (``evaluation.calibration_mask``): under bursty traffic a contiguous stretch holds one
regime and would make the offset swing with it. First a linear work-ahead baseline is fitted
on the training part (``baseline_fit``: a quantile regression with non-negative slopes on the
queued and in-flight work), then a quantile (or mean) XGBoost model on log1p(latency) with the
baseline's log1p as ``base_margin``, so the trees learn the log-ratio around a latency that keeps
growing with the work beyond the trained range (monotone constraints where physics says so;
``training_server.boosting`` fits the trees).
TPOT's baseline may instead bend (concave, piecewise linear) where the newest held-out samples
show TPOT stopped growing (``baseline_fit``: the trees' constraints cannot bring down a line that
overshoots).
It is calibrated with a conformal offset on the calibration part, each sample weighted by its
recency (``calibration_half_life_s``: the spread-out runs sample every regime, the weights keep
the offset on the newest residuals after the pool changed). A small window's split would hold a
handful of samples, whose conformal offset is their largest residual; below
``cross_conformal_below`` calibration samples every fitted sample calibrates instead, scored by
trees fitted on the other folds, and the served trees are fitted on all of them
(``boosting.TreeFitter.cross_conformal_margin``). The candidate is scored on the held-out part,
always through ``shared.artifacts.served_latency_ms``, as serving computes it. The current
published version is scored on the same held-out samples, with its own training-time calibration
but not the online regime offsets published since (``live_scoring``): those were tracked on
these very samples, so they would score it in sample against a candidate scored out of sample
(in the simulator's slow-pool replay every retrain of the 90 s after the slowdown was refused:
the old trees' offsets had caught up with the held-out samples, the candidate's conformal offset
only partly). Each side is scored with its own training-time calibration; the candidate, once
published, gets its regime offsets from the same newest samples (``offsets_for``). The guard
(``evaluation.compare_paired``) refuses the candidate only when it is worse with confidence. A
model that cannot be trained or is refused keeps the current one, so a version may update just
one of the two models.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import xgboost as xgb

from shared.artifacts import (
    MODEL_NAMES,
    Manifest,
    ModelSpec,
    base_margin,
    served_latency_ms,
    sha256_hex,
    to_margin_target,
)
from shared.errors import ArtifactError
from shared.features import NUM_FEATURES, build_features
from shared.logging import log_event
from shared.model_store import ModelStore
from shared.prior import build_prior_models
from shared.regimes import RegimeOffsets
from training_server import boosting, evaluation
from training_server.baseline_fit import baseline_form, fit_baseline
from training_server.config import TrainingSettings
from training_server.window import StratifiedWindow, WindowSnapshot

log = logging.getLogger(__name__)

TARGETS = {"ttft": "actual_ttft_ms", "tpot": "actual_tpot_ms"}
Outcome = Literal["published", "rejected", "skipped", "failed", "cancelled"]


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
    baseline: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    current_metrics: dict[str, Any] | None = None
    holdout_losses: np.ndarray = field(default_factory=lambda: np.empty(0))
    current_losses: np.ndarray = field(default_factory=lambda: np.empty(0))
    accepted: bool = False
    reason: str = ""
    unseen_since_s: float = float("inf")  # samples newer than this timestamp were not trained on
    fitted: np.ndarray = field(default_factory=lambda: np.empty((0, NUM_FEATURES), dtype=np.float32))


@dataclass
class _Current:
    manifest: Manifest
    files: dict[str, bytes]
    boosters: dict[str, xgb.Booster]


# (model, its trees, their spec without regime offsets, the timestamp from which on no sample was
# trained on, the features of the samples they were fitted and calibrated on) -> the regime offsets
# to publish them with
OffsetsFor = Callable[[str, xgb.Booster, ModelSpec, float, np.ndarray], RegimeOffsets | None]


class Trainer:
    """Fits and publishes model versions into ``store`` (see the module docstring).

    ``offsets_for`` (the live scorer's online calibration) gives each published model its regime
    offsets, carried over to the new trees, so a retrain never serves without them.
    """

    def __init__(
        self, store: ModelStore, settings: TrainingSettings, offsets_for: OffsetsFor | None = None
    ) -> None:
        self.store = store
        self.settings = settings
        self.offsets_for = offsets_for
        self._current: _Current | None = None
        self.stop = threading.Event()
        self.fitter = boosting.TreeFitter(settings, self.stop)

    def run(
        self, snapshot: WindowSnapshot, now_s: float, window_samples: int | None = None
    ) -> TrainingOutcome:
        """Train on ``snapshot`` and publish if the guard allows; blocking.

        ``window_samples`` is the window's size when ``snapshot`` is already a thinned copy.
        """
        started = time.perf_counter()
        snap = snapshot.thinned(self.settings.max_train_samples)
        features = build_features(snap.columns()) if len(snap) else np.empty((0, 0), np.float32)
        current = self._load_current()
        candidates = {name: self._fit(name, snap, features, current, now_s) for name in MODEL_NAMES}
        window = len(snapshot) if window_samples is None else window_samples
        outcome = self._decide_and_publish(candidates, current, window, len(snap))
        outcome.duration_s = time.perf_counter() - started
        return outcome

    def run_window(self, window: StratifiedWindow, now_s: float) -> tuple[TrainingOutcome, int]:
        """One retrain on ``window`` as it stands at ``now_s``: samples older than ``max_age_s`` leave it
        first, then ``run`` on its snapshot. Returns the outcome and how many samples aged out."""
        aged = window.age_out(now_s)
        size = window.size
        return self.run(window.snapshot(self.settings.max_train_samples), now_s, size), aged

    def _fit(
        self, name: str, snap: WindowSnapshot, features: np.ndarray, current: _Current | None, now_s: float
    ) -> _Candidate:
        s = self.settings
        actual = snap.column(TARGETS[name]) if len(snap) else np.empty(0)
        rows = np.flatnonzero(actual > 0)
        if len(rows) < s.min_train_samples_of(name):
            return _Candidate(name, {"usable": len(rows)}, reason=f"only {len(rows)} samples")
        rows = rows[np.lexsort((snap.column("seq")[rows], snap.column("timestamp")[rows]))]
        n_hold = max(1, round(len(rows) * s.holdout_fraction))
        n_cal = max(1, round(len(rows) * s.calibration_fraction))
        fit_rows, hold = rows[: len(rows) - n_hold], rows[len(rows) - n_hold :]
        # Too few samples for a calibration split: every fitted sample calibrates, each predicted by
        # trees that did not see it (``TreeFitter.cross_conformal_margin``); the served trees fit all.
        cross = s.objective == "quantile" and n_cal < s.cross_conformal_below
        if cross:
            train = cal = fit_rows
        else:
            is_cal = evaluation.calibration_mask(len(fit_rows), n_cal)
            train, cal = fit_rows[~is_cal], fit_rows[is_cal]
        target = to_margin_target(actual, "log1p")
        train_x, hold_x = features[train], features[hold]
        weight = _recency_weights(snap, train, now_s, s.recency_half_life_s)
        baseline = None
        if s.work_baseline:
            level = s.quantile if s.objective == "quantile" else 0.5
            baseline = fit_baseline(
                name,
                train_x,
                actual[train],
                level,
                (hold_x, actual[hold]),
                s.publish_confidence,
                bend=s.baseline_bend,
                kv_scaled=s.baseline_kv_scale,
            )
        spec = ModelSpec(file="", sha256="", size_bytes=0, baseline=baseline)
        train_base = base_margin(train_x, spec)
        booster = self.fitter.boost(name, train_x, target[train], weight, train_base)
        if cross:
            margin_cal = self.fitter.cross_conformal_margin(name, train_x, target[train], weight, train_base)
            cal_base = train_base
        else:
            margin_cal = boosting.predict_margin(booster, features[cal])
            cal_base = base_margin(features[cal], spec)
        if s.objective == "quantile":
            cal_weight = _recency_weights(snap, cal, now_s, s.calibration_half_life_s)
            offset = evaluation.conformal_offset(target[cal] - cal_base - margin_cal, s.quantile, cal_weight)
        else:
            offset = evaluation.mean_offset(target[cal], cal_base + margin_cal)
        spec = ModelSpec(file="", sha256="", size_bytes=0, calibration_offset=offset, baseline=baseline)
        hold_margin = boosting.predict_margin(booster, hold_x)
        predicted = served_latency_ms(hold_margin, hold_x, spec)
        metrics = evaluation.evaluate(actual[hold], predicted, snap.strata[hold], s.objective, s.quantile)
        cal_predicted = served_latency_ms(margin_cal, features[cal], spec)
        metrics["calibration_coverage"] = float(np.mean(actual[cal] <= cal_predicted))
        candidate = _Candidate(
            name,
            {"train": len(train), "calibration": len(cal), "holdout": len(hold)}
            | ({"folds": boosting.CROSS_FOLDS} if cross else {}),
            booster=booster,
            offset=offset,
            baseline=baseline,
            metrics=metrics,
            holdout_losses=evaluation.sample_losses(actual[hold], predicted, s.objective, s.quantile),
            unseen_since_s=float(snap.column("timestamp")[hold[0]]),
            fitted=features[fit_rows],
        )
        if current is not None and name in current.boosters:
            # Without its online offsets, tracked on these very samples (see the module docstring).
            cur_spec = replace(current.manifest.models[name], regime_offsets=None)
            cur_margin = boosting.predict_margin(current.boosters[name], hold_x)
            cur_pred = served_latency_ms(cur_margin, hold_x, cur_spec)
            candidate.current_metrics = evaluation.evaluate(
                actual[hold], cur_pred, snap.strata[hold], s.objective, s.quantile
            )
            candidate.current_losses = evaluation.sample_losses(
                actual[hold], cur_pred, s.objective, s.quantile
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
            decision = evaluation.compare_paired(
                c.holdout_losses, c.current_losses, s.publish_confidence, s.publish_tolerance
            )
            c.accepted, c.reason = decision.accepted, decision.reason
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
        baselines: dict[str, dict[str, Any] | None] = {}
        samples: dict[str, int] = {}
        metrics: dict[str, Any] = {"window_samples": window, "samples_used": used}
        regime_offsets: dict[str, RegimeOffsets | None] = {}
        prior: dict[str, bytes] | None = None
        for name, c in candidates.items():
            entry: dict[str, Any] = {"guard": c.reason, "samples": c.samples}
            if c.accepted and c.booster is not None and c.metrics is not None:
                models[name] = bytes(c.booster.save_raw("ubj"))
                offsets[name] = c.offset
                baselines[name] = c.baseline
                if self.offsets_for is not None:
                    spec = ModelSpec(
                        f"{name}.ubj",
                        sha256_hex(models[name]),
                        len(models[name]),
                        calibration_offset=c.offset,
                        baseline=c.baseline,
                    )
                    regime_offsets[name] = self.offsets_for(name, c.booster, spec, c.unseen_since_s, c.fitted)
                samples[name] = c.samples["train"]
                entry.update(source="trained", calibration_offset=c.offset, **c.metrics)
            elif current is not None:
                spec = current.manifest.models[name]
                models[name] = current.files[name]
                offsets[name] = spec.calibration_offset
                baselines[name] = spec.baseline
                regime_offsets[name] = spec.regime_offsets
                samples[name] = current.manifest.training_samples.get(name, 0)
                previous = dict(current.manifest.metrics.get(name, {}))
                previous.pop("current_on_same_holdout", None)
                entry = {
                    **previous,
                    **entry,
                    "source": "prior" if current.manifest.model_kind(name) == "prior" else "carried",
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
            baselines=baselines,
            training_samples=samples,
            metrics=metrics,
            xgboost_version=xgb.__version__,
            regime_offsets=regime_offsets,
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


def _recency_weights(
    snap: WindowSnapshot, rows: np.ndarray, now_s: float, half_life_s: float
) -> np.ndarray | None:
    """0.5 ** (age / half-life) of each row's sample, or ``None`` (equal weights) without a half-life."""
    if half_life_s <= 0:
        return None
    age_s = np.maximum(now_s - snap.column("timestamp")[rows], 0.0)
    return np.asarray(0.5 ** (age_s / half_life_s))


def _summary(c: _Candidate) -> dict[str, Any]:
    return {
        "accepted": c.accepted,
        "reason": c.reason,
        "samples": c.samples,
        "candidate": c.metrics["overall"] if c.metrics else None,
        "current": c.current_metrics["overall"] if c.current_metrics else None,
        "baseline": baseline_form(c.baseline),
    }
