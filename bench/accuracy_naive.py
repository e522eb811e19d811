"""The naive baseline of the accuracy evidence: a sliding-window XGBoost p90, as the llm-d predictor works.

It keeps the newest ``window`` training entries (10,000) and refits both models from scratch on
them every ``retrain_every`` entries (1,000): XGBoost with the quantile objective on the raw
milliseconds, no conformal calibration, no strata, no guard. Features come from
``shared.features.build_features``, as in the services, and the tree settings are the training
server's defaults (150 rounds, depth 6, eta 0.1, 64 histogram bins, one thread), so the
comparison is about the method, not the capacity of the trees.

It runs in-process on exactly the stream the real servers see, and is refitted synchronously
when its count is reached: it is never stale because a fit was slow, which favours the
baseline (its figures are an upper bound for a sliding-window predictor on that schedule).
Before its first fit it answers NaN (no model), and those requests are left out of every
ours/naive comparison.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import xgboost as xgb

from shared.features import build_features
from shared.schemas import parse_rows

TARGETS = ("ttft", "tpot")


class SlidingWindowBaseline:
    def __init__(
        self, quantile: float = 0.9, window: int = 10_000, retrain_every: int = 1_000, rounds: int = 150
    ) -> None:
        self.quantile = quantile
        self.window = window
        self.retrain_every = retrain_every
        self.rounds = rounds
        self._rows: deque[dict[str, Any]] = deque(maxlen=window)
        self._since_fit = 0
        self._models: dict[str, xgb.Booster] = {}
        self.fits = 0

    def learn(self, entries: Sequence[dict[str, Any]]) -> None:
        """Add training entries (wire format: features plus ``actual_*_ms``); refit at each count."""
        for entry in entries:
            self._rows.append(entry)
            self._since_fit += 1
            if self._since_fit >= self.retrain_every:
                self._fit()
                self._since_fit = 0

    def learn_history(self, entries: Sequence[dict[str, Any]]) -> None:
        """Start from a history: ``learn`` its newest ``window`` entries, all that a baseline which had
        run through the whole of it would keep."""
        self.learn(entries[-self.window :])

    def predict(self, rows: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
        """Predicted p-quantile in ms per row and target (NaN for a target with no model yet)."""
        features = build_features(parse_rows(list(rows)))
        out = {}
        for target in TARGETS:
            model = self._models.get(target)
            out[target] = (
                np.full(len(rows), np.nan)
                if model is None
                else np.asarray(model.inplace_predict(features), dtype=np.float64)
            )
        return out

    def answer(
        self, routed: Sequence[tuple[int, dict[str, Any]]], into: dict[int, tuple[float, float]]
    ) -> None:
        """Put the (TTFT, TPOT) answer for each (request id, routing-time row) of ``routed`` in
        ``into``: by the model serving now, which changes only in ``learn``."""
        if routed:
            guess = self.predict([row for _, row in routed])
            for k, (rid, _) in enumerate(routed):
                into[rid] = (float(guess["ttft"][k]), float(guess["tpot"][k]))

    def _fit(self) -> None:
        rows = list(self._rows)
        features = build_features(parse_rows(rows))
        for target in TARGETS:
            y = np.array([float(r.get(f"actual_{target}_ms", 0.0)) for r in rows])
            keep = y > 0  # 0 means "no such latency" on the wire
            if keep.sum() < 20:
                continue
            self._models[target] = fit_quantile_trees(features[keep], y[keep], self.quantile, self.rounds)
        self.fits += 1


def fit_quantile_trees(
    features: np.ndarray, y_ms: np.ndarray, quantile: float, rounds: int = 150
) -> xgb.Booster:
    """The baseline's model: XGBoost's quantile objective on the raw milliseconds, the training
    server's default tree settings, one thread."""
    params = {
        "objective": "reg:quantileerror",
        "quantile_alpha": quantile,
        "max_depth": 6,
        "eta": 0.1,
        "max_bin": 64,
        "tree_method": "hist",
        "nthread": 1,
        "verbosity": 0,
    }
    return xgb.train(params, xgb.DMatrix(features, label=y_ms), num_boost_round=rounds)
