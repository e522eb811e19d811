"""The model structure: a work-ahead baseline the trees are trained around, monotone in the work.

Trained on queues no deeper than K, the served TTFT must keep growing at 3K (trees alone predict
a flat TTFT beyond the deepest queue they saw), and more queued work never lowers it. Trained
before the KV cache ever filled, TTFT's baseline must still grow faster once it is full (the
queue then waits for running requests to free their cache).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import xgboost as xgb

from prediction_server.predictor import Predictor
from shared.artifacts import Manifest, ModelSpec, served_latency_ms
from shared.baseline import BASELINE_KIND, PIECEWISE_KIND, SCALED_KIND, baseline_ms, check_baseline
from shared.errors import ArtifactError
from shared.features import FEATURE_NAMES, build_features
from shared.model_store import ModelStore
from shared.prior import publish_prior
from shared.schemas import parse_rows
from stack.simulator import Cluster, PodConfig, Workload, WorkloadConfig, round_robin, simulate
from training_server import synthetic
from training_server.baseline_fit import fit_baseline, quantile_regression_nonneg, widest_baseline
from training_server.config import TrainingSettings
from training_server.trainer import Trainer
from training_server.window import StratifiedWindow

QUANTILE = 0.9
K = 6


def _train(tmp_path: Path, **overrides: Any) -> ModelStore:
    """Publish a model trained only on queues of at most K waiting requests."""
    settings = TrainingSettings(
        data_dir=tmp_path, n_estimators=60, min_train_samples=200, stratum_cap=1_000_000, **overrides
    )
    store = ModelStore(settings.store_dir)
    publish_prior(store, QUANTILE)
    columns = synthetic.samples(12_000, np.random.default_rng(1))
    keep = columns["num_request_waiting"] <= K
    columns = {name: column[keep] for name, column in columns.items()}
    n = len(columns["num_request_waiting"])
    window = StratifiedWindow(stratum_cap=1_000_000, max_age_s=3600)
    window.insert(columns, time.time() - 100 + np.linspace(0, 99, n))
    assert Trainer(store, settings).run(window.snapshot(), time.time()).outcome == "published"
    return store


@pytest.fixture(scope="module")
def structured(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return _train(tmp_path_factory.mktemp("structured"))


def _served_ttft(store: ModelStore, waiting: int, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """The prediction server's TTFT for pod states pinned at ``waiting``, and sampled actuals."""
    columns = synthetic.samples(3000, np.random.default_rng(seed), waiting=waiting)
    ttft, _ = Predictor.from_model_set(store.load()).predict(build_features(columns))
    return ttft, columns["actual_ttft_ms"]


def test_ttft_keeps_growing_with_queued_work_beyond_the_trained_depth(structured: ModelStore) -> None:
    at_k, _ = _served_ttft(structured, K)
    at_3k, actual_3k = _served_ttft(structured, 3 * K)
    # The true TTFT roughly doubles from K to 3K waiting; the prediction must follow, not stay flat.
    assert float(np.median(at_3k / at_k)) > 1.6
    assert float(np.mean(actual_3k <= at_3k)) > 0.7, "an overload never seen is still mostly covered"


def test_without_the_baseline_trees_predict_a_flat_ttft_past_the_trained_depth(tmp_path: Path) -> None:
    """The failure the baseline fixes, kept visible: trees alone stop at the deepest queue seen."""
    store = _train(tmp_path, work_baseline=False, monotone_constraints=False)
    at_k, _ = _served_ttft(store, K)
    at_3k, actual_3k = _served_ttft(store, 3 * K)
    assert float(np.median(at_3k / at_k)) < 1.1
    assert float(np.mean(actual_3k <= at_3k)) < 0.3


