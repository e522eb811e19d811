"""The prediction server's model versions: parity with XGBoost, self-test, refusal, prior."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import xgboost as xgb

from prediction_server.predictor import (
    BUILTIN_PRIOR_VERSION,
    Predictor,
    SelfTestFailed,
    builtin_prior_model_set,
    probe_matrix,
)
from shared.artifacts import Manifest, ModelSpec, served_latency_ms, sha256_hex, utc_now_iso, verify_model_set
from shared.errors import ArtifactError
from shared.features import NUM_FEATURES, build_features
from shared.model_store import ModelStore
from shared.schemas import parse_rows
from tests.prediction_support import publish_trained, random_rows, train_models
from tests.procs import REPO_ROOT, wait_until


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    store = ModelStore(tmp_path_factory.mktemp("store"))
    publish_trained(
        store,
        seed=1,
        calibration_offsets={"ttft": 0.05, "tpot": -0.02},
        target_transforms={"ttft": "log1p", "tpot": "log1p"},
    )
    return store


@pytest.mark.parametrize("batch", [1, 7, 10, 100, 3000])
def test_predictions_equal_xgboost_own_predict_on_random_rows(store: ModelStore, batch: int) -> None:
    """Small batches go through the compiled forest, large ones through XGBoost: both must agree."""
    model_set = store.load()
    predictor = Predictor.from_model_set(model_set)
    features = build_features(parse_rows(random_rows(3000, np.random.default_rng(batch))))
    chunks = [predictor.predict(features[i : i + batch]) for i in range(0, len(features), batch)]
    ttft, tpot = (np.concatenate([chunk[k] for chunk in chunks]) for k in (0, 1))
    for name, got in (("ttft", ttft), ("tpot", tpot)):
        booster = xgb.Booster(model_file=bytearray(model_set.files[name]))
        margin = booster.predict(xgb.DMatrix(features), output_margin=True)
        expected = served_latency_ms(margin, features, model_set.manifest.models[name])
        # The margin is float32 in both; equal up to float32 rounding of the margin.
        np.testing.assert_allclose(got, expected, rtol=1e-6)
        assert got.dtype == np.float64 and (got > 0).all()


def test_trained_models_are_served_by_the_jit_evaluator(store: ModelStore) -> None:
    predictor = Predictor.from_model_set(store.load())  # at once, or once the kernel is loaded
    wait_until(lambda: predictor.evaluator == "numba-jit", lambda: predictor.evaluator, timeout_s=120)


def test_version_metadata_and_constant_prediction_fields(store: ModelStore) -> None:
    predictor = Predictor.from_model_set(store.load())
    assert predictor.version == store.current_version()
    assert predictor.kind == "trained" and predictor.objective_type == "quantile"
    assert predictor.quantile == 0.9
    assert predictor.loaded_at.tzinfo is not None
    assert predictor.prediction_constants == {
        "model_type": "xgboost",
        "objective_type": "quantile",
        "quantile": 0.9,
        "last_model_load": predictor.last_model_load,
        "model_version": predictor.version,
        "model_kind": "trained",
        "model_kinds": {"ttft": "trained", "tpot": "trained"},
    }


def test_builtin_prior_answers_positive_latencies_that_grow_with_load() -> None:
    predictor = Predictor.from_model_set(builtin_prior_model_set(0.9))
    assert predictor.version == BUILTIN_PRIOR_VERSION and predictor.kind == "prior"
    idle = {
        **random_rows(1, np.random.default_rng(0))[0],
        "num_request_waiting": 0,
        "kv_cache_percentage": 0.1,
    }
    busy = {**idle, "num_request_waiting": 50, "kv_cache_percentage": 0.9}
    ttft, tpot = predictor.predict(build_features(parse_rows([idle, busy])))
    assert (ttft > 0).all() and (tpot > 0).all()
    assert ttft[1] > ttft[0]


def test_self_test_refuses_a_version_whose_latencies_overflow() -> None:
    models = train_models(seed=2, rows=300, rounds=3)
    manifest = _manifest_for(models, calibration_offset=1e6)  # expm1(1e6) = inf
    with pytest.raises(SelfTestFailed, match="self-test failed"):
        Predictor.from_model_set(verify_model_set(manifest, models))


def test_a_model_for_other_features_is_refused() -> None:
    rng = np.random.default_rng(0)
    booster = xgb.train(
        {"nthread": 1}, xgb.DMatrix(rng.random((50, NUM_FEATURES - 3)), label=rng.random(50)), 2
    )
    raw = bytes(booster.save_raw("ubj"))
    models = {"ttft": raw, "tpot": raw}
    with pytest.raises(ArtifactError, match="features"):
        Predictor.from_model_set(verify_model_set(_manifest_for(models), models))


def test_bytes_that_are_not_a_model_are_refused_even_with_a_matching_checksum() -> None:
    models = {"ttft": b"{not a model", "tpot": b"\x00" * 64}
    with pytest.raises(ArtifactError, match="not a loadable XGBoost model"):
        Predictor.from_model_set(verify_model_set(_manifest_for(models), models))


def test_probe_matrix_is_fixed_and_covers_edge_rows() -> None:
    probe = probe_matrix()
    assert probe.shape[1] == NUM_FEATURES and probe.dtype == np.float32
    assert not probe.flags.writeable
    assert (probe[-2] == 0).all() and probe[-1].max() >= 1e6


def test_serving_imports_xgboost_without_pandas() -> None:
    code = (
        "import sys\n"
        "from shared.xgboost_import import import_xgboost\n"
        "xgb = import_xgboost()\n"
        "print(xgb.__version__, 'pandas' in sys.modules, 'sklearn' in sys.modules)\n"
        "import sklearn\n"  # the optional import is only skipped, not broken for later users
        "print(sklearn.__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [xgb.__version__, "False", "False", "sklearn"]


def _manifest_for(models: dict[str, bytes], calibration_offset: float = 0.0) -> Manifest:
    return Manifest(
        version="000009-trained",
        sequence=9,
        kind="trained",
        created_at=utc_now_iso(),
        objective="quantile",
        quantile=0.9,
        models={
            name: ModelSpec(
                file=f"{name}.ubj",
                sha256=sha256_hex(data),
                size_bytes=len(data),
                calibration_offset=calibration_offset,
            )
            for name, data in models.items()
        },
    )
