"""Parity of CompiledForest with XGBoost's own margin predictions, and its refusals."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import xgboost as xgb

from prediction_server.trees import CompiledForest

NUM_FEATURES = 12


def _training_data(seed: int = 0, n: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)
    y = 3 * X[:, 0] + np.sin(2 * X[:, 1]) + X[:, 2] * X[:, 3] + rng.exponential(size=n)
    # Missing values in training make XGBoost learn both default directions.
    X[rng.random(X.shape) < 0.1] = np.nan
    return X, y


@cache
def _model(objective: str, max_depth: int, rounds: int = 40) -> xgb.Booster:
    X, y = _training_data()
    params: dict[str, Any] = {
        "objective": objective,
        "tree_method": "hist",
        "max_depth": max_depth,
        "learning_rate": 0.3,
        "nthread": 1,
    }
    if objective == "reg:quantileerror":
        params["quantile_alpha"] = 0.9
    return xgb.train(params, xgb.DMatrix(X, y), num_boost_round=rounds)


def _split_points(booster: xgb.Booster) -> list[tuple[int, float]]:
    pairs = []
    for tree in orjson.loads(booster.save_raw("json"))["learner"]["gradient_booster"]["model"]["trees"]:
        for left, feature, threshold in zip(
            tree["left_children"], tree["split_indices"], tree["split_conditions"], strict=True
        ):
            if left != -1:
                pairs.append((feature, threshold))
    return pairs


def _query_rows(booster: xgb.Booster, seed: int = 1) -> np.ndarray:
    """Ordinary, missing, extreme and exactly-on-threshold rows."""
    rng = np.random.default_rng(seed)
    ordinary = rng.normal(size=(300, NUM_FEATURES)).astype(np.float32)
    with_nan = rng.normal(size=(300, NUM_FEATURES)).astype(np.float32)
    with_nan[rng.random(with_nan.shape) < 0.3] = np.nan
    all_nan = np.full((1, NUM_FEATURES), np.nan, dtype=np.float32)
    extreme = rng.choice(np.array([-1e30, -1e6, 1e6, 1e30], dtype=np.float32), size=(50, NUM_FEATURES))
    splits = _split_points(booster)
    picks = rng.choice(len(splits), size=min(200, len(splits)), replace=False)
    on_threshold = rng.normal(size=(3 * picks.size, NUM_FEATURES)).astype(np.float32)
    for i, pick in enumerate(picks):
        feature, threshold = splits[pick]
        t = np.float32(threshold)
        # x == t goes right in XGBoost; the float32 neighbours pin down the comparison.
        for j, value in enumerate(
            (t, np.nextafter(t, np.float32(-np.inf)), np.nextafter(t, np.float32(np.inf)))
        ):
            on_threshold[3 * i + j, feature] = value
    return np.ascontiguousarray(np.concatenate([ordinary, with_nan, all_nan, extreme, on_threshold]))


def _xgb_margin(booster: xgb.Booster, X: np.ndarray) -> np.ndarray:
    return booster.inplace_predict(X, predict_type="margin")


MODELS = [
    ("reg:quantileerror", 2),
    ("reg:quantileerror", 6),
    ("reg:squarederror", 4),
    ("reg:squarederror", 8),
]


@pytest.mark.parametrize(("objective", "max_depth"), MODELS)
def test_margins_match_xgboost(objective: str, max_depth: int) -> None:
    booster = _model(objective, max_depth)
    forest = CompiledForest.from_booster(booster)
    X = _query_rows(booster)

    ours = forest.predict_margin(X)

    assert ours.dtype == np.float32 and ours.shape == (X.shape[0],)
    np.testing.assert_allclose(ours, _xgb_margin(booster, X), rtol=1e-5, atol=1e-5)
    finite = X[~np.isinf(X).any(axis=1)]  # DMatrix refuses inf unless it is the missing value
    dmatrix = booster.predict(xgb.DMatrix(finite), output_margin=True)
    np.testing.assert_allclose(forest.predict_margin(finite), dmatrix, rtol=1e-5, atol=1e-5)
    assert forest.num_features == NUM_FEATURES
    assert forest.num_trees == 40


@pytest.mark.parametrize(("objective", "max_depth"), MODELS)
def test_margins_are_bit_identical(objective: str, max_depth: int) -> None:
    # Leaves are summed in float32 in tree order onto base_score, as XGBoost's CPU predictor does.
    booster = _model(objective, max_depth)
    X = _query_rows(booster, seed=2)

    np.testing.assert_array_equal(
        CompiledForest.from_booster(booster).predict_margin(X), _xgb_margin(booster, X)
    )


def test_infinite_inputs_are_values_not_missing() -> None:
    booster = _model("reg:squarederror", 4)
    rng = np.random.default_rng(3)
    X = rng.choice(np.array([-np.inf, np.inf, np.nan, 0.0], dtype=np.float32), size=(100, NUM_FEATURES))

    np.testing.assert_array_equal(
        CompiledForest.from_booster(booster).predict_margin(X), _xgb_margin(booster, X)
    )


@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 5000])
def test_any_batch_size(n: int) -> None:
    # 5000 rows spans several internal row blocks; 1 row exercises the degenerate (trees, 1) shape.
    booster = _model("reg:quantileerror", 6)
    X = np.random.default_rng(n).normal(size=(n, NUM_FEATURES)).astype(np.float32)

    ours = CompiledForest.from_booster(booster).predict_margin(X)

    assert ours.shape == (n,)
    np.testing.assert_array_equal(ours, _xgb_margin(booster, X))


def test_single_row_calls_are_bit_identical() -> None:
    # One row makes the (trees, 1) sum contiguous, where np.sum would switch to pairwise order.
    booster = _model("reg:quantileerror", 6, rounds=120)
    forest = CompiledForest.from_booster(booster)
    X = _query_rows(booster)[::7]

    ours = np.concatenate([forest.predict_margin(row[None, :]) for row in X])

    np.testing.assert_array_equal(ours, _xgb_margin(booster, X))


def test_accepts_float64_and_non_contiguous_input() -> None:
    booster = _model("reg:squarederror", 4)
    wide = np.random.default_rng(4).normal(size=(50, 2 * NUM_FEATURES))
    X = wide[:, ::2]

    ours = CompiledForest.from_booster(booster).predict_margin(X)

    np.testing.assert_array_equal(ours, _xgb_margin(booster, np.ascontiguousarray(X, dtype=np.float32)))


def test_single_leaf_trees() -> None:
    # A constant target offers no split gain, so every tree is one leaf; base_score=0 keeps the
    # leaves non-zero. Then deeper trees are appended so the forest mixes depths 0 and 5.
    X, _ = _training_data()
    y = np.full(X.shape[0], 5.0)
    params: dict[str, Any] = {"tree_method": "hist", "base_score": 0.0, "nthread": 1}
    stumps = xgb.train(params, xgb.DMatrix(X, y), num_boost_round=5)
    stump_json = orjson.loads(stumps.save_raw("json"))["learner"]["gradient_booster"]["model"]["trees"]
    assert all(tree["left_children"] == [-1] for tree in stump_json)
    _, y_varied = _training_data()
    mixed = xgb.train(
        {**params, "max_depth": 5}, xgb.DMatrix(X, y_varied), num_boost_round=5, xgb_model=stumps
    )
    Q = _query_rows(mixed)

    for booster in (stumps, mixed):
        forest = CompiledForest.from_booster(booster)
        np.testing.assert_array_equal(forest.predict_margin(Q), _xgb_margin(booster, Q))
    assert CompiledForest.from_booster(stumps).max_depth == 0


def _planted_special_model() -> tuple[dict[str, Any], xgb.Booster, np.ndarray]:
    """A model whose split thresholds are planted on signed zeros, subnormals and extremes (hist
    training rarely splits exactly on them), XGBoost's own booster of it, and query rows on, just
    below and just above each, plus NaN and +-inf. They stress the float -> integer key mapping."""
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1.2e-38, -1.2e-38, 3.4e38, -3.4e38, 0.5], np.float32)
    model = orjson.loads(_model("reg:squarederror", 4).save_raw("json"))
    planted = 0
    for tree in model["learner"]["gradient_booster"]["model"]["trees"]:
        for node, left in enumerate(tree["left_children"]):
            if left != -1:
                tree["split_conditions"][node] = float(special[planted % special.size])
                planted += 1
    edited = xgb.Booster(model_file=bytearray(orjson.dumps(model)))
    neighbours = np.concatenate(
        [special, np.nextafter(special, np.float32(-np.inf)), np.nextafter(special, np.float32(np.inf))]
    )
    values = np.concatenate([neighbours, np.array([np.nan, np.inf, -np.inf], np.float32)])
    return model, edited, np.random.default_rng(6).choice(values, size=(2000, NUM_FEATURES))


def test_thresholds_on_signed_zero_subnormals_and_extremes() -> None:
    model, edited, X = _planted_special_model()
    np.testing.assert_array_equal(
        CompiledForest.from_json_bytes(orjson.dumps(model)).predict_margin(X), _xgb_margin(edited, X)
    )


def test_unused_features_do_not_matter() -> None:
    rng = np.random.default_rng(5)
    X = rng.normal(size=(1000, NUM_FEATURES)).astype(np.float32)
    booster = xgb.train(
        {"tree_method": "hist", "max_depth": 2, "nthread": 1}, xgb.DMatrix(X, 2 * X[:, 0]), num_boost_round=10
    )
    forest = CompiledForest.from_booster(booster)
    Q = rng.normal(size=(20, NUM_FEATURES)).astype(np.float32)
    scrambled = Q.copy()
    scrambled[:, 1:] = np.nan

    np.testing.assert_array_equal(forest.predict_margin(scrambled), forest.predict_margin(Q))
    np.testing.assert_array_equal(forest.predict_margin(Q), _xgb_margin(booster, Q))


@pytest.mark.parametrize("suffix", ["json", "ubj"])
def test_saved_model_round_trip(tmp_path: Path, suffix: str) -> None:
    booster = _model("reg:quantileerror", 6)
    path = tmp_path / f"model.{suffix}"
    booster.save_model(path)
    X = _query_rows(booster)

    forest = CompiledForest.from_json_bytes(path.read_bytes())

    np.testing.assert_array_equal(forest.predict_margin(X), _xgb_margin(booster, X))


def test_tables_are_read_only() -> None:
    forest = CompiledForest.from_booster(_model("reg:squarederror", 4))

    with pytest.raises(ValueError, match="read-only"):
        forest._step[0] = 0


def _train(params: dict[str, Any], y: np.ndarray | None = None) -> xgb.Booster:
    X, y_default = _training_data(n=300)
    dtrain = xgb.DMatrix(X, y_default if y is None else y)
    return xgb.train({"nthread": 1, **params}, dtrain, num_boost_round=2)


@pytest.mark.parametrize(
    ("make_booster", "message"),
    [
        (lambda: _train({"objective": "reg:quantileerror", "quantile_alpha": [0.1, 0.9]}), "multi-output"),
        (
            lambda: _train({"objective": "multi:softprob", "num_class": 3}, y=np.arange(300) % 3),
            "multi-output",
        ),
        (lambda: _train({"objective": "binary:logistic"}, y=np.arange(300) % 2), "objective"),
        (lambda: _train({"booster": "gblinear"}), "gbtree"),
        (lambda: _train({"booster": "dart"}), "gbtree"),
    ],
    ids=["multi-quantile", "multiclass", "logistic", "gblinear", "dart"],
)
def test_unsupported_models_are_refused(make_booster: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CompiledForest.from_booster(make_booster())


def test_categorical_splits_are_refused() -> None:
    X, _ = _training_data(n=300)
    X[:, 0] = np.abs(np.nan_to_num(X[:, 0])).round()
    y = X[:, 0] * 10
    booster = xgb.train(
        {"nthread": 1, "max_depth": 2, "tree_method": "hist"},
        xgb.DMatrix(X, y, feature_types=["c"] + ["q"] * (NUM_FEATURES - 1), enable_categorical=True),
        num_boost_round=2,
    )
    trees = orjson.loads(booster.save_raw("json"))["learner"]["gradient_booster"]["model"]["trees"]
    assert any(any(kind != 0 for kind in tree["split_type"]) for tree in trees)  # really categorical
    with pytest.raises(ValueError, match="categorical"):
        CompiledForest.from_booster(booster)


@pytest.mark.parametrize("raw", [b"", b"not json", b"{}", b'{"learner": {}}', b"[1, 2]", b"{L\x00garbage"])
def test_garbage_model_bytes_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        CompiledForest.from_json_bytes(raw)


def _corrupt_root(field: str, value: Any) -> Any:
    def corrupt(tree: dict[str, Any]) -> None:
        tree[field][0] = value

    return corrupt


def _share_children(tree: dict[str, Any]) -> None:
    tree["right_children"][0] = tree["left_children"][0]


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_corrupt_root("left_children", 10_000), "out of range"),
        (_share_children, "not a tree"),
        (_corrupt_root("split_indices", NUM_FEATURES), "feature index"),
        (_corrupt_root("split_conditions", float("nan")), "non-finite"),
    ],
    ids=["child-range", "shared-child", "feature-range", "nan-threshold"],
)
def test_corrupt_trees_are_refused(corrupt: Any, message: str) -> None:
    model = orjson.loads(_model("reg:squarederror", 4).save_raw("json"))
    corrupt(model["learner"]["gradient_booster"]["model"]["trees"][3])

    with pytest.raises(ValueError, match=message):
        CompiledForest.from_json_bytes(orjson.dumps(model))


def test_wrong_feature_count_is_refused() -> None:
    forest = CompiledForest.from_booster(_model("reg:squarederror", 4))

    with pytest.raises(ValueError, match=f"\\(n, {NUM_FEATURES}\\)"):
        forest.predict_margin(np.zeros((3, NUM_FEATURES + 1), dtype=np.float32))
    with pytest.raises(ValueError):
        forest.predict_margin(np.zeros(NUM_FEATURES, dtype=np.float32))
