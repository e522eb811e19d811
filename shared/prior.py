"""The prior model set: sensible positive predictions before any sample has arrived.

Schedulers send traffic as soon as they start, so something must answer from the first
call. The prior is an analytic latency model of a continuous-batching server, fitted
into small XGBoost models (same format, same serving path as trained models) on a
deterministic synthetic grid. It is conservative: it ranks idle, cache-warm pods ahead
of loaded ones, which is what routing needs before real data exists.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from shared.artifacts import TargetTransform, to_margin_target
from shared.features import build_features
from shared.model_store import ModelStore
from shared.wire_fields import Columns
from shared.xgboost_import import import_xgboost

PRIOR_SEED = 20261130
PRIOR_ROWS = 12_000


def prior_latency_ms(columns: Columns, quantile: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """Analytic TTFT and TPOT (ms) for feature columns, scaled towards the requested quantile."""
    uncached = columns["input_token_length"] * (1.0 - columns["prefix_cache_score"])
    waiting = columns["num_request_waiting"]
    running = columns["num_request_running"]
    kv = columns["kv_cache_percentage"]
    ttft = (
        20.0
        + 0.06 * uncached
        + 0.02 * columns["prefill_tokens_in_flight"]
        + waiting * (40.0 + 60.0 * kv)
        + 1.5 * running
    )
    tpot = 8.0 + 0.5 * running + 12.0 * kv + 0.0004 * columns["decode_tokens_in_flight"]
    # Multiplicative spread of a log-normal with sigma 0.35, at the requested quantile.
    z = _normal_ppf(quantile)
    spread = float(np.exp(0.35 * z))
    return ttft * spread, tpot * spread


def synthetic_columns(rows: int, rng: np.random.Generator) -> Columns:
    """Random pod states covering the ranges schedulers report."""
    return {
        "kv_cache_percentage": rng.uniform(0, 1, rows),
        "input_token_length": np.floor(np.exp(rng.uniform(np.log(1), np.log(32_000), rows))),
        "num_request_waiting": np.floor(np.exp(rng.uniform(0, np.log(200), rows)) - 1),
        "num_request_running": np.floor(rng.uniform(0, 256, rows)),
        "num_tokens_generated": np.ones(rows),
        "prefix_cache_score": np.where(rng.uniform(size=rows) < 0.3, 0.0, rng.uniform(0, 1, rows)),
        "pod_type": rng.integers(0, 3, rows).astype(np.float64),
        "prefill_tokens_in_flight": np.floor(np.exp(rng.uniform(0, np.log(64_000), rows)) - 1),
        "decode_tokens_in_flight": np.floor(np.exp(rng.uniform(0, np.log(500_000), rows)) - 1),
        "encoder_matched_size": np.zeros(rows),
        "encoder_input_size": np.zeros(rows),
    }


def build_prior_models(quantile: float = 0.9) -> tuple[dict[str, bytes], dict[str, TargetTransform]]:
    """Fit the prior into XGBoost models; returns native UBJSON bytes and target transforms."""
    xgb = import_xgboost()  # lazily: schema-only users of shared need not load it

    rng = np.random.default_rng(PRIOR_SEED)
    columns = synthetic_columns(PRIOR_ROWS, rng)
    features = build_features(columns)
    targets = dict(zip(("ttft", "tpot"), prior_latency_ms(columns, quantile), strict=True))
    models: dict[str, bytes] = {}
    for name, target in targets.items():
        booster = xgb.train(
            {
                "objective": "reg:squarederror",
                "max_depth": 6,
                "eta": 0.3,
                "nthread": 1,
                "seed": 0,
                "tree_method": "hist",
            },
            xgb.DMatrix(features, label=to_margin_target(target, "log1p")),
            num_boost_round=60,
        )
        models[name] = bytes(booster.save_raw("ubj"))
    return models, {"ttft": "log1p", "tpot": "log1p"}


def publish_prior(store: ModelStore, quantile: float = 0.9, objective: str = "quantile") -> str:
    """Publish the prior as a new version of ``store`` (used when the store is empty)."""
    xgb = import_xgboost()

    models, transforms = build_prior_models(quantile)
    manifest = store.publish(
        "prior",
        models,
        objective="mean" if objective == "mean" else "quantile",
        quantile=quantile,
        target_transforms=transforms,
        training_samples={"ttft": 0, "tpot": 0},
        metrics={"note": "analytic prior; no samples seen yet"},
        xgboost_version=xgb.__version__,
    )
    return manifest.version


def _normal_ppf(p: float) -> float:
    """Inverse standard normal CDF, clamped away from 0 and 1."""
    return NormalDist().inv_cdf(min(max(p, 1e-6), 1 - 1e-6))