def test_more_queued_work_never_lowers_ttft_and_more_decode_work_never_lowers_tpot(
    structured: ModelStore,
) -> None:
    predictor = Predictor.from_model_set(structured.load())
    columns = synthetic.pod_states(200, np.random.default_rng(7))
    queued = {"num_request_waiting": 2.0, "prefill_tokens_in_flight": 1500.0}
    decoding = {"decode_tokens_in_flight": 8000.0, "num_request_running": 4.0}
    for model, growth in ((0, queued), (1, decoding)):
        previous = None
        for step in range(12):
            grown = {
                **columns,
                **{name: columns[name] + per_step * step for name, per_step in growth.items()},
            }
            predicted = predictor.predict(build_features(grown))[model]
            if previous is not None:
                assert (predicted >= previous * (1 - 1e-6)).all(), (model, step)
            previous = predicted


def test_the_manifest_records_the_baseline_and_serving_matches_the_trainers_arithmetic(
    structured: ModelStore,
) -> None:
    model_set = structured.load()
    spec = model_set.manifest.models["ttft"]
    # The synthetic TTFT's cost per waiting request grows with the cache's use: the newest
    # samples pick the KV-scaled terms.
    assert spec.baseline is not None and spec.baseline["kind"] == SCALED_KIND
    assert all(c >= 0 for c in spec.baseline["coefficients"])
    features = build_features(synthetic.pod_states(500, np.random.default_rng(3)))
    booster = xgb.Booster(model_file=bytearray(model_set.files["ttft"]))
    trees = booster.inplace_predict(features, predict_type="margin")
    expected = np.expm1(trees + np.log1p(baseline_ms(features, spec.baseline)) + spec.calibration_offset)
    np.testing.assert_allclose(served_latency_ms(trees, features, spec), expected, rtol=1e-9)
    served, _ = Predictor.from_model_set(model_set).predict(features)
    np.testing.assert_allclose(served, expected, rtol=1e-5)


def test_a_row_gets_the_same_bits_alone_or_in_any_batch(structured: ModelStore) -> None:
    """The coalescer batches callers together: a caller's answer must not depend on its company
    (a BLAS dot product in the baseline rounded differently by batch shape)."""
    predictor = Predictor.from_model_set(structured.load())
    columns = synthetic.pod_states(997, np.random.default_rng(11))
    rng = np.random.default_rng(12)
    columns["prefill_tokens_in_flight"] = rng.integers(0, 9000, 997).astype(np.float64)
    columns["decode_tokens_in_flight"] = rng.integers(0, 500, 997).astype(np.float64)
    features = build_features(columns)
    ttft_all, tpot_all = predictor.predict(features)
    for i in range(0, 997, 7):
        ttft_one, tpot_one = predictor.predict(features[i : i + 1])
        ttft_two, tpot_two = predictor.predict(features[i : i + 2])
        assert ttft_one[0] == ttft_two[0] == ttft_all[i] and tpot_one[0] == tpot_two[0] == tpot_all[i], i
    for lo, hi in ((3, 10), (100, 228)):
        ttft_part, _ = predictor.predict(features[lo:hi])
        assert np.array_equal(ttft_part, ttft_all[lo:hi])


def test_manifests_without_a_baseline_still_load_and_a_bad_baseline_is_refused(
    structured: ModelStore,
) -> None:
    data = structured.load().manifest.to_json()
    old = orjson.loads(data)  # as a version written before baselines existed
    for spec in old["models"].values():
        spec.pop("baseline")
    loaded = Manifest.from_json(orjson.dumps(old))
    assert all(spec.baseline is None for spec in loaded.models.values())
    loaded.check_compatible()
    bad = orjson.loads(data)
    bad["models"]["ttft"]["baseline"]["features"] = ["no_such_feature"]
    with pytest.raises(ArtifactError):
        Manifest.from_json(orjson.dumps(bad)).check_compatible()
    assert ModelSpec(file="x", sha256="", size_bytes=0).baseline is None


def test_quantile_regression_recovers_non_negative_slopes() -> None:
    rng = np.random.default_rng(4)
    x = rng.uniform(0, 100, (20_000, 3))
    y = (10 + 3.0 * x[:, 0] + 0.5 * x[:, 1]) * np.exp(0.2 * rng.standard_normal(len(x)))
    intercept, slopes = quantile_regression_nonneg(x, y, QUANTILE)
    assert (slopes >= 0).all()
    fitted = intercept + x @ slopes
    assert abs(float(np.mean(y <= fitted)) - QUANTILE) < 0.02
    assert slopes[0] > 3.0 and slopes[2] < 0.2  # the p90 grows faster than the median; x2 is noise


