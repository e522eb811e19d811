"""Evaluation and calibration of latency models (numpy only).

Metrics are computed in milliseconds on held-out samples: coverage (share of actual
values at or below the prediction), pinball loss at the target quantile, MAPE, and for the
mean objective the squared error. ``loss`` is the single number the publish guard compares.

Calibration is split-conformal on the model margin: with residuals ``r = target - margin``
on a calibration split, adding the ``ceil((n + 1) q) / n`` empirical quantile of ``r`` to
every margin makes ``P(actual <= prediction) >= q`` on exchangeable data, and at most
``q + 1/(n + 1)`` in expectation. The offset goes into ``ModelSpec.calibration_offset``.

Latency samples are not exchangeable in time: bursts of traffic raise the latency of every
request for seconds at a time, and the routing-time features cannot see the burst that is
still to come. A calibration split taken as one contiguous stretch (say, the newest samples)
therefore holds one regime, a lull or a burst, and its offset swings from version to version
with whatever that stretch happened to be. ``calibration_mask`` instead spreads the split over
the whole window, in many short runs, so the offset reflects the mix of regimes that the served
version will meet.

The publish guard (``compare_paired``) compares the candidate's and the current model's
per-sample losses on the same held-out samples, the newest ones. Their difference is averaged
over contiguous blocks of held-out time (latency errors come in bursts, so single samples are not
independent; block means nearly are), and a one-sided bound at the configured confidence decides:
the candidate is refused only when it is worse with confidence; when the current model is worse
with confidence the newest traffic has moved away from it and the candidate wins; in between the
two are equal within noise and the candidate, trained on fresher data, is published.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from shared.artifacts import Objective
from training_server.window import stratum_label

MIN_STRATUM_EVAL = 10  # strata with fewer held-out samples are too noisy to report
CALIBRATION_RUNS = 40  # runs the calibration split is spread over (see calibration_mask)
GUARD_BLOCKS = 20  # contiguous blocks of held-out time the guard averages over (see compare_paired)


def pinball_loss(actual: np.ndarray, predicted: np.ndarray, quantile: float) -> np.ndarray:
    """Per-sample pinball (quantile) loss."""
    diff = actual - predicted
    return np.maximum(quantile * diff, (quantile - 1.0) * diff)


def conformal_offset(residuals: np.ndarray, quantile: float, weights: np.ndarray | None = None) -> float:
    """Smallest additive margin offset that covers a ``quantile`` share of calibration residuals.

    With ``weights`` (> 0, one per residual), the share is weighted, with weight 1 for the point
    being predicted (the newest): weighted conformal prediction (Barber, Candes, Ramdas and
    Tibshirani 2023), which keeps its coverage guarantee up to the weighted drift when the stream
    is not exchangeable; recency weights let the offset follow the newest residuals.
    """
    n = len(residuals)
    if n == 0:
        return 0.0
    if weights is not None:
        order = np.argsort(residuals, kind="stable")
        share = np.cumsum(weights[order]) / (float(np.sum(weights)) + 1.0)
        return float(residuals[order[min(int(np.searchsorted(share, quantile)), n - 1)]])
    k = min(n, math.ceil((n + 1) * quantile))
    return float(np.partition(residuals, k - 1)[k - 1])


def calibration_mask(n: int, n_cal: int, runs: int = CALIBRATION_RUNS) -> np.ndarray:
    """Which of ``n`` time-ordered samples form the calibration split: ``n_cal`` of them.

    The span is cut into ``runs`` equal segments and the newest rows of each segment calibrate,
    the older ones train. Calibration thus samples every part of the window (each run is predicted
    by a model trained on the data around it and before it), instead of only its newest stretch.
    """
    n_cal = max(0, min(n_cal, n))
    runs = max(1, min(runs, n_cal))
    position = np.arange(n)
    segment = _segments(n, runs)
    segment_end = np.cumsum(np.bincount(segment, minlength=runs))
    quota = np.bincount(np.arange(n_cal) * runs // max(n_cal, 1), minlength=runs)
    rank_from_newest = segment_end[segment] - position  # 1 for the newest row of its segment
    return np.asarray(rank_from_newest <= quota[segment])


def fold_ids(n: int, folds: int, runs: int = CALIBRATION_RUNS) -> np.ndarray:
    """The fold (0 to ``folds - 1``) of each of ``n`` time-ordered samples for cross-conformal
    calibration: the span is cut into ``runs`` equal segments, dealt to the folds in turn, so each
    fold samples every part of the window, in short runs (as ``calibration_mask``'s split does)."""
    return _segments(n, max(folds, min(runs, n))) % folds


def _segments(n: int, runs: int) -> np.ndarray:
    """The segment (0 to ``runs - 1``) of each of ``n`` time-ordered samples: ``runs`` equal spans."""
    return np.arange(n) * runs // max(n, 1)


def mean_offset(target: np.ndarray, margin: np.ndarray) -> float:
    """Offset on a log1p margin that makes the mean prediction match the mean actual (smearing)."""
    log_ratio = np.log1p(np.expm1(target).mean()) - np.log(np.exp(margin).mean())
    return float(log_ratio) if np.isfinite(log_ratio) else 0.0


def sample_losses(
    actual: np.ndarray, predicted: np.ndarray, objective: Objective, quantile: float
) -> np.ndarray:
    """Per-sample guard loss (lower is better): pinball loss, or squared error for ``mean``."""
    if objective == "mean":
        return np.asarray((actual - predicted) ** 2, dtype=np.float64)
    return pinball_loss(actual, predicted, quantile)


def loss(actual: np.ndarray, predicted: np.ndarray, objective: Objective, quantile: float) -> float:
    """The guard's score (lower is better): mean pinball loss, or mean squared error for ``mean``."""
    return float(sample_losses(actual, predicted, objective, quantile).mean())


@dataclass(frozen=True)
class GuardDecision:
    """The publish guard's verdict on one candidate (see ``compare_paired``)."""

    accepted: bool
    verdict: str  # "better" | "equal" | "worse": the candidate, with confidence or within noise
    candidate_loss: float
    current_loss: float
    bound_low: float  # one-sided bounds on mean(candidate - current), in loss units
    bound_high: float

    @property
    def reason(self) -> str:
        return (
            f"held-out loss {self.candidate_loss:.4g} vs current {self.current_loss:.4g}: candidate "
            f"{self.verdict} (difference in [{self.bound_low:.3g}, {self.bound_high:.3g}])"
        )


def compare_paired(
    candidate: np.ndarray,
    current: np.ndarray,
    confidence: float,
    tolerance: float = 0.0,
    blocks: int = GUARD_BLOCKS,
) -> GuardDecision:
    """Paired comparison of per-sample losses on the same time-ordered held-out samples.

    ``d = candidate - (1 + tolerance) * current`` is averaged per contiguous block; with the block
    means' standard error ``se`` and ``z`` the one-sided normal quantile at ``confidence``, the
    candidate is *worse* if ``mean(d) - z * se > 0`` (refused), *better* if ``mean(d) + z * se < 0``,
    else *equal* (accepted: it is fresher).
    """
    candidate = np.asarray(candidate, dtype=np.float64)
    current = np.asarray(current, dtype=np.float64)
    diff = candidate - (1.0 + tolerance) * current
    n = len(diff)
    blocks = max(1, min(blocks, n // 2))
    block_of = np.arange(n) * blocks // max(n, 1)
    means = np.bincount(block_of, weights=diff, minlength=blocks) / np.maximum(
        np.bincount(block_of, minlength=blocks), 1
    )
    mean = float(diff.mean()) if n else 0.0
    se = float(means.std(ddof=1) / math.sqrt(blocks)) if blocks > 1 else math.inf
    z = NormalDist().inv_cdf(confidence)
    low, high = mean - z * se, mean + z * se
    verdict = "worse" if low > 0 else "better" if high < 0 else "equal"
    return GuardDecision(
        accepted=verdict != "worse",
        verdict=verdict,
        candidate_loss=float(candidate.mean()) if n else 0.0,
        current_loss=float(current.mean()) if n else 0.0,
        bound_low=low,
        bound_high=high,
    )


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
