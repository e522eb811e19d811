"""Fitting the work-ahead baseline of ``shared.baseline`` (a linear quantile regression, numpy only).

The baseline is ``intercept + sum(slope_j * work_j)`` with non-negative slopes (more work ahead
never makes a request faster), fitted at the model's quantile by minimising the pinball loss with
iteratively reweighted least squares: each step solves a weighted least-squares problem whose
weights ``q / |r|`` (above) and ``(1 - q) / |r|`` (below the fit) make its squared loss equal the
pinball loss at the previous residuals ``r``; a slope that comes out negative is pinned to zero
for that step (active set). Features are scaled to unit maximum for the solver and the slopes
scaled back. The fit runs on an evenly spaced subsample of at most ``FIT_ROWS`` rows: a handful
of coefficients needs no more, and it costs tens of milliseconds however large the window.

Measured on 50,000 synthetic rows (2 busy cores): 20 IRLS steps on all rows took 0.31 s and reached
a pinball loss within 1 % of an exact linear programme (HiGHS), which took 0.2 s for 1,000 rows,
0.5 s for 2,000 and 2.1 s for 4,000; scikit-learn's ``QuantileRegressor`` solves the same
programme (without the sign constraint).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shared.baseline import BASELINE_KIND, WORK_FEATURES
from shared.features import FEATURE_NAMES

FIT_ROWS = 10_000
IRLS_STEPS = 30


def fit_baseline(
    model: str, features: np.ndarray, latency_ms: np.ndarray, quantile: float
) -> dict[str, Any] | None:
    """The baseline description for ``model`` fitted on these rows, or ``None`` if there are none."""
    names = WORK_FEATURES[model]
    n = len(latency_ms)
    if n == 0:
        return None
    rows = np.unique(np.linspace(0, n - 1, min(n, FIT_ROWS)).astype(np.int64))
    columns = np.array([FEATURE_NAMES.index(name) for name in names])
    x = features[np.ix_(rows, columns)].astype(np.float64)
    y = latency_ms[rows].astype(np.float64)
    # Relative pinball loss: each row weighs 1 / latency, so the slopes fit the typical request
    # rather than the few slowest ones (the trees correct the log-ratio around it).
    relative = 1.0 / np.maximum(y, max(1e-3, 0.01 * float(np.median(y))))
    intercept, slopes = quantile_regression_nonneg(x, y, quantile, relative)
    return {
        "kind": BASELINE_KIND,
        "features": list(names),
        "intercept": intercept,
        "coefficients": [float(v) for v in slopes],
    }


def quantile_regression_nonneg(
    x: np.ndarray,
    y: np.ndarray,
    quantile: float,
    sample_weight: np.ndarray | None = None,
    steps: int = IRLS_STEPS,
) -> tuple[float, np.ndarray]:
    """Intercept and non-negative slopes minimising the (weighted) mean pinball loss of ``y ~ x`` (IRLS)."""
    n, k = x.shape
    scale = np.maximum(np.abs(x).max(axis=0, initial=0.0), 1e-12)
    design = np.column_stack((np.ones(n), x / scale))
    floor = max(1e-9, 1e-3 * float(np.median(np.abs(y))))  # residuals below this weigh as this
    beta = np.zeros(k + 1)
    beta[0] = float(np.quantile(y, quantile))
    for _ in range(steps):
        residual = y - design @ beta
        weight = np.where(residual > 0, quantile, 1.0 - quantile) / np.maximum(np.abs(residual), floor)
        if sample_weight is not None:
            weight = weight * sample_weight
        beta = _nonneg_weighted_lstsq(design, y, weight)
    slopes = beta[1:] / scale
    if not np.isfinite(beta).all():
        return float(np.quantile(y, quantile)), np.zeros(k)
    return float(beta[0]), slopes


def _nonneg_weighted_lstsq(design: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Weighted least squares with the intercept free and every slope >= 0 (drop the most negative)."""
    active = np.ones(design.shape[1], dtype=bool)
    while True:
        a = design[:, active]
        weighted = (a * weight[:, None]).T
        solved = np.linalg.lstsq(weighted @ a, weighted @ y, rcond=None)[0]
        beta = np.zeros(design.shape[1])
        beta[active] = solved
        negative = np.flatnonzero(beta[1:] < 0) + 1
        if len(negative) == 0:
            return beta
        active[negative[np.argmin(beta[negative])]] = False