def test_the_baseline_is_summed_term_by_term_in_the_documented_order() -> None:
    """``baseline_ms`` equals ``((intercept + x0 c0) + x1 c1) + ...`` in float64, bit for bit, for
    every row: the order training and serving agreed on (a reordered sum rounds differently)."""
    rng = np.random.default_rng(11)
    baseline = {
        "kind": "linear",
        "features": ["num_request_waiting", "prefill_tokens_in_flight", "uncached_input_tokens"],
        "intercept": -3.3,
        "coefficients": [0.1, 1e-7, 123.456],
    }
    index = [FEATURE_NAMES.index(name) for name in baseline["features"]]
    for rows in (1, 9, 1000):
        features = rng.lognormal(2.0, 4.0, (rows, 15)).astype(np.float32)
        features[: rows // 3] = 0.0
        expected = np.full(rows, baseline["intercept"])
        for column, coefficient in zip(index, baseline["coefficients"], strict=True):
            expected = expected + features[:, column].astype(np.float64) * coefficient
        expected = np.maximum(expected, 0.0)
        assert baseline_ms(features, baseline).tobytes() == expected.tobytes()


def test_a_capped_baseline_stays_at_its_bounds_and_bad_bounds_are_refused() -> None:
    """``upper`` caps each term before it is weighted: rows beyond a bound get the bound's value,
    rows within every bound the uncapped value (the same bits); the served value never falls as
    the work grows. Bounds of the wrong length or not finite are refused, and so are bounds
    without their kind or that kind without bounds."""
    linear = {
        "kind": "linear",
        "features": ["num_request_running", "decode_tokens_in_flight"],
        "intercept": 20.0,
        "coefficients": [0.6, 1e-4],
    }
    capped = {**linear, "kind": PIECEWISE_KIND, "upper": [30.0, 3.0e38]}
    check_baseline(capped)
    running, decode = (
        FEATURE_NAMES.index("num_request_running"),
        FEATURE_NAMES.index("decode_tokens_in_flight"),
    )
    features = np.zeros((400, len(FEATURE_NAMES)), dtype=np.float32)
    features[:, running] = np.arange(400)
    features[:, decode] = 100.0
    uncapped, bounded = baseline_ms(features, linear), baseline_ms(features, capped)
    assert bounded[:31].tobytes() == uncapped[:31].tobytes()
    assert np.all(bounded[31:] == bounded[30]) and bounded[30] == 20.0 + 0.6 * 30 + 1e-4 * 100
    assert np.all(np.diff(bounded) >= 0)
    for bad in ([30.0], [], None, [30.0, float("inf")], [30.0, float("nan")], "high"):
        with pytest.raises(ArtifactError):
            check_baseline({**capped, "upper": bad})
    # Bounds only with their own kind: a server that predates them refuses the version instead
    # of reading the repeated terms as a plain sum.
    without_kind = {**capped, "kind": "linear"}
    without_bounds = {k: v for k, v in capped.items() if k != "upper"}
    for bad_kind in (without_kind, without_bounds):
        with pytest.raises(ArtifactError):
            check_baseline(bad_kind)


def test_a_scaled_term_grows_with_its_scale_feature_and_bad_scales_are_refused() -> None:
    """A scaled term is ``(capped work * max(scale - scale_from, 0)) * coefficient``; unscaled terms
    keep the bits of the same baseline without scales. Scales of the wrong length, of unknown
    features, not finite, or without their kind are refused."""
    plain = {
        "kind": PIECEWISE_KIND,
        "features": ["num_request_waiting", "prefill_work_tokens"],
        "intercept": 5.0,
        "coefficients": [2.0, 0.01],
        "upper": [3.0e38, 3.0e38],
    }
    scaled = {
        **plain,
        "kind": SCALED_KIND,
        "features": [*plain["features"], "prefill_work_tokens"],
        "coefficients": [2.0, 0.01, 0.5],
        "upper": [3.0e38] * 3,
        "scale_features": [None, None, "kv_cache_percentage"],
        "scale_from": [0.0, 0.0, 0.9],
    }
    check_baseline(scaled)
    features = np.zeros((101, len(FEATURE_NAMES)), dtype=np.float32)
    features[:, FEATURE_NAMES.index("kv_cache_percentage")] = np.linspace(0.0, 1.0, 101)
    features[:, FEATURE_NAMES.index("prefill_work_tokens")] = 4000.0
    features[:, FEATURE_NAMES.index("num_request_waiting")] = 3.0
    kv = features[:, 0].astype(np.float64)
    below = kv <= 0.9
    assert baseline_ms(features, scaled)[below].tobytes() == baseline_ms(features, plain)[below].tobytes()
    expected = baseline_ms(features, plain) + 4000.0 * np.maximum(kv - 0.9, 0.0) * 0.5
    np.testing.assert_allclose(baseline_ms(features, scaled), expected, rtol=1e-12)
    assert np.all(np.diff(baseline_ms(features, scaled)) >= 0) and expected[-1] > expected[90] + 150
    bad_scales: list[dict[str, Any]] = [
        {"scale_features": [None, "kv_cache_percentage"]},
        {"scale_features": [None, None, "no_such_feature"]},
        {"scale_from": [0.0, 0.0, float("nan")]},
        {"scale_from": [0.0, 0.0]},
        {"kind": PIECEWISE_KIND},  # scales only with their own kind: an older server refuses them
    ]
    for bad in bad_scales:
        with pytest.raises(ArtifactError):
            check_baseline({**scaled, **bad})
    for missing in ("scale_features", "scale_from", "upper"):
        with pytest.raises(ArtifactError):
            check_baseline({k: v for k, v in scaled.items() if k != missing})


def _overload(seed: int) -> list[Any]:
    """The completions, in routing order, of 4 simulated pods at 40 req/s for 120 s: a load that
    builds into queues of dozens of requests behind a full KV cache."""
    workload = Workload(WorkloadConfig(rate_rps=40.0, num_requests=None, duration_s=120.0, seed=seed))
    done = simulate(workload, Cluster([PodConfig() for _ in range(4)], seed=seed), round_robin())
    return sorted(done, key=lambda c: c.routed_at_s)


@pytest.mark.parametrize("seed", [0, 1])
def test_ttfts_baseline_fitted_before_the_cache_filled_covers_the_queue_behind_a_full_cache(
    seed: int,
) -> None:
    """Fitted on the requests that saw fewer than 8 waiting, TTFT's baseline alone covers most of
    the later half of those that saw 16 or more (a cache 0.99 full) once the earlier half, as the
    newest rows, showed that the KV-scaled terms predict them better; without the terms it covers
    none. Where the cache's use says nothing of the latency (shuffled among the rows), the line is
    kept."""
    done = _overload(seed)
    features = build_features(parse_rows([c.features for c in done]))
    ttft = np.array([c.ttft_ms for c in done])
    waiting = features[:, FEATURE_NAMES.index("num_request_waiting")]
    light, deep = np.flatnonzero(waiting < 8), np.flatnonzero(waiting >= 16)
    assert len(deep) > 500
    assert float(np.median(features[deep, FEATURE_NAMES.index("kv_cache_percentage")])) > 0.95
    shown, later = deep[: len(deep) // 2], deep[len(deep) // 2 :]

    def fitted(newest: np.ndarray, kv_scaled: bool, rows: np.ndarray = features) -> dict[str, Any]:
        baseline = fit_baseline(
            "ttft",
            rows[light],
            ttft[light],
            QUANTILE,
            (rows[newest], ttft[newest]),
            bend=True,
            kv_scaled=kv_scaled,
        )
        assert baseline is not None
        return baseline

    def coverage(baseline: dict[str, Any]) -> float:
        return float(np.mean(ttft[later] <= baseline_ms(features[later], baseline)))

    scaled = fitted(shown, kv_scaled=True)
    assert scaled["kind"] == SCALED_KIND
    assert coverage(scaled) > 0.6
    assert coverage(fitted(shown, kv_scaled=False)) < 0.1  # the failure the terms fix, kept visible
    shuffled = features.copy()
    kv = FEATURE_NAMES.index("kv_cache_percentage")
    shuffled[:, kv] = np.random.default_rng(seed).permutation(shuffled[:, kv])
    assert fitted(shown, kv_scaled=True, rows=shuffled)["kind"] == BASELINE_KIND


@pytest.mark.parametrize(("model", "kind"), [("ttft", SCALED_KIND), ("tpot", PIECEWISE_KIND)])
def test_the_widest_baseline_is_the_alternative_the_fit_may_choose(model: str, kind: str) -> None:
    """``widest_baseline`` (what bench/prediction_load.py serves) is each model's alternative to the
    line, fitted as ``fit_baseline`` fits it: TTFT's KV-scaled terms, TPOT's bent one. Where the
    newest rows show the alternative better, ``fit_baseline`` chooses exactly that description."""
    done = _overload(0)
    features = build_features(parse_rows([c.features for c in done]))
    latency = np.array([c.ttft_ms if model == "ttft" else c.tpot_ms for c in done])
    rows = np.flatnonzero(latency > 0)
    widest = widest_baseline(model, features[rows], latency[rows], QUANTILE)
    assert widest is not None and widest["kind"] == kind
    check_baseline(widest)
    line = fit_baseline(model, features[rows], latency[rows], QUANTILE, bend=True, kv_scaled=True)
    assert line is not None and len(line["features"]) < len(widest["features"])  # nothing judged: the line
    # newest rows that the widest form predicts exactly: the fit must take it, and the same one
    newest = (features[rows], baseline_ms(features[rows], widest))
    chosen = fit_baseline(model, features[rows], latency[rows], QUANTILE, newest, bend=True, kv_scaled=True)
    assert chosen == widest
    assert widest_baseline(model, features[:0], latency[:0], QUANTILE) is None


def _window(done: list[Any], until_s: float) -> StratifiedWindow:
    """The samples of the requests completed by ``until_s``, stamped when they completed."""
    done = sorted((c for c in done if c.finished_s <= until_s), key=lambda c: c.finished_s)
    columns = parse_rows([c.features for c in done])
    columns["actual_ttft_ms"] = np.array([c.ttft_ms for c in done])
    columns["actual_tpot_ms"] = np.array([c.tpot_ms for c in done])
    finished = np.array([c.finished_s for c in done])
    window = StratifiedWindow(stratum_cap=1_000_000, max_age_s=3600)
    window.insert(columns, time.time() - until_s + finished)
    return window


@pytest.mark.parametrize("kv_scale", [True, False])
def test_the_trainer_takes_the_kv_terms_when_an_overload_builds(tmp_path: Path, kv_scale: bool) -> None:
    """With the default settings, a window whose newest samples are a queue building behind a
    filling cache gets TTFT's KV-scaled baseline (``--no-baseline-kv-scale``: the line)."""
    settings = TrainingSettings(
        data_dir=tmp_path, n_estimators=60, min_train_samples=200, baseline_kv_scale=kv_scale
    )
    store = ModelStore(settings.store_dir)
    window = _window(_overload(0), until_s=40.0)  # the newest samples saw queues of 16 and more
    outcome = Trainer(store, settings).run(window.snapshot(), time.time())
    assert outcome.outcome == "published"
    assert outcome.models["ttft"]["baseline"] == ("kv-scaled" if kv_scale else "linear")
    spec = store.load().manifest.models["ttft"]
    assert spec.baseline is not None
    assert spec.baseline["kind"] == (SCALED_KIND if kv_scale else BASELINE_KIND)


def test_a_kv_term_is_fitted_only_where_enough_rows_support_it() -> None:
    """TTFT's cost per token grows with the cache's use, seen on 4,000 rows; only 10 of them saw
    the cache more than 0.9 full, at a latency 20x the rest's. The term past 0.9 would fit those
    few and explode beyond them; it is left out, and a fuller cache with twice the work is
    predicted within 3x of its truth."""
    rng = np.random.default_rng(4)
    features = build_features(synthetic.pod_states(4_000, rng))
    kv, work = FEATURE_NAMES.index("kv_cache_percentage"), FEATURE_NAMES.index("prefill_work_tokens")
    features[:, kv] = rng.uniform(0.0, 0.85, len(features))
    features[:10, kv] = 0.95

    def truth(rows: np.ndarray) -> np.ndarray:
        return 20.0 + 0.05 * rows[:, work] * (1.0 + 4.0 * rows[:, kv])

    ttft = truth(features) * rng.lognormal(0.0, 0.1, len(features))
    ttft[:10] *= 20.0
    newest = features[-1000:], ttft[-1000:]
    baseline = fit_baseline(
        "ttft", features[:-1000], ttft[:-1000], QUANTILE, newest, bend=True, kv_scaled=True
    )
    assert baseline is not None and baseline["kind"] == SCALED_KIND
    kv_knees = [f for s, f in zip(baseline["scale_features"], baseline["scale_from"], strict=True) if s]
    assert kv_knees == [0.0], kv_knees
    full = features[-1000:].copy()
    full[:, kv] = 0.99
    full[:, work] *= 2.0
    ratio = baseline_ms(full, baseline) / truth(full)
    assert float(np.max(ratio)) < 3.0, float(np.max(ratio))


def test_tpots_prefill_term_stays_flat_beyond_the_prefill_its_rows_saw() -> None:
    """A decode step prefills at most its token budget, so TPOT stops growing with the prefill in
    flight, which counts every waiting prompt in full: TPOT's baseline is linear in it up to the
    largest value its fit rows saw and flat beyond, and still grows with the running requests
    beyond theirs. TTFT waits for all the queued prefill: its baseline keeps growing with it."""
    rng = np.random.default_rng(7)
    features = build_features(synthetic.pod_states(4_000, rng))
    running, prefill = (FEATURE_NAMES.index(f) for f in ("num_request_running", "prefill_tokens_in_flight"))
    features[:, running] = rng.integers(1, 40, len(features))
    features[:, prefill] = rng.uniform(0.0, 8_000.0, len(features))
    tpot = (10.0 + 0.3 * features[:, running] + 0.002 * features[:, prefill]) * rng.lognormal(
        0.0, 0.05, len(features)
    )
    baseline = fit_baseline("tpot", features, tpot, QUANTILE, bend=False, kv_scaled=False)
    assert baseline is not None and baseline["kind"] == PIECEWISE_KIND
    row = features[:1].copy()
    row[0, running] = 20.0

    def at(prefill_tokens: float, running_requests: float = 20.0) -> float:
        probe = row.copy()
        probe[0, prefill], probe[0, running] = prefill_tokens, running_requests
        return float(baseline_ms(probe, baseline)[0])

    assert at(4_000.0) < at(8_000.0)  # linear where the rows showed it
    assert at(80_000.0) == pytest.approx(at(float(features[:, prefill].max())), rel=1e-6)  # flat beyond
    assert at(80_000.0) < 1.2 * at(8_000.0)
    assert at(8_000.0, 400.0) > 3.0 * at(8_000.0, 40.0)  # the decode work keeps extrapolating
    ttft = 20.0 + 0.05 * features[:, prefill] * rng.lognormal(0.0, 0.05, len(features))
    ttft_baseline = fit_baseline("ttft", features, ttft, QUANTILE, bend=False, kv_scaled=False)
    assert ttft_baseline is not None
    probe = features[:1].copy()
    far, near = probe.copy(), probe.copy()
    far[0, prefill], near[0, prefill] = 80_000.0, 8_000.0
    assert baseline_ms(far, ttft_baseline)[0] > 5.0 * baseline_ms(near, ttft_baseline)[0]
