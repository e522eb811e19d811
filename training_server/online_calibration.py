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
not feed back into them. When a retrain publishes new trees, ``rebase`` recomputes the residuals
of the kept samples against them: the new version starts from per-regime offsets computed on the
recent samples of each regime, within a publication interval.

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


class _RegimeRings:
    """Newest ``cap`` (features, log target, residual) rows of each regime of one model."""

    def __init__(self, regimes: int, cap: int) -> None:
        self.cap = cap
        self.features = np.zeros((regimes, cap, NUM_FEATURES), dtype=np.float32)
        self.target = np.zeros((regimes, cap))
        self.residual = np.zeros((regimes, cap))
        self.count = np.zeros(regimes, dtype=np.int64)  # rows held (<= cap)
        self.next = np.zeros(regimes, dtype=np.int64)  # next write position

    def add(self, regime: int, features: np.ndarray, target: np.ndarray, residual: np.ndarray) -> None:
        n = len(target)
        if n > self.cap:
            features, target, residual = features[-self.cap :], target[-self.cap :], residual[-self.cap :]
            n = self.cap
        slots = (self.next[regime] + np.arange(n)) % self.cap
        self.features[regime, slots] = features
        self.target[regime, slots] = target
        self.residual[regime, slots] = residual
        self.next[regime] = (self.next[regime] + n) % self.cap
        self.count[regime] = min(self.cap, self.count[regime] + n)


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
        self, model: str, features: np.ndarray, log_target: np.ndarray, base_margin: np.ndarray
    ) -> None:
        """Add samples: ``base_margin`` is trees + calibration offset of the current trees."""
        rings = self._rings[model]
        regimes = self.scheme.ids(features)
        residual = log_target - base_margin
        for regime in np.unique(regimes).tolist():
            rows = np.flatnonzero(regimes == regime)
            rings.add(regime, features[rows], log_target[rows], residual[rows])

    def rebase(self, model: str, trees_sha256: str, base_margin: MarginFn) -> None:
        """New trees: recompute the kept samples' residuals against ``base_margin(features)``."""
        self.trees[model] = trees_sha256
        rings = self._rings[model]
        held = np.flatnonzero(rings.count > 0)
        if len(held) == 0:
            return
        parts = [rings.features[r, : rings.count[r]] for r in held.tolist()]
        margin = base_margin(np.ascontiguousarray(np.concatenate(parts)))
        start = 0
        for r, part in zip(held.tolist(), parts, strict=True):
            n = len(part)
            rings.residual[r, :n] = rings.target[r, :n] - margin[start : start + n]
            start += n

    def offsets(self, model: str) -> np.ndarray:
        """The offset of each regime (0 where too few recent samples)."""
        rings = self._rings[model]
        out = np.zeros(self.scheme.size)
        for r in np.flatnonzero(rings.count >= self.min_samples).tolist():
            out[r] = conformal_offset(rings.residual[r, : rings.count[r]], self.quantile)
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
