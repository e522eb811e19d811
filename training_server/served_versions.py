"""The versions that served: which version answered a request, and what it predicted.

A sample is scored against the version that was current when its request was routed (the live
scorer takes its timestamp minus its TTFT). ``ServedVersions`` remembers the last ``HISTORY``
versions, each with the time it became current here, and predicts a row again with the version
that served it: its trees' margin (XGBoost ``inplace_predict`` on one thread) through
``shared.artifacts.served_latency_ms``, as a replica computes it. Boosters are loaded from the
store once per model file (by SHA-256), from any remembered version that holds that file (a
calibration version hard-links the files of the version it is based on, which may be pruned
first), and dropped when no remembered version uses them; rows whose trees no remembered version
still holds go unscored (NaN).

Versions are set from any thread; predictions are made on the live-scoring thread only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import xgboost as xgb

from shared.artifacts import Manifest, served_latency_ms
from shared.errors import ArtifactError
from shared.model_store import ModelStore
from training_server.boosting import predict_margin

HISTORY = 8  # versions remembered for "the version that served this request"
# The trees' margin per row of one batch, by the trees' SHA-256 ("" for a model a version lacks):
# each set of trees predicts a batch once, however many of its versions served it.
Margins = dict[str, np.ndarray | None]


@dataclass(frozen=True)
class ServedVersion:
    manifest: Manifest
    since_s: float  # epoch seconds it became current here


class ServedVersions:
    """The last ``HISTORY`` current versions and their boosters (see the module docstring)."""

    def __init__(self, store: ModelStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._history: list[ServedVersion] = []
        self._boosters: dict[str, xgb.Booster] = {}  # by SHA-256 of the model file

    def set_current(self, manifest: Manifest, since_s: float) -> None:
        """The version current from ``since_s`` (epoch seconds) on (any thread)."""
        with self._lock:
            if self._history and self._history[-1].manifest.version == manifest.version:
                return
            self._history = [*self._history[-(HISTORY - 1) :], ServedVersion(manifest, since_s)]

    def current(self) -> Manifest | None:
        with self._lock:
            return self._history[-1].manifest if self._history else None

    def snapshot(self) -> list[ServedVersion]:
        """The remembered versions, oldest first: one batch is scored against one snapshot."""
        with self._lock:
            return list(self._history)

    def served(
        self,
        name: str,
        feats: np.ndarray,
        routed_s: np.ndarray,
        history: list[ServedVersion],
        margins: Margins,
    ) -> np.ndarray:
        """Each row's ``name`` prediction by the version of ``history`` current when it was routed
        (the oldest for rows routed before it; NaN if unavailable)."""
        since = np.array([h.since_s for h in history])
        which = np.maximum(np.searchsorted(since, routed_s, side="right") - 1, 0)
        out = np.full(len(feats), np.nan)
        for i in np.unique(which).tolist():
            rows = np.flatnonzero(which == i)
            spec = history[i].manifest.models.get(name)
            margin = self.margin(history[i].manifest, name, feats, margins)
            if spec is not None and margin is not None:
                out[rows] = served_latency_ms(margin[rows], feats[rows], spec)
        return out

    def margin(self, manifest: Manifest, name: str, feats: np.ndarray, margins: Margins) -> np.ndarray | None:
        """The trees' margin for every row of ``feats`` (memoised in ``margins`` by the trees' SHA-256)."""
        sha = manifest.models[name].sha256 if name in manifest.models else ""
        if sha not in margins:
            booster = self.booster(manifest, name)
            margins[sha] = None if booster is None else predict_margin(booster, feats)
        return margins[sha]

    def booster(self, manifest: Manifest, name: str) -> xgb.Booster | None:
        """``manifest``'s ``name`` trees, loaded once; ``None`` if the version lacks them or the store
        pruned them from every remembered version that holds them (a calibration version shares
        its files with the version it is based on, which may have been pruned first)."""
        spec = manifest.models.get(name)
        if spec is None:
            return None
        booster = self._boosters.get(spec.sha256)
        if booster is None:
            history = self._history
            holders = [manifest, *(h.manifest for h in reversed(history) if h.manifest is not manifest)]
            data = self._read(name, spec.sha256, holders)
            if data is None:
                return None
            booster = xgb.Booster(params={"nthread": 1})
            booster.load_model(bytearray(data))
            live = {m.manifest.models[n].sha256 for m in history for n in m.manifest.models}
            self._boosters = {k: v for k, v in self._boosters.items() if k in live}
            self._boosters[spec.sha256] = booster
        return booster

    def _read(self, name: str, sha256: str, holders: list[Manifest]) -> bytes | None:
        """The bytes of ``name``'s file with this SHA-256 from the first of ``holders`` that still has it."""
        for manifest in holders:
            spec = manifest.models.get(name)
            if spec is None or spec.sha256 != sha256:
                continue
            try:
                return self.store.read_file(manifest.version, spec.file)
            except ArtifactError:
                continue
        return None
