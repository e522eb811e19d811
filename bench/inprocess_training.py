"""A training server's pieces in one process, for the in-process replays (``bench/*_calibration_replay.py``).

The store (in a directory of the caller's, the prior published first), the stratified window, the
trainer and, if ``live_scoring`` is on (the default), the live scorer that scores every sample and
moves the online calibration, wired as ``training_server.service`` wires them, without the HTTP
layer, the journal or the retrain scheduler: the caller decides when samples arrive, when a retrain
runs and when a calibration version may be published, so a replay runs as fast as the CPU allows
and the same on every run. Imported lazily by the replays (after their ``--code`` checkout is on
``sys.path``), so it runs whichever checkout's services they were pointed at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from prediction_server.predictor import Predictor
from shared.artifacts import Manifest, ModelStore
from shared.prior import publish_prior
from shared.schemas import Columns
from training_server.config import TrainingSettings
from training_server.live_scoring import LiveScorer
from training_server.metrics import TrainingMetrics
from training_server.trainer import Trainer, TrainingOutcome
from training_server.window import StratifiedWindow


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` command-line overrides of ``TrainingSettings`` (validated when it is built)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key.replace("-", "_") not in TrainingSettings.model_fields:
            raise SystemExit(f"--setting {pair!r}: expected KEY=VALUE with KEY a TrainingSettings field")
        out[key.replace("-", "_")] = value
    return out


class InProcessTraining:
    def __init__(self, directory: Path, quantile: float, **overrides: Any) -> None:
        self.settings = TrainingSettings(data_dir=directory, quantile=quantile, **overrides)
        self.store = ModelStore(self.settings.store_dir)
        publish_prior(self.store, quantile)
        self.live = (
            LiveScorer(
                self.store,
                self.settings,
                TrainingMetrics(CollectorRegistry()),
                lambda e: None,
                lambda m: None,
            )
            if self.settings.live_scoring
            else None
        )
        self.trainer = Trainer(self.store, self.settings, self.live.offsets_for if self.live else None)
        self.window = StratifiedWindow(self.settings.stratum_cap, self.settings.max_age_s)
        if self.live is not None:
            self.live.set_current(self.store.load().manifest)

    def ingest(self, columns: Columns, stamps: np.ndarray) -> None:
        """Samples in arrival order: into the window, then scored by the live scorer."""
        self.window.insert(columns, stamps)
        if self.live is not None:
            self.live.process(columns, stamps)

    def retrain(self, now_s: float) -> TrainingOutcome:
        """One retrain on the window as it is; a published version becomes the live scorer's current."""
        snapshot = self.window.snapshot(self.settings.max_train_samples)
        outcome = self.trainer.run(snapshot, now_s, self.window.size)
        if outcome.outcome == "published" and outcome.version is not None and self.live is not None:
            self.live.set_current(self.store.load(outcome.version).manifest)
        return outcome

    def publish_calibration(self) -> Manifest | None:
        """A calibration version if the live scorer's offsets moved enough (and its interval passed)."""
        return None if self.live is None else self.live.maybe_publish()

    def predictor(self, version: str | None = None) -> Predictor:
        """The serving path on ``version`` (default: the store's current one), as a replica loads it."""
        return Predictor.from_model_set(self.store.load(version))
