"""The trees of a retrain: XGBoost's parameters, a fit around the baseline, a cross-conformal margin.

Every model is an XGBoost quantile (or mean) regression on log1p(latency), fitted with the
baseline's log1p as ``base_margin`` (``shared.artifacts.base_margin``), so the trees learn the
log-ratio around a latency that keeps growing with the work, and constrained to be monotone where
physics says so (``MONOTONE_INCREASING``). A fit stops at the next boosting round once the
trainer's ``stop`` event is set (the service is shutting down) and raises ``TrainingCancelled``.
``training_server.trainer`` decides what to fit on and what to publish.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import xgboost as xgb

from shared.features import FEATURE_NAMES
from training_server import evaluation
from training_server.config import TrainingSettings

# Features that never lower the prediction when they grow (XGBoost monotone constraints):
# more queued or in-flight prefill work never makes TTFT shorter; more running decode work (or
# more requests in the pod, queue_depth) never makes TPOT shorter. The baseline's slopes are
# non-negative too, so the served value is monotone in these features.
MONOTONE_INCREASING: dict[str, tuple[str, ...]] = {
    "ttft": (
        "num_request_waiting",
        "prefill_tokens_in_flight",
        "uncached_input_tokens",
        "queue_depth",
        "prefill_work_tokens",
    ),
    "tpot": ("num_request_running", "decode_tokens_in_flight", "queue_depth"),
}
CROSS_FOLDS = 5  # folds of a cross-conformal calibration (``TreeFitter.cross_conformal_margin``)
MIN_TAIL_SAMPLES = 5  # samples a leaf needs beyond its quantile for that quantile to mean anything


class TrainingCancelled(Exception):
    """The service is shutting down; the run stopped without publishing."""


def params(settings: TrainingSettings, model: str | None = None) -> dict[str, Any]:
    """XGBoost parameters; with ``model``, its monotone constraints too."""
    s = settings
    out: dict[str, Any] = {
        "tree_method": "hist",
        "max_depth": s.max_depth,
        "eta": s.learning_rate,
        "max_bin": s.max_bin,
        "min_child_weight": min_leaf_samples(s.objective, s.quantile),
        "nthread": s.training_threads,
        "seed": 0,
        "verbosity": 0,
        # The margin is trees only: the baseline (or nothing) comes in as base_margin, so
        # serving adds served_latency_ms's base margin to exactly what was trained around.
        "base_score": 0.0,
    }
    if s.monotone_constraints and model is not None:
        out["monotone_constraints"] = monotone_constraints(model)
    if s.objective == "quantile":
        out.update(objective="reg:quantileerror", quantile_alpha=s.quantile)
    else:
        out["objective"] = "reg:squarederror"
    return out


class TreeFitter:
    """Fits ``settings``' trees; every fit stops at the next round once ``stop`` is set."""

    def __init__(self, settings: TrainingSettings, stop: threading.Event) -> None:
        self.settings = settings
        self.stop = stop

    def boost(
        self, name: str, x: np.ndarray, target: np.ndarray, weight: np.ndarray | None, base: np.ndarray
    ) -> xgb.Booster:
        """Trees for ``name`` on rows ``x`` (log1p targets), around the baseline's margin ``base``."""
        s = self.settings
        dtrain = xgb.QuantileDMatrix(
            x,
            label=target,
            weight=weight,
            base_margin=base,
            max_bin=s.max_bin,
            nthread=s.training_threads,
        )
        booster = xgb.train(
            params(s, name), dtrain, num_boost_round=s.n_estimators, callbacks=[_StopWhenSet(self.stop)]
        )
        if self.stop.is_set():
            raise TrainingCancelled()
        return booster

    def cross_conformal_margin(
        self, name: str, x: np.ndarray, target: np.ndarray, weight: np.ndarray | None, base: np.ndarray
    ) -> np.ndarray:
        """The trees' margin on each row of ``x`` (time-ordered) from trees fitted without it.

        The rows are cut into ``CROSS_FOLDS`` folds, each made of short runs spread over the whole
        span (``evaluation.fold_ids``, as the calibration split is); each fold is predicted by trees
        fitted on the others (cross-conformal, Vovk 2015; CV+, Barber, Candes, Ramdas and
        Tibshirani 2021), around the same baseline, fitted on all of them: a handful of slopes,
        whose optimism on the rows they saw is small beside the trees'. A small window's split
        calibrates on a handful of samples, whose conformal offset is their largest residual or
        nearly: the sharegpt H200 trace's first 550 entries hold two stalls (13 requests waited
        1.4-5.1 s with no queue and an empty cache, against a median of 65 ms), and a split of
        about 15 samples gave a first TTFT model an offset of 3.1 in log units (22x).
        """
        fold = evaluation.fold_ids(len(x), CROSS_FOLDS)
        margin = np.empty(len(x))
        for k in range(CROSS_FOLDS):
            inside = fold != k
            fold_weight = None if weight is None else weight[inside]
            booster = self.boost(name, x[inside], target[inside], fold_weight, base[inside])
            margin[~inside] = predict_margin(booster, x[~inside])
        return margin


def predict_margin(booster: xgb.Booster, x: np.ndarray) -> np.ndarray:
    """The trees' raw margin on rows ``x`` (float64, without any base margin): what
    ``shared.artifacts.served_latency_ms`` turns into a served value."""
    return np.asarray(booster.inplace_predict(x, predict_type="margin"), dtype=np.float64)


def min_leaf_samples(objective: str, quantile: float) -> int:
    """XGBoost's ``min_child_weight``: the fewest samples per leaf (the hessian is 1 per sample).

    A quantile leaf's value is the q-quantile of its samples' residuals, so it needs
    ``MIN_TAIL_SAMPLES`` samples beyond that quantile: 50 for p90 instead of a flat 5, which let
    p90 leaves follow single samples (docs/accuracy-history.md: lower pinball loss for both
    models on the simulator).
    """
    if objective != "quantile":
        return MIN_TAIL_SAMPLES
    return math.ceil(MIN_TAIL_SAMPLES / min(quantile, 1.0 - quantile) - 1e-9)


def monotone_constraints(model: str) -> str:
    """XGBoost's ``monotone_constraints`` for ``model``: +1 for ``MONOTONE_INCREASING`` features."""
    increasing = MONOTONE_INCREASING[model]
    return "(" + ",".join("1" if name in increasing else "0" for name in FEATURE_NAMES) + ")"


class _StopWhenSet(xgb.callback.TrainingCallback):
    def __init__(self, stop: threading.Event) -> None:
        super().__init__()
        self._stop = stop

    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        return self._stop.is_set()
