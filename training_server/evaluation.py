"""Evaluation and calibration of latency models (numpy only).

Metrics are computed in milliseconds on held-out samples: coverage (share of actual
values at or below the prediction), pinball loss at the target quantile, MAPE, and for the
mean objective the squared error. ``loss`` is the single number the publish guard compares.

Calibration is split-conformal on the model margin: with residuals ``r = target - margin``
on a calibration split, adding the ``ceil((n + 1) q) / n`` empirical quantile of ``r`` to
every margin makes ``P(actual <= prediction) >= q`` on exchangeable data, and at most
``q + 1/(n + 1)`` in expectation. The offset goes into ``ModelSpec.calibration_offset``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shared.artifacts import Objective
from training_server.window import stratum_label

MIN_STRATUM_EVAL = 10  # strata with fewer held-out samples are too noisy to report


def pinball_loss(actual: np.ndarray, predicted: np.ndarray, quantile: float) -> np.ndarray:
    """Per-sample pinball (quantile) loss."""
    diff = actual - predicted
    return np.maximum(quantile * diff, (quantile - 1.0) * diff)


def conformal_offset(residuals: np.ndarray, quantile: float) -> float:
    """Smallest additive margin offset that covers a ``quantile`` share of calibration residuals."""
    n = len(residuals)
    if n == 0:
        return 0.0
    k = min(n, math.ceil((n + 1) * quantile))
    return float(np.partition(residuals, k - 1)[k - 1])


def mean_offset(target: np.ndarray, margin: np.ndarray) -> float:
    """Offset on a log1p margin that makes the mean prediction match the mean actual (smearing)."""
    log_ratio = np.log1p(np.expm1(target).mean()) - np.log(np.exp(margin).mean())
    return float(log_ratio) if np.isfinite(log_ratio) else 0.0


def loss(actual: np.ndarray, predicted: np.ndarray, objective: Objective, quantile: float) -> float:
    """The guard's score (lower is better): mean pinball loss, or mean squared error for ``mean``."""
    if objective == "mean":
        return float(np.mean((actual - predicted) ** 2))
    return float(pinball_loss(actual, predicted, quantile).mean())


def evaluate(
    actual: np.ndarray,
    predicted: np.ndarray,
    strata: np.ndarray,
    objective: Objective,
    quantile: float,
) -> dict[str, Any]:
    """Overall metrics plus metrics per stratum (strata with >= MIN_STRATUM_EVAL samples)."""
    covered = (actual <= predicted).astype(np.float64)
    pinball = pinball_loss(actual, predicted, quantile)
    ape = np.abs(actual - predicted) / np.maximum(actual, 1e-9)
    overall: dict[str, Any] = {
        "samples": len(actual),
        "coverage": float(covered.mean()),
        "pinball_loss_ms": float(pinball.mean()),
        "mape": float(ape.mean()),
        "loss": loss(actual, predicted, objective, quantile),
    }
    if objective == "mean":
        overall["rmse_ms"] = math.sqrt(float(np.mean((actual - predicted) ** 2)))
    ids, inverse, counts = np.unique(strata, return_inverse=True, return_counts=True)
    per_stratum: dict[str, dict[str, float | int]] = {}
    cov_sum = np.bincount(inverse, weights=covered)
    pin_sum = np.bincount(inverse, weights=pinball)
    ape_sum = np.bincount(inverse, weights=ape)
    for i, stratum in enumerate(ids.tolist()):
        if counts[i] >= MIN_STRATUM_EVAL:
            per_stratum[stratum_label(stratum)] = {
                "samples": int(counts[i]),
                "coverage": float(cov_sum[i] / counts[i]),
                "pinball_loss_ms": float(pin_sum[i] / counts[i]),
                "mape": float(ape_sum[i] / counts[i]),
            }
    return {"overall": overall, "per_stratum": per_stratum}
