"""Online calibration per regime and drift detection, on a real trained model and a real store.

The live scorer is driven synchronously (``process`` + ``maybe_publish``, what its thread does)
with synthetic samples whose true quantile is known; then TTFT in one regime moves up by 80 %.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import xgboost as xgb
from prometheus_client import CollectorRegistry

from shared.artifacts import served_latency_ms
from shared.features import build_features
from shared.model_store import ModelStore
from shared.regimes import DEFAULT_SCHEME
from training_server import synthetic
from training_server.config import TrainingSettings
from training_server.drift import DriftEvent
from training_server.live_scoring import LiveScorer
from training_server.metrics import TrainingMetrics
from training_server.trainer import Trainer
from training_server.window import StratifiedWindow

SHIFTED = "waiting=4-7 kv=0-0.9"
FACTOR = 1.8


def _settings(tmp_path: Path, **overrides: Any) -> TrainingSettings:
    base: dict[str, Any] = {
        "data_dir": tmp_path,
        "n_estimators": 40,
        "min_train_samples": 200,
        "calibration_publish_interval_s": 0.0,
        "calibration_min_shift": 0.005,
    }
    return TrainingSettings(**{**base, **overrides})


def _batch(rng: np.random.Generator, n: int, shift: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    columns = synthetic.samples(n, rng)
    if shift:
        regime = DEFAULT_SCHEME.ids(build_features(columns))
        moved = np.array([DEFAULT_SCHEME.label(r) == SHIFTED for r in regime.tolist()])
        columns["actual_ttft_ms"] = np.where(
            moved, columns["actual_ttft_ms"] * FACTOR, columns["actual_ttft_ms"]
        )
    n = len(columns["actual_ttft_ms"])
    columns["predicted_ttft_ms"] = np.zeros(n)
    columns["predicted_tpot_ms"] = np.zeros(n)
    # Routed well after the newest calibration version went out, so each sample is scored against
    # it (in production requests in flight during a publication meet the previous offsets).
    return columns, np.full(n, time.time() + 60.0)


def _trained_scorer(
    tmp_path: Path, events: list[DriftEvent], **overrides: Any
) -> tuple[LiveScorer, ModelStore]:
    settings = _settings(tmp_path, **overrides)
    store = ModelStore(tmp_path / "models", keep_versions=3)
    window = StratifiedWindow(settings.stratum_cap, settings.max_age_s)
    columns = synthetic.samples(20_000, np.random.default_rng(1))
    window.insert(columns, np.full(20_000, time.time()))
    outcome = Trainer(store, settings).run(window.snapshot(), time.time())
    assert outcome.outcome == "published", outcome
    scorer = LiveScorer(store, settings, TrainingMetrics(CollectorRegistry()), events.append, lambda m: None)
    scorer.set_current(store.read_manifest(outcome.version or ""))
    return scorer, store


def _feed(scorer: LiveScorer, rng: np.random.Generator, batches: int, shift: bool) -> None:
    for _ in range(batches):
        scorer.process(*_batch(rng, 1000, shift))
        scorer.maybe_publish()


def _served_coverage(store: ModelStore, columns: dict[str, np.ndarray]) -> float:
    """Coverage of the shifted regime's TTFT by the version now current, as a replica serves it."""
    manifest = store.read_manifest(store.current_version() or "")
    spec = manifest.models["ttft"]
    booster = xgb.Booster()
    booster.load_model(bytearray(store.read_file(manifest.version, spec.file)))
    features = build_features(columns)
    rows = np.array([DEFAULT_SCHEME.label(r) == SHIFTED for r in DEFAULT_SCHEME.ids(features).tolist()])
    margin = booster.inplace_predict(features[rows], predict_type="margin")
    served = served_latency_ms(np.asarray(margin, dtype=np.float64), features[rows], spec)
    return float(np.mean(columns["actual_ttft_ms"][rows] <= served))


def _regimes(scorer: LiveScorer) -> dict[str, dict[str, dict[str, Any]]]:
    regimes: dict[str, dict[str, dict[str, Any]]] = scorer.status()["regimes"]
    return regimes


def _busy(scorer: LiveScorer, model: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in _regimes(scorer)[model].items() if v["recent_samples"] >= 500}


