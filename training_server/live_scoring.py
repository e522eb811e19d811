"""Live scoring: every arriving sample against the version that served it, off the event loop.

The event loop hands each validated batch to ``submit`` (a deque append). One thread, niced
like the trainer, then per batch:

1. builds the features (``shared.features``) and each row's regime (``shared.regimes``);
2. finds the *served* prediction: the scheduler's ``predicted_ttft_ms`` / ``predicted_tpot_ms``
   when it sent them (non-zero), else the prediction of the version that was current when the
   request was routed (its timestamp minus its TTFT), computed with XGBoost ``inplace_predict``
   on one thread and ``shared.artifacts.served_latency_ms`` (``training_server.served_versions``);
3. updates live coverage and pinball per model and regime and looks for drift
   (``training_server.drift``); a drift event is logged, counted and asks for a retrain now.
   Live figures describe the current trees: they restart when a retrain publishes new ones, and
   no drift is looked for while the prior serves;
4. feeds the residuals against the current trees to the per-regime quantile trackers
   (``training_server.online_calibration``) and, at most once per
   ``calibration_publish_interval_s`` and only when an offset moved by ``calibration_min_shift``,
   publishes a calibration version: the same model files with new ``regime_offsets``. The
   prior is calibrated too (it is a guess about the pods' speed, often off by a large factor,
   and serves until enough samples for a first retrain arrived); a calibrated prior stays of
   kind ``prior``.

Under overload it skips whole batches (counted) instead of queueing beyond
``live_max_pending_samples``, so ingestion never waits for scoring.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import xgboost as xgb

from shared.artifacts import MODEL_NAMES, Manifest, ModelSpec, served_latency_ms, to_margin_target
from shared.features import build_features
from shared.logging import log_event
from shared.model_store import ModelStore
from shared.regimes import DEFAULT_SCHEME, RegimeOffsets
from shared.wire_fields import Columns
from training_server.boosting import predict_margin
from training_server.config import TrainingSettings
from training_server.drift import DriftDetector, DriftEvent
from training_server.evaluation import pinball_loss
from training_server.metrics import TrainingMetrics
from training_server.online_calibration import RegimeCalibrator
from training_server.scheduler import lower_priority
from training_server.served_versions import Margins, ServedVersions

log = logging.getLogger(__name__)

TARGETS = {"ttft": "actual_ttft_ms", "tpot": "actual_tpot_ms"}
SENT = {"ttft": "predicted_ttft_ms", "tpot": "predicted_tpot_ms"}
# Scoring takes only idle CPU: under full ingestion load it yields the core and skips batches.
SCORING_NICE = 19
IDLE_PUBLISH_S = 0.25  # when no batch arrives, how often moved offsets are checked for publication


class LiveScorer:
    """Owns the scoring thread, live figures, online calibration and drift detection."""

    def __init__(
        self,
        store: ModelStore,
        settings: TrainingSettings,
        metrics: TrainingMetrics,
        on_drift: Callable[[DriftEvent], None],
        on_calibrated: Callable[[Manifest], None],
    ) -> None:
        s = settings
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.scheme = DEFAULT_SCHEME
        self._on_drift = on_drift
        self._on_calibrated = on_calibrated
        self.calibrator = RegimeCalibrator(
            MODEL_NAMES,
            self.scheme,
            s.quantile,
            s.calibration_window,
            s.calibration_min_samples,
            {"ttft": s.calibration_step_ttft, "tpot": s.calibration_step_tpot},
            () if s.calibration_per_regime == "off" else tuple(s.calibration_per_regime.split("+")),
        )
        self.drift = DriftDetector(
            MODEL_NAMES,
            self.scheme.size,
            s.quantile,
            s.live_half_life_samples,
            s.drift_coverage_drop,
            s.drift_loss_rise,
            s.drift_min_samples,
            s.drift_cooldown_s,
        )
        self._calibrating = threading.Lock()  # the calibrator: scoring thread vs the trainer's offsets_for
        self._queue: deque[tuple[Columns, np.ndarray]] = deque()
        self._cond = threading.Condition()
        self._pending = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self.versions = ServedVersions(store)
        self._calibrated_models = () if s.calibrate_online == "off" else tuple(s.calibrate_online.split("+"))
        self._scored_trees: dict[str, str] = {}  # model -> SHA-256 of the trees live figures describe
        self._last_publish_mono = -float("inf")
        # Whether every offset move the calibrator holds is in a published version (nothing waits
        # for the rate limit); false from each scored batch until ``maybe_publish`` finds so.
        self.calibration_settled = True
        self.scored = 0
        self.skipped = 0
        self.calibration_versions = 0

    # ---- event-loop side ---------------------------------------------------------------------
    def submit(self, columns: Columns, timestamps: np.ndarray) -> bool:
        """Queue a validated batch for scoring; ``False`` (skipped, counted) when behind."""
        n = len(timestamps)
        with self._cond:
            if self._closed or self._pending + n > self.settings.live_max_pending_samples:
                self.skipped += n
                self.metrics.live_skipped.inc(n)
                return False
            self._queue.append((columns, timestamps))
            self._pending += n
            self._cond.notify()
        return True

    def set_current(self, manifest: Manifest) -> None:
        """The version now current (any thread)."""
        self.versions.set_current(manifest, time.time())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="live-scoring", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._pending = 0
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued batch was scored (tests and shutdown); ``True`` if so."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending and time.monotonic() < deadline:
                self._cond.wait(0.01)
            return self._pending == 0

    # ---- scoring thread ----------------------------------------------------------------------
    def _run(self) -> None:
        lower_priority(SCORING_NICE)
        while True:
            with self._cond:
                if not self._queue and not self._closed:
                    self._cond.wait(IDLE_PUBLISH_S)
                if self._closed:
                    return
                batch = self._queue.popleft() if self._queue else None
            if batch is None:  # idle: offsets that moved since the last publication still go out
                try:
                    self.maybe_publish()
                except Exception as exc:
                    log_event(log, "live_scoring_failed", logging.ERROR, error=repr(exc), exc_info=True)
                continue
            columns, timestamps = batch
            try:
                self.process(columns, timestamps)
                self.maybe_publish()
            except Exception as exc:  # scoring must never take ingestion down; the next batch retries
                log_event(log, "live_scoring_failed", logging.ERROR, error=repr(exc), exc_info=True)
            finally:
                with self._cond:
                    self._pending -= len(timestamps)
                    self._cond.notify_all()

    def process(self, columns: Columns, timestamps: np.ndarray) -> None:
        """Score one batch, update live figures, drift state and the calibrator (blocking)."""
        history = self.versions.snapshot()
        if not history or len(timestamps) == 0:
            return
        features = build_features(columns)
        regimes = self.scheme.ids(features)
        current = history[-1].manifest
        now_s = time.time()
        for name in MODEL_NAMES:
            actual = np.asarray(columns[TARGETS[name]], dtype=np.float64)
            rows = np.flatnonzero(actual > 0)
            if len(rows) == 0:
                continue
            feats, act = features[rows], actual[rows]
            routed_s = timestamps[rows] - np.asarray(columns["actual_ttft_ms"])[rows] / 1000.0
            margins: Margins = {}
            served = self.versions.served(name, feats, routed_s, history, margins)
            sent = np.asarray(columns[SENT[name]], dtype=np.float64)[rows]
            served = np.where(sent > 0, sent, served)
            known = np.isfinite(served)
            covered = (act <= served).astype(np.float64)
            keep = np.flatnonzero(known)
            if self._scored_trees.get(name) != current.models[name].sha256:
                self._scored_trees[name] = current.models[name].sha256
                self.drift.reset(name)
            loss = np.zeros(len(act))
            loss[keep] = pinball_loss(act[keep], served[keep], self.settings.quantile)
            detect = current.kind != "prior"
            events = self.drift.observe(name, regimes[rows][keep], covered[keep], loss[keep], now_s, detect)
            self.scored += len(keep)
            self.metrics.live_scored.labels(name).inc(len(keep))
            for event in events:
                self._drifted(event)
            self._calibrate(name, current, feats, act, timestamps[rows], margins)
        self.calibration_settled = False
        self._export()

    def _calibrate(
        self,
        name: str,
        current: Manifest,
        feats: np.ndarray,
        act: np.ndarray,
        stamps: np.ndarray,
        margins: Margins,
    ) -> None:
        if name not in self._calibrated_models:
            return
        spec = current.models[name]
        booster = self.versions.booster(current, name)
        margin = self.versions.margin(current, name, feats, margins)
        if booster is None or margin is None:
            return
        base = replace(spec, regime_offsets=None)
        target = to_margin_target(act, spec.target_transform)
        with self._calibrating:
            self._track(name, booster, base, float("inf"), prior=current.kind == "prior")
            base_now = _base_margin(margin, feats, base)
            self.calibrator.observe(name, feats, target, base_now, stamps, time.monotonic())

    def _track(
        self,
        name: str,
        booster: xgb.Booster,
        base: ModelSpec,
        unseen_since_s: float,
        prior: bool = False,
        fitted: np.ndarray | None = None,
    ) -> None:
        """Under ``_calibrating``: make the calibrator track ``base``'s trees (rebase if new;
        ``prior``: they are the prior's; ``fitted``: the features they were fitted on, if known)."""
        if self.calibrator.trees.get(name) == base.sha256:
            return

        def margin_of(features: np.ndarray) -> np.ndarray:
            return _base_margin(predict_margin(booster, features), features, base)

        self.calibrator.rebase(name, base.sha256, margin_of, unseen_since_s, prior, fitted)

    def offsets_for(
        self, name: str, booster: xgb.Booster, spec: ModelSpec, unseen_since_s: float, fitted: np.ndarray
    ) -> RegimeOffsets | None:
        """The regime offsets new trees are published with (the trainer's thread): the online
        calibration carried over to them, so a retrain does not drop what it has followed.
        ``unseen_since_s``: the trees were trained on samples up to this timestamp; ``fitted``: the
        features of the samples they were fitted and calibrated on."""
        if name not in self._calibrated_models:
            return None
        with self._calibrating:
            self._track(name, booster, replace(spec, regime_offsets=None), unseen_since_s, fitted=fitted)
            return RegimeOffsets.of(self.scheme, np.round(self.calibrator.offsets(name), 6))

    def _drifted(self, event: DriftEvent) -> None:
        regime = self.scheme.label(event.regime)
        self.metrics.drift_events.labels(event.model, regime).inc()
        log_event(
            log,
            "drift_detected",
            logging.WARNING,
            model=event.model,
            regime=regime,
            reason=event.reason,
            coverage=round(event.coverage, 4),
            pinball_loss_ms=round(event.pinball_loss_ms, 3),
            long_pinball_loss_ms=round(event.long_pinball_loss_ms, 3),
            samples=event.samples,
        )
        self._on_drift(event)

    def maybe_publish(self) -> Manifest | None:
        """Publish a calibration version if the interval passed and an offset moved enough."""
        s = self.settings
        current = self.versions.current()
        if current is None:
            return None
        if time.monotonic() - self._last_publish_mono < s.calibration_publish_interval_s:
            return None
        with self._calibrating:
            new, moved = self.calibrator.proposal(current)
        if not new or moved < max(s.calibration_min_shift, 1e-9):
            self.calibration_settled = True
            return None
        self._last_publish_mono = time.monotonic()
        base_info = current.metrics.get("online_calibration", {})
        info = {
            "online_calibration": {
                "based_on": current.version,
                # When the trees were trained (model age), not when their offsets last moved.
                "trained_created_at": base_info.get("trained_created_at", current.created_at),
                "max_shift": round(moved, 6),
                "samples": {name: self.calibrator.samples(name).tolist() for name in new},
            }
        }
        manifest = self.store.publish_calibrated(current.version, new, info)
        if manifest is None:
            return None  # a retrain published meanwhile; the next batch calibrates against it
        self.calibration_versions += 1
        self.metrics.calibration_publishes.inc()
        self.set_current(manifest)
        self.calibration_settled = True
        log_event(
            log,
            "calibration_published",
            version=manifest.version,
            based_on=current.version,
            max_shift=round(moved, 4),
        )
        self._on_calibrated(manifest)
        return manifest

    def _export(self) -> None:
        current = self.versions.current()
        labels = self.scheme.labels()
        for name in MODEL_NAMES:
            coverage, pinball = self.drift.live[name].coverage(), self.drift.live[name].pinball()
            spec = current.models.get(name) if current is not None else None
            offsets = spec.regime_offsets.offsets if spec and spec.regime_offsets else (0.0,) * len(labels)
            self.metrics.set_live(name, labels, coverage, pinball, offsets)

    def status(self) -> dict[str, Any]:
        labels = self.scheme.labels()
        current = self.versions.current()
        models: dict[str, Any] = {}
        for name in MODEL_NAMES:
            live = self.drift.live[name]
            coverage, pinball = live.coverage(), live.pinball()
            spec = current.models.get(name) if current is not None else None
            offsets = spec.regime_offsets.offsets if spec and spec.regime_offsets else (0.0,) * len(labels)
            models[name] = {
                label: {
                    "coverage": _finite(coverage[r]),
                    "pinball_loss_ms": _finite(pinball[r]),
                    "recent_samples": round(float(live.weight[r]), 1),
                    "offset": offsets[r],
                }
                for r, label in enumerate(labels)
                if live.weight[r] > 0 or offsets[r] != 0.0
            }
        last = self.drift.last_event
        return {
            "scored_samples": self.scored,
            "skipped_samples": self.skipped,
            "pending_samples": self._pending,
            "calibration_versions": self.calibration_versions,
            # every offset move scored so far is in a published version (none waits for the interval)
            "calibration_settled": self.calibration_settled,
            "regime_scheme": {"waiting_edges": self.scheme.waiting_edges, "kv_edges": self.scheme.kv_edges},
            "regimes": models,
            # per model: the online calibration's trend term, log-latency units per posted batch
            # (> 0: latency has kept rising and the offsets follow it by themselves)
            "calibration_trend": {name: round(self.calibrator.trend(name), 6) for name in MODEL_NAMES},
            "drift_events": self.drift.events,
            "last_drift": None
            if last is None
            else {
                "model": last.model,
                "regime": self.scheme.label(last.regime),
                "reason": last.reason,
                "seconds_ago": round(time.time() - last.at_s, 3),
            },
        }

    def seconds_since_drift(self) -> float | None:
        last = self.drift.last_event
        return None if last is None else time.time() - last.at_s


def _base_margin(tree_margin: np.ndarray, feats: np.ndarray, base: ModelSpec) -> np.ndarray:
    """The served margin without regime offsets (trees, calibration offset and whatever else
    ``served_latency_ms`` adds), which the regime offsets correct."""
    return to_margin_target(served_latency_ms(tree_margin, feats, base), base.target_transform)


def _finite(value: float) -> float | None:
    return round(float(value), 6) if np.isfinite(value) else None
