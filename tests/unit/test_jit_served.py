"""The JIT's served kernel (features, trees, calibration, baseline, regime offsets in one pass):
the same bits as ``Predictor.predict(build_features(...))``, for every served form of a version,
and never used when it does not reproduce them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prediction_server import predictor as predictor_module
from prediction_server.jit_forest import JitForests, warm_served_kernel
from prediction_server.predictor import Predictor, builtin_prior_model_set
from shared.baseline import PIECEWISE_KIND as PIECEWISE
from shared.baseline import SCALED_KIND as SCALED
from shared.baseline import WORK_FEATURES
from shared.features import build_features
from shared.model_store import ModelStore
from shared.regimes import DEFAULT_SCHEME, RegimeOffsets
from shared.row_decoder import RowMatrix, from_columns, to_columns
from shared.schemas import parse_rows
from shared.wire_fields import MAX_COUNT
from tests.prediction_support import publish_trained, random_rows

pytestmark = pytest.mark.skipif(not warm_served_kernel(), reason="numba is not installed")


def _baseline(name: str, intercept: float, slope: float) -> dict[str, Any]:
    work = WORK_FEATURES[name]
    return {
        "kind": "linear",
        "features": list(work),
        "intercept": intercept,
        "coefficients": [slope] * len(work),
    }


def _regimes(seed: int) -> RegimeOffsets:
    return RegimeOffsets.of(DEFAULT_SCHEME, np.random.default_rng(seed).normal(0.0, 0.2, DEFAULT_SCHEME.size))


FORMS: dict[str, dict[str, Any]] = {
    "trained with baselines and regime offsets": {
        "calibration_offsets": {"ttft": 0.05, "tpot": -0.02},
        "baselines": {"ttft": _baseline("ttft", 12.0, 0.003), "tpot": _baseline("tpot", 8.0, 0.0007)},
        "regime_offsets": {"ttft": _regimes(1), "tpot": _regimes(2)},
    },
    "no baseline, no regimes": {"calibration_offsets": {"ttft": 0.1, "tpot": 0.0}},
    "mixed forms": {
        "target_transforms": {"ttft": "log1p", "tpot": "identity"},
        "baselines": {"ttft": _baseline("ttft", 3.0, 0.01), "tpot": None},
        "regime_offsets": {"ttft": None, "tpot": _regimes(3)},
    },
    "capped baselines (each term at its upper bound)": {
        "baselines": {
            "ttft": {
                **_baseline("ttft", 12.0, 0.003),
                "kind": PIECEWISE,
                "upper": [8.0, 5000.0, 2000.0, 20.0],
            },
            "tpot": {**_baseline("tpot", 8.0, 0.0007), "kind": PIECEWISE, "upper": [16.0, 3.0e38, 4000.5]},
        },
        "regime_offsets": {"ttft": _regimes(4), "tpot": None},
    },
    "kv-scaled baselines (terms times the cache's use beyond a knee)": {
        "baselines": {
            "ttft": {
                **_baseline("ttft", 12.0, 0.003),
                "features": [*WORK_FEATURES["ttft"], "prefill_work_tokens", "prefill_work_tokens"],
                "coefficients": [0.003] * 4 + [0.004, 0.07],
                "kind": SCALED,
                "upper": [8.0, 3.0e38, 2000.0, 3.0e38, 3.0e38, 9000.0],
                "scale_features": [None] * 4 + ["kv_cache_percentage"] * 2,
                "scale_from": [0.0] * 4 + [0.0, 0.9],
            },
            "tpot": {
                **_baseline("tpot", 8.0, 0.0007),
                "kind": SCALED,
                "upper": [3.0e38] * 3,
                "scale_features": ["kv_cache_percentage", None, "num_request_waiting"],
                "scale_from": [0.25, 0.0, 3.0],
            },
        },
        "regime_offsets": {"ttft": _regimes(5), "tpot": None},
    },
    "negative intercept (clipped baselines)": {
        "baselines": {"ttft": _baseline("ttft", -500.0, 0.001), "tpot": _baseline("tpot", -1e9, 0.0)},
    },
}


def _edge_rows(rng: np.random.Generator) -> RowMatrix:
    """Random rows plus every edge: zeros, the maxima, regime edges exactly, cached > prompt."""
    rows = random_rows(400, rng)
    for i, waiting in enumerate([0, 1, 2, 3, 4, 8, 16, 31, 32, 33, MAX_COUNT]):
        rows[i]["num_request_waiting"] = waiting
        rows[i]["kv_cache_percentage"] = [0.0, 0.9, 1.0, 0.25, 0.8999999][i % 5]
    for name in (
        "input_token_length",
        "num_request_running",
        "prefill_tokens_in_flight",
        "encoder_input_size",
    ):
        rows[20][name] = MAX_COUNT
        rows[21][name] = 0
    rows[22]["encoder_matched_size"], rows[22]["encoder_input_size"] = 5000, 10
    rows[23]["prefix_cache_score"], rows[24]["prefix_cache_score"] = 1.0, 0.0
    rows[25]["kv_cache_percentage"] = -0.0
    return from_columns(parse_rows(rows))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_served_kernel_gives_the_bits_of_the_reference_path(tmp_path: Path, form: str) -> None:
    store = ModelStore(tmp_path)
    publish_trained(store, seed=4, **FORMS[form])
    predictor = Predictor.from_model_set(store.load())
    assert isinstance(predictor.forests, JitForests)  # the kernel is warm: the JIT serves at once
    assert predictor.served.reproduced  # checked at load, off the hot path
    rows = _edge_rows(np.random.default_rng(9))
    expected = predictor.predict(build_features(to_columns(rows)))
    for size in (1, 7, 32, 33, 400):  # one block, a partial block, several blocks
        got = [
            predictor.predict_rows(RowMatrix(rows.numeric[i : i + size], rows.codes[i : i + size]))
            for i in range(0, 400, size)
        ]
        for k in (0, 1):
            served = np.concatenate([g[k] for g in got])
            assert np.array_equal(served.view(np.uint64), expected[k].view(np.uint64)), (form, size, k)
    assert predictor.served.reproduced, "the served kernel did not serve"


def test_the_builtin_prior_is_served_by_the_kernel_too() -> None:
    predictor = Predictor.from_model_set(builtin_prior_model_set(0.9))
    assert isinstance(predictor.forests, JitForests)  # the kernel is warm: the JIT serves at once
    rows = _edge_rows(np.random.default_rng(2))
    got = predictor.predict_rows(rows)
    expected = predictor.predict(build_features(to_columns(rows)))
    assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))
    assert predictor.served.reproduced


def test_a_kernel_that_does_not_reproduce_the_reference_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan that loses the calibration offset gives other bits on the probe rows: the
    reference path answers, with the right values."""
    real_plan = predictor_module.served_plan

    def wrong_plan(specs: Any) -> tuple[np.ndarray, np.ndarray]:
        ints, floats = real_plan(specs)
        floats = floats.copy()
        floats[:, 1] = 0.0  # F_CALIBRATION
        return ints, floats

    monkeypatch.setattr(predictor_module, "served_plan", wrong_plan)
    store = ModelStore(tmp_path)
    publish_trained(store, seed=5, calibration_offsets={"ttft": 0.3, "tpot": 0.2})
    predictor = Predictor.from_model_set(store.load())
    assert isinstance(predictor.forests, JitForests)  # the kernel is warm: the JIT serves at once
    rows = _edge_rows(np.random.default_rng(3))
    got = predictor.predict_rows(rows)
    assert not predictor.served.reproduced
    expected = predictor.predict(build_features(to_columns(rows)))
    assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))
