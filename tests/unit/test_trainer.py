"""The trainer: calibration, the publish guard, zero targets, thinning, and the mean objective."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xgboost as xgb

from shared.artifacts import ModelSet, served_latency_ms
from shared.features import build_features
from shared.model_store import ModelStore
from shared.prior import publish_prior
from training_server import synthetic
from training_server.boosting import TrainingCancelled, min_leaf_samples, params
from training_server.config import TrainingSettings
from training_server.evaluation import calibration_mask, conformal_offset, evaluate, fold_ids, pinball_loss
from training_server.trainer import Trainer
from training_server.window import StratifiedWindow, WindowSnapshot

QUANTILE = 0.9


def _settings(tmp_path: Path, **overrides: Any) -> TrainingSettings:
    base: dict[str, Any] = {
        "data_dir": tmp_path,
        "n_estimators": 80,
        "max_depth": 6,
        "learning_rate": 0.15,
        "stratum_cap": 1_000_000,
        "min_train_samples": 200,
    }
    return TrainingSettings(**{**base, **overrides})


def _window(n: int, seed: int, **kw: int) -> StratifiedWindow:
    window = StratifiedWindow(stratum_cap=1_000_000, max_age_s=3600)
    columns = synthetic.samples(n, np.random.default_rng(seed), **kw)
    window.insert(columns, time.time() - 100 + np.linspace(0, 99, n))
    return window


def _predict(model_set: ModelSet, name: str, columns: dict[str, np.ndarray]) -> np.ndarray:
    booster = xgb.Booster(params={"nthread": 1})
    booster.load_model(bytearray(model_set.files[name]))
    features = build_features(columns)
    margin = booster.inplace_predict(features, predict_type="margin")
    return served_latency_ms(margin, features, model_set.manifest.models[name])


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelStore, Any]:
    """One published model trained on 30k synthetic samples (shared by several tests)."""
    tmp = tmp_path_factory.mktemp("calibrated")
    settings = _settings(tmp)
    store = ModelStore(settings.store_dir)
    publish_prior(store, QUANTILE)
    outcome = Trainer(store, settings).run(_window(30_000, seed=1).snapshot(), time.time())
    return store, outcome


def test_retrain_publishes_a_version_whose_files_verify(calibrated: tuple[ModelStore, Any]) -> None:
    store, outcome = calibrated
    assert outcome.outcome == "published"
    assert store.current_version() == outcome.version and "trained" in outcome.version
    model_set = store.load()  # verifies sizes, SHA-256 and the feature schema
    manifest = model_set.manifest
    assert manifest.kind == "trained" and manifest.quantile == QUANTILE
    for name in ("ttft", "tpot"):
        entry = manifest.metrics[name]
        assert entry["source"] == "trained"
        assert set(entry["overall"]) >= {"coverage", "pinball_loss_ms", "mape", "samples"}
        assert entry["per_stratum"], "per-stratum metrics are reported"
        assert manifest.training_samples[name] == entry["samples"]["train"] > 20_000
        # The candidate beat the prior on the same held-out samples.
        assert entry["overall"]["loss"] < entry["current_on_same_holdout"]["loss"]


def test_calibrated_coverage_holds_on_fresh_data(calibrated: tuple[ModelStore, Any]) -> None:
    store, _ = calibrated
    model_set = store.load()
    fresh = synthetic.samples(40_000, np.random.default_rng(99))
    ttft_q, tpot_q = synthetic.true_quantiles(fresh, QUANTILE)
    for name, actual, truth in (
        ("ttft", fresh["actual_ttft_ms"], ttft_q),
        ("tpot", fresh["actual_tpot_ms"], tpot_q),
    ):
        predicted = _predict(model_set, name, fresh)
        coverage = float(np.mean(actual <= predicted))
        assert abs(coverage - QUANTILE) <= 0.02, (name, coverage)
        # ... and the predictions track the true per-sample quantile, not just the marginal.
        assert float(np.median(np.abs(predicted / truth - 1))) < 0.12, name


def test_publish_guard_refuses_a_worse_candidate(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    publish_prior(store, QUANTILE)
    snapshot = _window(8000, seed=2).snapshot()
    crippled = Trainer(store, _settings(tmp_path, n_estimators=2, max_depth=1))
    good = Trainer(store, _settings(tmp_path))

    first = crippled.run(snapshot, time.time())
    assert first.outcome == "published", "a trained model always replaces the prior"
    second = good.run(snapshot, time.time())
    assert second.outcome == "published", "a better candidate replaces a worse model"
    assert all(m["accepted"] for m in second.models.values())

    third = crippled.run(snapshot, time.time())
    assert third.outcome == "rejected"
    assert not any(m["accepted"] for m in third.models.values())
    for summary in third.models.values():
        assert summary["candidate"]["loss"] > summary["current"]["loss"]
    assert store.current_version() == second.version
    assert store.versions()[-1] == second.version, "nothing new was written"


def test_zero_targets_are_skipped_and_the_other_model_is_kept(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    prior_version = publish_prior(store, QUANTILE)
    window = StratifiedWindow(stratum_cap=100_000, max_age_s=3600)
    columns = synthetic.samples(3000, np.random.default_rng(3))
    columns["actual_tpot_ms"] = np.zeros(3000)  # samples carrying no TPOT
    window.insert(columns, np.full(3000, time.time()))
    outcome = Trainer(store, _settings(tmp_path)).run(window.snapshot(), time.time())
    assert outcome.outcome == "published"
    manifest = store.load().manifest
    assert manifest.metrics["ttft"]["source"] == "trained"
    assert manifest.metrics["tpot"]["source"] == "prior"
    assert manifest.metrics["tpot"]["from_version"] == prior_version
    assert manifest.training_samples["tpot"] == 0
    assert store.load().files["tpot"] == store.load(prior_version).files["tpot"]
    assert manifest.kind == "trained"
    assert (manifest.model_kind("ttft"), manifest.model_kind("tpot")) == ("trained", "prior")
    # A second retrain still without TPOT samples carries the prior's TPOT from a trained
    # version: it stays the prior's (a client must not read it as trained trees).
    more = synthetic.samples(3000, np.random.default_rng(4))
    more["actual_tpot_ms"] = np.zeros(3000)
    window.insert(more, np.full(3000, time.time()))
    again = Trainer(store, _settings(tmp_path)).run(window.snapshot(), time.time())
    assert again.outcome == "published" and again.models["ttft"]["accepted"]
    latest = store.load().manifest
    assert latest.version != manifest.version and latest.metrics["tpot"]["source"] == "prior"
    assert latest.model_kind("tpot") == "prior" and latest.model_kind("ttft") == "trained"


def test_too_few_samples_is_a_skip_not_a_publish(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    prior_version = publish_prior(store, QUANTILE)
    outcome = Trainer(store, _settings(tmp_path)).run(_window(100, seed=4).snapshot(), time.time())
    assert outcome.outcome == "skipped"
    assert store.current_version() == prior_version


def test_tpot_trains_from_its_own_threshold_before_ttft_does(tmp_path: Path) -> None:
    """TPOT's p90 is pinned down by fewer samples than TTFT's heavy tail: 300 samples train TPOT
    (threshold 200 by default) while TTFT (500) keeps the prior's answers."""
    store = ModelStore(tmp_path / "models")
    publish_prior(store, QUANTILE)
    settings = _settings(tmp_path, min_train_samples=500)
    assert settings.min_train_samples_tpot == 200
    outcome = Trainer(store, settings).run(_window(300, seed=4).snapshot(), time.time())
    assert outcome.outcome == "published", outcome
    manifest = store.load().manifest
    assert manifest.model_kind("tpot") == "trained" and manifest.model_kind("ttft") == "prior"
    assert outcome.models["ttft"]["reason"].startswith("only")


