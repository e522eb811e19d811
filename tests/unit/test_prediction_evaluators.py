"""Choosing the tree evaluator: exact candidates only, the JIT first, the numpy/XGBoost fallback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prediction_server.evaluators import (
    NUMPY_MAX_ROWS,
    AdaptiveForest,
    BoosterForest,
    NativeBoosterForest,
    SeparateForests,
    compile_forests,
    load_booster,
    verified,
)
from prediction_server.jit_forest import JitForests, warm_kernel
from prediction_server.predictor import probe_matrix
from prediction_server.trees import CompiledForest
from tests.prediction_support import train_models

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def boosters() -> tuple[Any, Any]:
    first, second = train_models(seed=1, rows=500, rounds=10), train_models(seed=2, rows=500, rounds=10)
    return load_booster(first["ttft"], "a"), load_booster(second["ttft"], "b")


def _rows(rows: int) -> np.ndarray:
    features = np.ascontiguousarray(np.resize(probe_matrix(), (rows, probe_matrix().shape[1])))
    features[::7] *= 3.0
    return features


@pytest.mark.parametrize("rows", [1, 3, 100, 5000])
def test_the_direct_c_call_equals_inplace_predict_exactly(boosters: tuple[Any, Any], rows: int) -> None:
    features = _rows(rows)
    for booster in boosters:
        expected = BoosterForest(booster).predict_margin(features)
        got = NativeBoosterForest(booster).predict_margin(features)
        assert got.dtype == np.float32 and got.shape == (rows,)
        np.testing.assert_array_equal(got, expected)


def test_a_version_is_served_by_the_jit_in_one_pass_for_every_batch_size(boosters: tuple[Any, Any]) -> None:
    assert warm_kernel()  # a process that has loaded the kernel: the JIT serves at once
    forests = compile_forests(boosters, probe_matrix(), ["a", "b"])
    assert isinstance(forests, JitForests) and forests.name == "numba-jit"
    for rows in (1, 10, 100, NUMPY_MAX_ROWS + 1, 3000):
        features = _rows(rows)
        got = forests.margins(features)
        assert len(got) == 2
        for margin, booster in zip(got, boosters, strict=True):
            assert margin.dtype == np.float32 and margin.shape == (rows,)
            np.testing.assert_array_equal(margin, BoosterForest(booster).predict_margin(features))


def test_without_the_jit_small_batches_go_to_numpy_and_large_ones_to_xgboost(
    boosters: tuple[Any, Any],
) -> None:
    forests = compile_forests(boosters, probe_matrix(), ["a", "b"], jit=False)
    assert isinstance(forests, SeparateForests)
    assert forests.name == f"CompiledForest<={NUMPY_MAX_ROWS}<xgboost-c"
    for rows in (1, NUMPY_MAX_ROWS, NUMPY_MAX_ROWS + 1, 3000):
        features = _rows(rows)
        for margin, booster in zip(forests.margins(features), boosters, strict=True):
            np.testing.assert_array_equal(margin, BoosterForest(booster).predict_margin(features))


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


def test_without_numba_the_server_falls_back_to_numpy_with_the_same_answers(tmp_path: Path) -> None:
    """A process where ``import numba`` fails (as when it is not installed) serves through the
    numpy/XGBoost evaluators and gives the JIT's answers bit for bit."""
    code = (
        "import sys\n"
        "sys.modules['numba'] = None\n"  # import numba now raises ImportError
        "import numpy as np\n"
        "from prediction_server.predictor import Predictor, builtin_prior_model_set, probe_matrix\n"
        "p = Predictor.from_model_set(builtin_prior_model_set(0.9))\n"
        "ttft, tpot = p.predict(probe_matrix())\n"
        f"np.save({str(tmp_path / 'fallback.npy')!r}, np.stack([ttft, tpot]))\n"
        "print(p.evaluator)\n"
    )
    evaluator = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert evaluator == f"CompiledForest<={NUMPY_MAX_ROWS}<xgboost-c"
    from prediction_server.predictor import Predictor, builtin_prior_model_set

    assert warm_kernel()
    jit = Predictor.from_model_set(builtin_prior_model_set(0.9))
    assert jit.evaluator == "numba-jit"
    np.testing.assert_array_equal(np.load(tmp_path / "fallback.npy"), np.stack(jit.predict(probe_matrix())))


def test_a_first_version_is_served_at_once_by_the_fallback_then_by_the_jit(tmp_path: Path) -> None:
    """In a new process the first version does not wait for numba: XGBoost's C predictor serves it
    from the first call, the JIT from when its kernel is loaded, with the same answers bit for bit."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from prediction_server.predictor import Predictor, builtin_prior_model_set, probe_matrix\n"
        "model_set = builtin_prior_model_set(0.9)\n"
        "p = Predictor.from_model_set(model_set)\n"
        "first = p.evaluator\n"
        "before = np.stack(p.predict(probe_matrix()))\n"
        "assert p.forests.wait(120)\n"
        "after = np.stack(p.predict(probe_matrix()))\n"
        "switched = Predictor.from_model_set(model_set)\n"  # the kernel is loaded: the JIT at once
        "assert np.array_equal(before, after)\n"
        "assert np.array_equal(after, np.stack(switched.predict(probe_matrix())))\n"
        "print(first, p.evaluator, type(switched.forests).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["xgboost-c", "numba-jit", "JitForests"]
