"""Bookkeeping of the demo: rolling prediction accuracy and call-latency percentiles.

*Coverage* is the share of completions whose actual latency was at most the prediction; a
calibrated p90 model covers 0.9. *MAPE* is the mean of ``|predicted - actual| / actual``
(a quantile model over-predicts on purpose, so its MAPE is not zero even when perfect).
Both are kept over the last ``window`` completions in O(1) per update, and over the whole run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from training_server.evaluation import pinball_loss


@dataclass(frozen=True, slots=True)
class Outcome:
    """One completed request with the prediction that routed it (None if the call failed)."""

    pod: int
    ttft_ms: float
    tpot_ms: float  # 0.0: no TPOT (a one-token answer)
    predicted_ttft_ms: float | None
    predicted_tpot_ms: float | None
    model_version: str | None


@dataclass(frozen=True)
class AccuracySummary:
    count: int
    coverage: float | None  # share of actual <= predicted; None before any sample
    mape: float | None  # fraction, not percent

    def as_dict(self) -> dict[str, float | int | None]:
        return {"count": self.count, "coverage": self.coverage, "mape": self.mape}


class RollingAccuracy:
    """Coverage and MAPE of (predicted, actual) pairs over the last ``window`` pairs and overall.

    Pairs whose actual is not positive carry no measurement (0 means "no TPOT" on the wire)
    and are ignored.
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._pairs: deque[tuple[bool, float]] = deque()
        self._covered = 0
        self._ape_sum = 0.0
        self._total_count = 0
        self._total_covered = 0
        self._total_ape_sum = 0.0

    def add(self, predicted: float, actual: float) -> None:
        if not actual > 0.0:
            return
        covered = actual <= predicted
        ape = abs(predicted - actual) / actual
        self._pairs.append((covered, ape))
        self._covered += covered
        self._ape_sum += ape
        self._total_count += 1
        self._total_covered += covered
        self._total_ape_sum += ape
        if len(self._pairs) > self.window:
            old_covered, old_ape = self._pairs.popleft()
            self._covered -= old_covered
            self._ape_sum -= old_ape

    def recent(self) -> AccuracySummary:
        n = len(self._pairs)
        if not n:
            return AccuracySummary(0, None, None)
        # The running sum drifts by float rounding only; the clamp keeps it from showing < 0.
        return AccuracySummary(n, self._covered / n, max(0.0, self._ape_sum) / n)

    def overall(self) -> AccuracySummary:
        n = self._total_count
        if not n:
            return AccuracySummary(0, None, None)
        return AccuracySummary(n, self._total_covered / n, self._total_ape_sum / n)


class LatencyWindow:
    """The last ``size`` durations (ms); percentiles on demand."""

    def __init__(self, size: int = 2000) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, value_ms: float) -> None:
        self._values.append(value_ms)

    def __len__(self) -> int:
        return len(self._values)

    def percentile(self, q: float) -> float | None:
        if not self._values:
            return None
        return float(np.percentile(np.fromiter(self._values, dtype=float, count=len(self._values)), q))


def accuracy_report(
    predicted: np.ndarray, actual: np.ndarray, quantile: float
) -> dict[str, float | int | None]:
    """Coverage, MAPE and pinball loss of ``predicted`` against ``actual`` (pairs with actual <= 0 skipped).

    ``constant_pinball`` is the loss of the best constant predictor in hindsight (the
    empirical ``quantile`` of the same actuals): a model that does not beat it has learned
    nothing about the pods' state.
    """
    keep = actual > 0
    predicted, actual = predicted[keep], actual[keep]
    n = int(actual.size)
    if not n:
        return {"count": 0, "coverage": None, "mape": None, "pinball": None, "constant_pinball": None}
    constant = np.full_like(actual, np.quantile(actual, quantile))
    return {
        "count": n,
        "coverage": float(np.mean(actual <= predicted)),
        "mape": float(np.mean(np.abs(predicted - actual) / actual)),
        "pinball": float(pinball_loss(actual, predicted, quantile).mean()),
        "constant_pinball": float(pinball_loss(actual, constant, quantile).mean()),
    }