def test_a_stop_request_cancels_training(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    trainer = Trainer(store, _settings(tmp_path))
    trainer.stop.set()
    with pytest.raises(TrainingCancelled):
        trainer.run(_window(2000, seed=5).snapshot(), time.time())
    assert store.current_version() is None


def test_mean_objective_matches_the_mean(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    outcome = Trainer(store, _settings(tmp_path, objective="mean")).run(
        _window(20_000, seed=6).snapshot(), time.time()
    )
    assert outcome.outcome == "published"
    model_set = store.load()
    assert model_set.manifest.objective == "mean"
    fresh = synthetic.samples(20_000, np.random.default_rng(7))
    for name in ("ttft", "tpot"):
        predicted = _predict(model_set, name, fresh)
        actual = fresh[f"actual_{name}_ms"]
        assert abs(predicted.mean() / actual.mean() - 1) < 0.05, name


def test_thinning_keeps_small_strata_whole_and_the_newest_of_big_ones() -> None:
    strata = np.repeat(np.array([3, 7, 11]), [1000, 10, 500])
    data = np.zeros((1510, 15))
    data[:, 0] = np.arange(1510)  # row identity, oldest first within each stratum
    thinned = WindowSnapshot(data, strata).thinned(600)
    counts = dict(zip(*np.unique(thinned.strata, return_counts=True), strict=True))
    assert counts == {3: 295, 7: 10, 11: 295}
    assert thinned.data[thinned.strata == 3, 0].tolist() == list(range(705, 1000))
    assert len(WindowSnapshot(data, strata).thinned(5000)) == 1510


def test_conformal_offset_and_metrics() -> None:
    rng = np.random.default_rng(8)
    residuals = rng.normal(size=2000)
    offset = conformal_offset(residuals, 0.9)
    assert 0.9 <= np.mean(residuals <= offset) <= 0.9 + 2 / 2000
    actual = np.array([10.0, 20.0, 30.0, 40.0])
    predicted = np.array([20.0, 20.0, 20.0, 20.0])
    assert pinball_loss(actual, predicted, 0.9).tolist() == pytest.approx([1.0, 0.0, 9.0, 18.0])
    metrics = evaluate(actual, predicted, np.zeros(4, dtype=np.int64), "quantile", 0.9)
    assert metrics["overall"]["coverage"] == 0.5
    assert metrics["overall"]["mape"] == pytest.approx((1 + 0 + 1 / 3 + 0.5) / 4)
    assert metrics["per_stratum"] == {}  # 4 samples: too few to report per stratum


def test_a_small_window_calibrates_on_every_sample_not_on_a_split_of_a_few(tmp_path: Path) -> None:
    """400 samples, 8 of them 50x slower (stalls no feature shows), all in the rows a split would
    calibrate on: 60 of 340. The split's conformal offset is then one of those outliers' residuals;
    cross-conformal calibration scores all 340 rows out of fold, where 8 outliers are 2 %."""
    n, n_hold, n_cal = 400, 60, 60
    columns = synthetic.samples(n, np.random.default_rng(21))
    slow = np.flatnonzero(calibration_mask(n - n_hold, n_cal))[::7][:8]
    columns["actual_ttft_ms"][slow] *= 50.0
    stamps = time.time() - 100 + np.linspace(0, 99, n)
    fresh = synthetic.samples(20_000, np.random.default_rng(22))
    offsets, coverage = {}, {}
    for below in (0, 100):
        window = StratifiedWindow(stratum_cap=1_000_000, max_age_s=3600)
        window.insert(columns, stamps)
        settings = _settings(tmp_path / str(below), cross_conformal_below=below)
        store = ModelStore(settings.store_dir)
        outcome = Trainer(store, settings).run(window.snapshot(), time.time())
        assert outcome.outcome == "published"
        samples = outcome.models["ttft"]["samples"]
        assert samples["calibration"] == (n_cal if below == 0 else n - n_hold)
        assert samples.get("folds") == (None if below == 0 else 5)
        model_set = store.load()
        offsets[below] = model_set.manifest.models["ttft"].calibration_offset
        coverage[below] = float(np.mean(fresh["actual_ttft_ms"] <= _predict(model_set, "ttft", fresh)))
    assert offsets[0] > 2.5 and coverage[0] > 0.99, (offsets, coverage)  # a split: 10x too wide
    assert offsets[100] < 1.0 and 0.8 <= coverage[100] <= 0.97, (offsets, coverage)


def _bursty_window(n: int, seed: int, burst_blocks: set[int], block: int = 1000) -> StratifiedWindow:
    """Samples in time order whose latency is doubled during bursts (blocks of ``block`` samples).

    A burst is invisible in the routing-time features, like traffic that arrives after routing.
    """
    window = StratifiedWindow(stratum_cap=1_000_000, max_age_s=3600)
    columns = synthetic.samples(n, np.random.default_rng(seed))
    burst = np.isin(np.arange(n) // block, sorted(burst_blocks))
    for name in ("actual_ttft_ms", "actual_tpot_ms"):
        columns[name] = np.where(burst, 2.0, 1.0) * columns[name]
    window.insert(columns, time.time() - 100 + np.linspace(0, 99, n))
    return window


def test_calibration_reflects_the_whole_window_not_its_newest_stretch(tmp_path: Path) -> None:
    """Bursts in 6 of 20 stretches, none among the newest 6 (a lull, as after any burst).

    Calibrating on the newest stretch alone learned "latency is low" and under-covered the bursts
    that came back (TTFT coverage 0.71 on fresh traffic); spread over the window, the offset
    matches the traffic mix the version will serve.
    """
    bursts = {1, 4, 5, 8, 10, 13}
    store = ModelStore(tmp_path / "models")
    snapshot = _bursty_window(20_000, seed=11, burst_blocks=bursts).snapshot()
    outcome = Trainer(store, _settings(tmp_path)).run(snapshot, time.time())
    assert outcome.outcome == "published"
    fresh = synthetic.samples(40_000, np.random.default_rng(12))
    burst = np.random.default_rng(13).uniform(size=40_000) < len(bursts) / 20  # the long-run mix
    model_set = store.load()
    for name in ("ttft", "tpot"):
        actual = np.where(burst, 2.0, 1.0) * fresh[f"actual_{name}_ms"]
        coverage = float(np.mean(actual <= _predict(model_set, name, fresh)))
        assert abs(coverage - QUANTILE) <= 0.03, (name, coverage)


def test_calibration_mask_spreads_the_split_over_the_span() -> None:
    mask = calibration_mask(1000, 150)
    assert mask.sum() == 150
    rows = np.flatnonzero(mask)
    assert rows.min() < 50 and rows.max() == 999  # from the oldest stretch to the newest row
    runs = np.flatnonzero(np.diff(rows) > 1) + 1
    assert len(runs) + 1 == 40  # forty separate runs ...
    assert max(len(r) for r in np.split(rows, runs)) <= 4  # ... each a few rows long
    assert calibration_mask(10, 0).sum() == 0 and calibration_mask(7, 7).all()


def test_cross_conformal_folds_each_span_the_window_in_short_runs() -> None:
    fold = fold_ids(1000, 5)
    assert np.bincount(fold).tolist() == [200] * 5
    for k in range(5):
        rows = np.flatnonzero(fold == k)
        assert rows.min() < 200 and rows.max() > 800  # every fold samples old and new rows ...
        assert len(np.flatnonzero(np.diff(rows) > 1)) + 1 == 8  # ... in eight runs of 25
    assert sorted(set(fold_ids(12, 5).tolist())) == [0, 1, 2, 3, 4]


def test_quantile_leaves_hold_enough_samples_beyond_their_quantile(tmp_path: Path) -> None:
    assert params(_settings(tmp_path))["min_child_weight"] == 50  # p90
    assert min_leaf_samples("quantile", 0.5) == 10 and min_leaf_samples("quantile", 0.99) == 500
    assert min_leaf_samples("mean", 0.9) == 5


def test_weighted_conformal_offset_is_the_plain_one_with_equal_weights_and_follows_heavy_ones() -> None:
    rng = np.random.default_rng(11)
    residuals = rng.normal(size=999)
    assert conformal_offset(residuals, 0.9, np.ones(999)) == conformal_offset(residuals, 0.9)
    # old residuals around 0, the newest 200 around 1: recency weights take the newest's quantile
    shifted = np.concatenate([rng.normal(0.0, 0.1, 950), rng.normal(1.0, 0.1, 50)])
    weights = np.concatenate([np.full(950, 1e-3), np.ones(50)])
    assert conformal_offset(shifted, 0.9) < 0.5 < 1.0 < conformal_offset(shifted, 0.9, weights) < 1.3


def test_the_calibration_half_life_covers_a_pool_that_just_slowed_down(tmp_path: Path) -> None:
    """The window holds 20 minutes of a fast pool and then 10 minutes of a 1.6x slower one; the
    trees learn the mixture (no feature tells the two apart). Weighted by recency, the conformal
    offset covers the slow pool's requests; weighed equally, most of the window says "fast"."""
    now = time.time()
    window = StratifiedWindow(stratum_cap=1_000_000, max_age_s=7200)
    old = synthetic.samples(8000, np.random.default_rng(21))
    window.insert(old, now - 1800 + np.linspace(0, 1200, 8000))
    new = synthetic.samples(4000, np.random.default_rng(22))
    for target in ("actual_ttft_ms", "actual_tpot_ms"):
        new[target] = new[target] * 1.6
    window.insert(new, now - 600 + np.linspace(0, 590, 4000))
    fresh = synthetic.samples(5000, np.random.default_rng(23))
    coverage = {}
    for half_life in (0.0, 120.0):
        settings = _settings(tmp_path / str(half_life), calibration_half_life_s=half_life)
        store = ModelStore(settings.store_dir)
        assert Trainer(store, settings).run(window.snapshot(), now).outcome == "published"
        predicted = _predict(store.load(), "ttft", fresh)
        coverage[half_life] = float(np.mean(fresh["actual_ttft_ms"] * 1.6 <= predicted))
    assert coverage[0.0] < 0.8 and coverage[120.0] >= 0.85, coverage


def _tpot_world(world: str) -> Callable[[np.ndarray], np.ndarray]:
    """TPOT (ms) by running requests: "saturating" is flat beyond 30 running requests (a memory-bound
    decode step, as on the H200 traces), "linear" keeps growing (the simulator's compute-bound step)."""

    def tpot(running: np.ndarray) -> np.ndarray:
        if world == "saturating":
            return 20.0 + 0.6 * np.minimum(running, 30.0)
        return 20.0 + 0.1 * running

    return tpot


def _load_window(
    tpot_ms: Callable[[np.ndarray], np.ndarray],
    running: Callable[[np.random.Generator, int], np.ndarray],
    n: int,
    seed: int,
    now: float,
) -> StratifiedWindow:
    """20 minutes of ``n`` samples whose running requests are ``running(rng, n)`` in time order;
    TPOT is ``tpot_ms(running)`` with 3 % noise."""
    rng = np.random.default_rng(seed)
    columns = synthetic.samples(n, rng)
    load = running(rng, n)
    columns["num_request_running"] = load
    columns["decode_tokens_in_flight"] = load * 600.0
    columns["actual_tpot_ms"] = tpot_ms(load) * rng.lognormal(0.0, 0.03, n)
    window = StratifiedWindow(stratum_cap=1_000_000, max_age_s=7200)
    window.insert(columns, now - 1200 + np.linspace(0, 1190, n))
    return window


def _median_over_p90(
    store: ModelStore, tpot_ms: Callable[[np.ndarray], np.ndarray], running: float, seed: int
) -> float:
    """Median predicted TPOT of fresh requests at ``running`` running requests over the true p90."""
    fresh = synthetic.samples(2000, np.random.default_rng(seed))
    fresh["num_request_running"] = np.full(2000, running)
    fresh["decode_tokens_in_flight"] = np.full(2000, running * 600.0)
    predicted = _predict(store.load(), "tpot", fresh)
    truth_p90 = float(tpot_ms(np.array([running]))[0]) * float(np.exp(0.03 * 1.2816))
    return float(np.median(predicted)) / truth_p90


@pytest.mark.parametrize(("world", "expected"), [("saturating", "bent"), ("linear", "linear")])
def test_tpots_baseline_bends_where_the_newest_samples_inside_the_trained_range_show_a_plateau(
    tmp_path: Path, world: str, expected: str
) -> None:
    """The load rose from 1 to 300 running requests and then stayed between 100 and 300 (the
    chatbot H200 trace at 8 QPS): the newest held-out samples lie *inside* the trained range, none
    beyond it. Where TPOT saturates, a line fitted through the rise and the plateau is too high on
    the plateau's top; the newest samples show that the bent baseline predicts them better, so it
    is taken, and requests at 280 running are predicted near their p90. Where TPOT keeps growing,
    the line is kept."""

    def plateau(rng: np.random.Generator, n: int) -> np.ndarray:
        rise = n // 3
        return np.concatenate([np.geomspace(1, 300, rise), rng.uniform(100, 300, n - rise)]).round()

    tpot = _tpot_world(world)
    now = time.time()
    window = _load_window(tpot, plateau, 12_000, seed=8, now=now)
    settings = _settings(tmp_path)
    store = ModelStore(settings.store_dir)
    outcome = Trainer(store, settings).run(window.snapshot(), now)
    assert outcome.outcome == "published"
    assert outcome.models["tpot"]["baseline"] == expected
    ratio = _median_over_p90(store, tpot, 280.0, seed=9)
    assert 0.9 < ratio < 1.12, ratio


@pytest.mark.parametrize(
    ("world", "expected"),
    [("saturating", "bent"), ("linear", "linear")],
)
def test_tpots_baseline_bends_only_where_the_newest_samples_show_it_stopped_growing(
    tmp_path: Path, world: str, expected: str
) -> None:
    """The load keeps rising, so the newest held-out samples lie beyond the trained range. Where
    TPOT saturates (a memory-bound decode step: flat beyond 30 running requests, as on the H200
    traces), a line fitted where it still rises overshoots far beyond (5x at 360 running without
    the bend: the trees' monotone constraints cannot bring it back down); the held-out samples show
    it, the trainer bends the baseline, and a fresh request at 360 running is predicted near its
    p90. Where TPOT keeps growing (the simulator's compute-bound step), the line is kept."""

    tpot = _tpot_world(world)
    now = time.time()
    window = _load_window(tpot, lambda rng, n: np.geomspace(1, 300, n).round(), 12_000, seed=5, now=now)
    settings = _settings(tmp_path)
    store = ModelStore(settings.store_dir)
    outcome = Trainer(store, settings).run(window.snapshot(), now)
    assert outcome.outcome == "published"
    assert outcome.models["tpot"]["baseline"] == expected
    baseline = store.load().manifest.models["tpot"].baseline
    assert baseline is not None
    knees = len(set(baseline["features"])) < len(baseline["features"])  # a feature capped at knees
    assert knees == (expected == "bent")
    ratio = _median_over_p90(store, tpot, 360.0, seed=6)
    assert 0.9 < ratio < 1.12, ratio