def test_live_coverage_of_a_shifted_regime_returns_to_target_while_others_stay_put(tmp_path: Path) -> None:
    events: list[DriftEvent] = []
    scorer, store = _trained_scorer(tmp_path, events)
    trained = store.read_manifest(store.current_version() or "")
    rng = np.random.default_rng(2)
    _feed(scorer, rng, 40, shift=False)
    before = _busy(scorer, "ttft")
    assert SHIFTED in before and len(before) >= 4, before
    # Regimes the trainer calibrated well keep its offset; the others were corrected.
    for label, entry in before.items():
        assert 0.87 <= entry["coverage"] <= 0.93, (label, entry)
    offsets_before = {label: entry["offset"] for label, entry in before.items()}

    # The calibration serving when the shift starts fails the shifted regime...
    assert _served_coverage(store, _batch(np.random.default_rng(3), 4000, True)[0]) < 0.6
    _feed(scorer, rng, 80, shift=True)
    # ...then online calibration restores it.
    after = _busy(scorer, "ttft")
    assert set(scorer.status()["calibration_trend"]) == {"ttft", "tpot"}
    assert 0.88 <= after[SHIFTED]["coverage"] <= 0.92, after[SHIFTED]
    # (less than log(1.8) in log1p units: short latencies move less)
    assert after[SHIFTED]["offset"] - offsets_before[SHIFTED] > 0.6 * np.log(FACTOR)
    for label, entry in after.items():
        if label != SHIFTED and label in before:
            # Sampling noise only (about 0.01 per horizon), not the collapse of the shifted regime.
            assert abs(entry["coverage"] - before[label]["coverage"]) <= 0.04, (label, entry, before[label])
            # Their offsets move only by sampling noise, nowhere near the shift's log(1.8) = 0.59.
            assert abs(entry["offset"] - offsets_before[label]) < 0.2, (label, entry, offsets_before[label])
    for label, entry in _busy(scorer, "tpot").items():  # TPOT was not shifted: its offsets stay near 0
        assert abs(entry["offset"]) < 0.2 and 0.85 <= entry["coverage"] <= 0.95, (label, entry)

    # The correction went out as calibration versions: the same model files, new offsets.
    current = store.read_manifest(store.current_version() or "")
    assert current.kind == "calibrated" and scorer.calibration_versions > 0
    for name, spec in current.models.items():
        assert spec.sha256 == trained.models[name].sha256
    assert current.models["ttft"].regime_offsets is not None
    # The shifted regime's sustained coverage drop was a drift event, of TTFT only.
    # (A rare regime the trainer left under-covered may raise one too; TPOT never moved.)
    drifted = [(e.model, DEFAULT_SCHEME.label(e.regime)) for e in events]
    assert ("ttft", SHIFTED) in drifted and all(model == "ttft" for model, _ in drifted), events
    assert scorer.status()["drift_events"] == len(events)


def test_submit_skips_batches_beyond_the_pending_bound_instead_of_queueing(tmp_path: Path) -> None:
    settings = _settings(tmp_path, live_max_pending_samples=2500)
    scorer = LiveScorer(
        ModelStore(tmp_path / "models"), settings, TrainingMetrics(CollectorRegistry()), print, print
    )  # not started: nothing drains the queue
    accepted = [scorer.submit(*_batch(np.random.default_rng(i), 1000, False)) for i in range(4)]
    assert accepted == [True, True, False, False]
    assert scorer.skipped == 2000 and scorer.status()["pending_samples"] == 2000


def test_status_says_when_moved_offsets_still_wait_for_the_publish_interval(tmp_path: Path) -> None:
    # (an interval far longer than scoring one batch takes, even on a busy machine)
    scorer, store = _trained_scorer(tmp_path, [], calibration_publish_interval_s=3.0)
    rng = np.random.default_rng(4)
    assert scorer.status()["calibration_settled"]
    _feed(scorer, rng, 1, shift=True)  # the first move goes out at once
    first = store.current_version()
    assert scorer.status()["calibration_settled"] and scorer.calibration_versions == 1
    _feed(scorer, rng, 1, shift=True)  # ...the next one waits for the interval
    assert not scorer.status()["calibration_settled"] and store.current_version() == first
    deadline = time.monotonic() + 15.0
    while not scorer.status()["calibration_settled"]:  # what the scoring thread does when idle
        assert time.monotonic() < deadline, "the held offsets never went out"
        scorer.maybe_publish()
        time.sleep(0.02)
    assert store.current_version() != first and scorer.calibration_versions == 2
    current = store.read_manifest(store.current_version() or "")
    _, moved = scorer.calibrator.proposal(current)
    assert moved < scorer.settings.calibration_min_shift
