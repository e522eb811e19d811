"""Choosing the tree evaluator: size-based routing, the parity gate, the measured crossover."""

from __future__ import annotations

import numpy as np
import pytest

from prediction_server.evaluators import (
    MAX_CROSSOVER_ROWS,
    MIN_CROSSOVER_ROWS,
    AdaptiveForest,
    BoosterForest,
    adaptive_forest,
    crossover_rows,
    load_booster,
)
from prediction_server.predictor import probe_matrix
from tests.prediction_support import train_models


@pytest.fixture(scope="module")
def boosters() -> tuple[object, object]:
    first, second = train_models(seed=1, rows=500, rounds=10), train_models(seed=2, rows=500, rounds=10)
    return load_booster(first["ttft"], "a"), load_booster(second["ttft"], "b")


def test_adaptive_forest_sends_batches_by_size(boosters: tuple[object, object]) -> None:
    a, b = BoosterForest(boosters[0]), BoosterForest(boosters[1])
    forest = AdaptiveForest(a, b, max_compiled_rows=10)
    probe = probe_matrix()
    np.testing.assert_array_equal(forest.predict_margin(probe[:10]), a.predict_margin(probe[:10]))
    np.testing.assert_array_equal(forest.predict_margin(probe[:11]), b.predict_margin(probe[:11]))
    assert forest.name == "xgboost<=10<xgboost"


def test_a_compiled_form_that_disagrees_with_xgboost_is_not_used(boosters: tuple[object, object]) -> None:
    wrong = BoosterForest(boosters[1])  # a real evaluator, of another model
    forest = adaptive_forest(wrong, boosters[0], probe_matrix(), "test")
    assert isinstance(forest, BoosterForest)
    np.testing.assert_array_equal(
        forest.predict_margin(probe_matrix()), BoosterForest(boosters[0]).predict_margin(probe_matrix())
    )


def test_an_agreeing_form_serves_small_batches_up_to_a_bounded_crossover(
    boosters: tuple[object, object],
) -> None:
    same = BoosterForest(boosters[0])
    forest = adaptive_forest(same, boosters[0], probe_matrix(), "test")
    assert isinstance(forest, AdaptiveForest)
    assert MIN_CROSSOVER_ROWS <= forest.max_compiled_rows <= MAX_CROSSOVER_ROWS
    assert MIN_CROSSOVER_ROWS <= crossover_rows(same, same, probe_matrix()) <= MAX_CROSSOVER_ROWS
