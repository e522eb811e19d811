"""Parity of the JIT evaluator (numba) with XGBoost's own margins: bit for bit, over many random
rows, missing values on both default sides, infinities, extremes and exactly-on-threshold rows,
several models in one pass, and the models the services really serve (prior, trained)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xgboost as xgb

from prediction_server.evaluators import load_booster
from prediction_server.jit_forest import MAX_DEPTH, JitForests, jit_available
from prediction_server.predictor import builtin_prior_model_set, probe_matrix
from shared.features import NUM_FEATURES as SERVED_FEATURES
from shared.features import build_features
from shared.prior import synthetic_columns
from tests.prediction_support import train_models
from tests.unit.test_trees import (
    MODELS,
    NUM_FEATURES,
    _model,
    _planted_special_model,
    _query_rows,
    _training_data,
    _xgb_margin,
)

pytestmark = pytest.mark.skipif(not jit_available(), reason="numba is not installed")


def _margins(boosters: list[xgb.Booster], X: np.ndarray) -> np.ndarray:
    return np.stack([_xgb_margin(booster, X) for booster in boosters])


@pytest.mark.parametrize(("objective", "max_depth"), MODELS)
def test_margins_are_bit_identical(objective: str, max_depth: int) -> None:
    booster = _model(objective, max_depth)
    X = _query_rows(booster, seed=2)  # ordinary, 30 % missing, all missing, extreme, on-threshold

    got = JitForests.from_boosters([booster]).predict_margins(X)

    assert got.dtype == np.float32 and got.shape == (1, X.shape[0])
    np.testing.assert_array_equal(got[0], _xgb_margin(booster, X))


def test_several_models_in_one_pass_over_many_random_rows() -> None:
    boosters = [_model(objective, depth) for objective, depth in MODELS]
    forests = JitForests.from_boosters(boosters)
    rng = np.random.default_rng(11)
    for _ in range(20):
        n = int(rng.integers(1, 2000))
        X = (rng.normal(size=(n, NUM_FEATURES)) * rng.choice([0.1, 1.0, 30.0])).astype(np.float32)
        X[rng.random(X.shape) < rng.uniform(0.0, 0.5)] = np.nan
        np.testing.assert_array_equal(forests.predict_margins(X), _margins(boosters, X))
    assert forests.num_models == 4 and forests.num_trees == 160


def test_infinities_are_values_and_nan_takes_the_default_side() -> None:
    booster = _model("reg:squarederror", 8)
    values = np.array([-np.inf, np.inf, np.nan, 0.0, -0.0, 1e-45, 3.4e38, -3.4e38], dtype=np.float32)
    X = np.random.default_rng(3).choice(values, size=(3000, NUM_FEATURES))
    np.testing.assert_array_equal(
        JitForests.from_boosters([booster]).predict_margins(X)[0], _xgb_margin(booster, X)
    )


@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 5000])
def test_any_batch_size_and_every_row_alone(n: int) -> None:
    booster = _model("reg:quantileerror", 6, rounds=120)
    forests = JitForests.from_boosters([booster])
    X = np.random.default_rng(n).normal(size=(n, NUM_FEATURES)).astype(np.float32)
    whole = forests.predict_margins(X)[0]
    np.testing.assert_array_equal(whole, _xgb_margin(booster, X))
    if 0 < n <= 33:  # a row's bits do not depend on its batch
        alone = np.concatenate([forests.predict_margins(X[i : i + 1])[0] for i in range(n)])
        np.testing.assert_array_equal(alone, whole)


def test_stumps_and_mixed_depths() -> None:
    X, _ = _training_data()
    params: dict[str, Any] = {"tree_method": "hist", "base_score": 0.0, "nthread": 1}
    stumps = xgb.train(params, xgb.DMatrix(X, np.full(X.shape[0], 5.0)), num_boost_round=5)
    _, y = _training_data()
    mixed = xgb.train({**params, "max_depth": 5}, xgb.DMatrix(X, y), num_boost_round=5, xgb_model=stumps)
    Q = _query_rows(mixed)
    for booster in (stumps, mixed):
        np.testing.assert_array_equal(
            JitForests.from_boosters([booster]).predict_margins(Q)[0], _xgb_margin(booster, Q)
        )
    assert JitForests.from_boosters([stumps]).max_depth == 0


def test_planted_thresholds_on_signed_zero_subnormals_and_extremes() -> None:
    model, edited, X = _planted_special_model()
    np.testing.assert_array_equal(
        JitForests.from_models([model]).predict_margins(X)[0], _xgb_margin(edited, X)
    )


def test_the_served_models_prior_and_trained_at_the_llmd_size() -> None:
    """The built-in prior and trained quantile models (200 trees) on the served features."""
    prior = builtin_prior_model_set(0.9).files
    trained = train_models(seed=3, rows=3000, rounds=200)
    rng = np.random.default_rng(12)
    columns = synthetic_columns(3000, rng)
    rows = np.concatenate([probe_matrix(), build_features(columns)])
    rows[rng.random(rows.shape) < 0.05] = np.nan
    for files in (prior, trained):
        boosters = [load_booster(files[name], name) for name in ("ttft", "tpot")]
        forests = JitForests.from_boosters(boosters)
        assert forests.num_features == SERVED_FEATURES
        np.testing.assert_array_equal(forests.predict_margins(rows), _margins(boosters, rows))


def test_refuses_what_it_cannot_lay_out() -> None:
    X, y = _training_data()
    deep = xgb.train(
        {"tree_method": "hist", "max_depth": MAX_DEPTH + 2, "nthread": 1, "min_child_weight": 0},
        xgb.DMatrix(X, y),
        num_boost_round=3,
    )
    with pytest.raises(ValueError, match="deeper than"):
        JitForests.from_boosters([deep])
    other = xgb.train({"nthread": 1}, xgb.DMatrix(X[:, :5], y), num_boost_round=2)
    with pytest.raises(ValueError, match="disagree"):
        JitForests.from_boosters([_model("reg:squarederror", 4), other])
    logistic = xgb.train({"objective": "binary:logistic", "nthread": 1}, xgb.DMatrix(X, y > y.mean()), 2)
    with pytest.raises(ValueError, match="not supported"):
        JitForests.from_boosters([logistic])


def test_tables_are_read_only() -> None:
    forests = JitForests.from_boosters([_model("reg:squarederror", 4)])
    with pytest.raises(ValueError, match="read-only"):
        forests._packed[0] = 0


def test_kernels_refuse_a_layout_they_were_not_written_for() -> None:
    """numba caches jit_layout's constants in the machine code and invalidates the cache only when
    jit_kernels.py changes: a layout edited alone must fail loudly, not serve stale code."""
    import subprocess
    import sys

    code = (
        "import prediction_server.jit_layout as layout\n"
        "layout.LAYOUT = (16,) + layout.LAYOUT[1:]\n"
        "try:\n"
        "    import prediction_server.jit_kernels\n"
        "except ImportError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: jit_layout.LAYOUT (16," in out.stdout, out.stdout + out.stderr
