"""Choosing the tree evaluator: exact candidates only, size-based routing, the measured crossover."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from prediction_server.evaluators import (
    MAX_CROSSOVER_ROWS,
    MIN_CROSSOVER_ROWS,
    AdaptiveForest,
    BoosterForest,
    NativeBoosterForest,
    compile_forest,
    crossover_rows,
    load_booster,
    verified,
)
from prediction_server.predictor import probe_matrix
from prediction_server.trees import CompiledForest
from tests.prediction_support import train_models


@pytest.fixture(scope="module")
def boosters() -> tuple[Any, Any]:
    first, second = train_models(seed=1, rows=500, rounds=10), train_models(seed=2, rows=500, rounds=10)
    return load_booster(first["ttft"], "a"), load_booster(second["ttft"], "b")


@pytest.mark.parametrize("rows", [1, 3, 100, 5000])
def test_the_direct_c_call_equals_inplace_predict_exactly(boosters: tuple[Any, Any], rows: int) -> None:
    features = np.ascontiguousarray(np.resize(probe_matrix(), (rows, probe_matrix().shape[1])))
    features[::7] *= 3.0
    for booster in boosters:
        expected = BoosterForest(booster).predict_margin(features)
        got = NativeBoosterForest(booster).predict_margin(features)
        assert got.dtype == np.float32 and got.shape == (rows,)
        np.testing.assert_array_equal(got, expected)


def test_served_forests_route_small_batches_to_the_compiled_form(boosters: tuple[Any, Any]) -> None:
    forest = compile_forest(boosters[0], probe_matrix(), "test")
    assert isinstance(forest, AdaptiveForest)
    assert forest.name.startswith("CompiledForest<=") and forest.name.endswith("<xgboost-c")
    assert MIN_CROSSOVER_ROWS <= forest.max_small_rows <= MAX_CROSSOVER_ROWS
    reference = BoosterForest(boosters[0])
    for rows in (1, forest.max_small_rows, forest.max_small_rows + 1, 3000):
        features = np.ascontiguousarray(np.resize(probe_matrix(), (rows, probe_matrix().shape[1])))
        np.testing.assert_array_equal(forest.predict_margin(features), reference.predict_margin(features))


def test_adaptive_forest_sends_batches_by_size(boosters: tuple[Any, Any]) -> None:
    a, b = BoosterForest(boosters[0]), BoosterForest(boosters[1])
    forest = AdaptiveForest(a, b, max_small_rows=10)
    probe = probe_matrix()
    np.testing.assert_array_equal(forest.predict_margin(probe[:10]), a.predict_margin(probe[:10]))
    np.testing.assert_array_equal(forest.predict_margin(probe[:11]), b.predict_margin(probe[:11]))
    assert forest.name == "xgboost<=10<xgboost"


def test_a_candidate_that_disagrees_with_xgboost_is_not_used(boosters: tuple[Any, Any]) -> None:
    expected = BoosterForest(boosters[0]).predict_margin(probe_matrix())
    wrong = CompiledForest.from_booster(boosters[1])  # a real evaluator, of another model
    assert verified(wrong, expected, probe_matrix(), "test") is None
    right = CompiledForest.from_booster(boosters[0])
    assert verified(right, expected, probe_matrix(), "test") is right


def test_the_crossover_is_bounded(boosters: tuple[Any, Any]) -> None:
    same = BoosterForest(boosters[0])
    assert MIN_CROSSOVER_ROWS <= crossover_rows(same, same, probe_matrix()) <= MAX_CROSSOVER_ROWS
