"""Online calibration per regime: rolling split-conformal offsets between retrains.

For each model and regime (``shared.regimes``) the calibrator keeps the newest
``calibration_window`` samples (their feature rows and log-latency targets) and their residuals
``log1p(actual) - (tree margin + calibration offset)`` against the trees currently published.
A regime's offset is the conformal quantile (``evaluation.conformal_offset``) of its residuals,
so the served prediction ``trees + calibration offset + regime offset`` covers the target share
of that regime's recent samples: when a regime's latency moves, its offset follows within about
a window of its samples while the other regimes keep theirs. A regime with fewer than
``calibration_min_samples`` recent samples keeps offset 0 (the trainer's global conformal offset).

Residuals are relative to the trees, never to the published offsets, so publishing offsets does
not feed back into them. When a retrain publishes new trees, ``rebase`` keeps only the samples
that arrived after it was published (older ones may be in its training set, whose in-sample
residuals are too small) and recomputes their residuals against the new trees; until a regime
has ``calibration_min_samples`` of those, the new version serves its own conformal offset there.
A regime whose recent coverage is within noise of the target keeps offset 0 as well: latency is
bursty and samples arrive after their request completed, so chasing every swing would lag
behind it and hurt.

Not thread-safe: owned by the live-scoring thread.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shared.artifacts import Manifest
from shared.features import NUM_FEATURES
from shared.regimes import RegimeOffsets, RegimeScheme
from training_server.evaluation import conformal_offset

MarginFn = Callable[[np.ndarray], np.ndarray]
SIGNIFICANCE = 3.0  # binomial standard deviations of miscoverage before a regime gets an offset


class _RegimeRings:
    """Newest ``cap`` (features, log target, arrival time, residual) rows of each regime of one model."""

    def __init__(self, regimes: int, cap: int) -> None:
        self.cap = cap
        self.features = np.zeros((regimes, cap, NUM_FEATURES), dtype=np.float32)
        self.target = np.zeros((regimes, cap))
        self.arrived = np.zeros((regimes, cap))
        self.residual = np.zeros((regimes, cap))
        self.count = np.zeros(regimes, dtype=np.int64)  # rows held (<= cap)
        self.next = np.zeros(regimes, dtype=np.int64)  # next write position

    def add(
        self, regime: int, features: np.ndarray, target: np.ndarray, residual: np.ndarray, arrived_s: float
    ) -> None:
        n = len(target)
        if n > self.cap:
            features, target, residual = features[-self.cap :], target[-self.cap :], residual[-self.cap :]
            n = self.cap
        slots = (self.next[regime] + np.arange(n)) % self.cap
        self.features[regime, slots] = features
        self.target[regime, slots] = target
        self.arrived[regime, slots] = arrived_s
        self.residual[regime, slots] = residual
        self.next[regime] = (self.next[regime] + n) % self.cap
        self.count[regime] = min(self.cap, self.count[regime] + n)

    def keep_since(self, regime: int, since_s: float) -> int:
        """Drop the rows that arrived before ``since_s``; the rest move to the front, oldest first."""
        n = int(self.count[regime])
        order = (self.next[regime] + np.arange(n)) % self.cap if n == self.cap else np.arange(n)
        kept = order[self.arrived[regime, order] >= since_s]
        k = len(kept)
        for array in (self.features, self.target, self.arrived, self.residual):
            array[regime, :k] = array[regime, kept]
        self.count[regime], self.next[regime] = k, k % self.cap
        return k


class RegimeCalibrator:
    """Per-model, per-regime rolling conformal offsets (see the module docstring)."""

    def __init__(
        self, models: tuple[str, ...], scheme: RegimeScheme, quantile: float, window: int, min_samples: int
    ) -> None:
        self.scheme = scheme
        self.quantile = quantile
        self.min_samples = min_samples
        self._rings = {name: _RegimeRings(scheme.size, window) for name in models}
        self.trees: dict[str, str] = {}  # model -> SHA-256 of the trees the residuals are against

    def observe(
        self,
        model: str,
        features: np.ndarray,
        log_target: np.ndarray,
        base_margin: np.ndarray,
        arrived_s: float,
    ) -> None:
        """Add samples: ``base_margin`` is the served margin of the current trees without regime offsets."""
        rings = self._rings[model]
        regimes = self.scheme.ids(features)
        residual = log_target - base_margin
        for regime in np.unique(regimes).tolist():
            rows = np.flatnonzero(regimes == regime)
            rings.add(regime, features[rows], log_target[rows], residual[rows], arrived_s)

    def rebase(self, model: str, trees_sha256: str, base_margin: MarginFn, trained_s: float) -> None:
        """New trees, published at ``trained_s``: keep only the samples that arrived since (the
        others may be in their training set, and in-sample residuals would bias the offsets
        low), with their residuals recomputed against ``base_margin(features)``."""
        self.trees[model] = trees_sha256
        rings = self._rings[model]
        held = [r for r in range(self.scheme.size) if rings.count[r] and rings.keep_since(r, trained_s)]
        if not held:
            return
        parts = [rings.features[r, : rings.count[r]] for r in held]
        margin = base_margin(np.ascontiguousarray(np.concatenate(parts)))
        start = 0
        for r, part in zip(held, parts, strict=True):
            n = len(part)
            rings.residual[r, :n] = rings.target[r, :n] - margin[start : start + n]
            start += n

    def offsets(self, model: str) -> np.ndarray:
        """The offset of each regime: 0 (the trainer's calibration) where too few recent samples,
        or where their coverage without an offset is within ``SIGNIFICANCE`` binomial standard
        deviations of the target (so noise and short bursts are not chased)."""
        rings = self._rings[model]
        q = self.quantile
        out = np.zeros(self.scheme.size)
        for r in np.flatnonzero(rings.count >= self.min_samples).tolist():
            residual = rings.residual[r, : rings.count[r]]
            n = len(residual)
            if abs(float(np.mean(residual <= 0.0)) - q) > SIGNIFICANCE * np.sqrt(q * (1.0 - q) / n):
                out[r] = conformal_offset(residual, q)
        return out

    def proposal(self, current: Manifest) -> tuple[dict[str, RegimeOffsets], float]:
        """New offsets for the models whose trees the residuals are against, and the largest move
        from ``current``'s published offsets."""
        new: dict[str, RegimeOffsets] = {}
        moved = 0.0
        for name, spec in current.models.items():
            if name not in self._rings or self.trees.get(name) != spec.sha256:
                continue  # no residuals against these trees yet
            offsets = self.offsets(name)
            old = np.zeros(self.scheme.size)
            if spec.regime_offsets is not None and spec.regime_offsets.scheme == self.scheme:
                old = np.asarray(spec.regime_offsets.offsets)
            moved = max(moved, float(np.max(np.abs(offsets - old))))
            new[name] = RegimeOffsets.of(self.scheme, np.round(offsets, 6))
        return new, moved

    def samples(self, model: str) -> np.ndarray:
        return self._rings[model].count.copy()
