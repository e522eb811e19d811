"""Live accuracy per regime and drift detection.

``RegimeStats`` keeps exponentially decayed coverage and pinball loss per regime (decay by
samples of that regime, half-life ``half_life`` samples), so each regime's figures describe its
recent traffic however rarely it occurs. ``DriftDetector`` keeps a short horizon (the live
figures) and a ten times longer one per model and regime. A *drift event* is a sustained
coverage drop (short-horizon coverage below ``quantile - coverage_drop``) or loss rise (short
pinball above ``loss_rise`` x the long one, once the long one has seen three short horizons),
over at least ``min_samples`` samples of that regime since its last event, at most once per
``cooldown_s`` per model and regime.

Not thread-safe: owned by the live-scoring thread (readers copy the arrays).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LONG_HORIZON = 10  # the long-run horizon, in short horizons
LONG_RUN_SAMPLES = 3  # short horizons of samples before the long run is a reference for loss rise


class RegimeStats:
    """Exponentially decayed (by samples per regime) coverage and pinball loss."""

    def __init__(self, regimes: int, half_life: float) -> None:
        self.half_life = half_life
        self.weight = np.zeros(regimes)
        self.covered = np.zeros(regimes)
        self.loss = np.zeros(regimes)

    def update(self, counts: np.ndarray, covered: np.ndarray, loss: np.ndarray) -> None:
        """Per-regime batch sums: samples, covered samples, pinball loss (ms)."""
        decay = 0.5 ** (counts / self.half_life)
        # A batch's samples get the weight of their mean position: close enough for a horizon.
        fresh = np.where(counts > 0, (1.0 - decay) / np.maximum(counts, 1) * self.half_life / np.log(2), 0.0)
        self.weight = self.weight * decay + counts * fresh
        self.covered = self.covered * decay + covered * fresh
        self.loss = self.loss * decay + loss * fresh

    def coverage(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.weight > 0, self.covered / self.weight, np.nan)

    def pinball(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.weight > 0, self.loss / self.weight, np.nan)


@dataclass(frozen=True)
class DriftEvent:
    model: str
    regime: int
    reason: str  # "coverage_drop" or "loss_rise"
    coverage: float
    pinball_loss_ms: float
    long_pinball_loss_ms: float
    samples: int
    at_s: float


class DriftDetector:
    """Live figures per model and regime, and drift events (see the module docstring)."""

    def __init__(
        self,
        models: tuple[str, ...],
        regimes: int,
        quantile: float,
        half_life: float,
        coverage_drop: float,
        loss_rise: float,
        min_samples: int,
        cooldown_s: float,
    ) -> None:
        self.quantile = quantile
        self.coverage_drop = coverage_drop
        self.loss_rise = loss_rise
        self.min_samples = min_samples
        self.cooldown_s = cooldown_s
        self.live = {m: RegimeStats(regimes, half_life) for m in models}
        self.long = {m: RegimeStats(regimes, half_life * LONG_HORIZON) for m in models}
        self._since_event = {m: np.zeros(regimes, dtype=np.int64) for m in models}
        self._last_event_s = {m: np.full(regimes, -np.inf) for m in models}
        self.events = 0
        self.last_event: DriftEvent | None = None

    def reset(self, model: str) -> None:
        """New trees for ``model``: its live figures start afresh (they describe one model)."""
        size = len(self._since_event[model])
        half_life = self.live[model].half_life
        self.live[model] = RegimeStats(size, half_life)
        self.long[model] = RegimeStats(size, half_life * LONG_HORIZON)
        self._since_event[model][:] = 0

    def observe(
        self,
        model: str,
        regimes: np.ndarray,
        covered: np.ndarray,
        loss: np.ndarray,
        now_s: float,
        detect: bool = True,
    ) -> list[DriftEvent]:
        """Score one batch (per-sample regime, covered 0/1, pinball ms); returns new drift events
        (none without ``detect``: a prior is not a regime to drift from)."""
        size = len(self._since_event[model])
        counts = np.bincount(regimes, minlength=size).astype(np.float64)
        cov = np.bincount(regimes, weights=covered, minlength=size)
        pin = np.bincount(regimes, weights=loss, minlength=size)
        long, live = self.long[model], self.live[model]
        long_pinball = long.pinball()  # before this batch: the reference the batch is compared with
        # Pinball loss is heavy-tailed: compare with the long run only once there is one.
        established = long.weight >= LONG_RUN_SAMPLES * live.half_life
        live.update(counts, cov, pin)
        long.update(counts, cov, pin)
        since = self._since_event[model]
        since += counts.astype(np.int64)
        coverage, pinball = live.coverage(), live.pinball()
        low = coverage < self.quantile - self.coverage_drop
        with np.errstate(invalid="ignore"):
            rising = established & (pinball > self.loss_rise * long_pinball)
        due = detect & (since >= self.min_samples) & (now_s - self._last_event_s[model] >= self.cooldown_s)
        events = []
        for r in np.flatnonzero(due & (low | rising)).tolist():
            event = DriftEvent(
                model=model,
                regime=r,
                reason="coverage_drop" if low[r] else "loss_rise",
                coverage=float(coverage[r]),
                pinball_loss_ms=float(pinball[r]),
                long_pinball_loss_ms=float(long_pinball[r]),
                samples=int(since[r]),
                at_s=now_s,
            )
            since[r] = 0
            self._last_event_s[model][r] = now_s
            events.append(event)
        self.events += len(events)
        if events:
            self.last_event = events[-1]
        return events
