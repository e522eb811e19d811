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

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import CollectorRegistry

from prediction_server.predictor import Predictor
from shared.artifacts import Manifest
from shared.prior import publish_prior
from training_server.config import TrainingSettings
from training_server.live_scoring import LiveScorer
from training_server.metrics import TrainingMetrics
from training_server.trainer import Trainer, TrainingOutcome
from training_server.window import StratifiedWindow

try:
    from shared.model_store import ModelStore
except ImportError:  # --code: a checkout from before the store had its own module (9090d18)
    from shared.artifacts import ModelStore  # type: ignore[attr-defined,no-redef]
if TYPE_CHECKING:  # annotations only: --code may run a checkout from before shared.wire_fields
    from shared.wire_fields import Columns


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
        """One retrain, as the service's scheduler runs it (``Trainer.run_window``: samples older than
        ``max_age_s`` leave the window first); a published version becomes the live scorer's current."""
        outcome, _ = self.trainer.run_window(self.window, now_s)
        if outcome.outcome == "published" and outcome.version is not None and self.live is not None:
            self.live.set_current(self.store.load(outcome.version).manifest)
        return outcome

    def publish_calibration(self) -> Manifest | None:
        """A calibration version if the live scorer's offsets moved enough (and its interval passed)."""
        return None if self.live is None else self.live.maybe_publish()

    def predictor(self, version: str | None = None) -> Predictor:
        """The serving path on ``version`` (default: the store's current one), as a replica loads it."""
        return Predictor.from_model_set(self.store.load(version))


class ServiceSchedule:
    """When an ``InProcessTraining`` retrains and when the replicas switch versions, as the services
    do, on simulated time (``speed`` simulated s per wall s).

    The retrain rule is ``training_server.scheduler``'s: once ``min_new_samples`` and
    ``min_new_fraction`` of the window arrived since the last run (at most once per
    ``retrain_min_gap_s``, which does not delay the first run), or when ``retrain_interval_s``
    passed with a new sample (counted from the start, then from each run); both in wall seconds. A
    run occupies the trainer for its wall time x ``speed``; its version, and each calibration
    version, serves ``pickup_s`` wall seconds after it exists. The caller ingests the samples and
    calls ``after_flush`` once per flush, and ``switch`` to learn which version the replicas serve.

    With ``train_s``, every run occupies the trainer for that many wall seconds instead of its
    measured time: the replay then no longer depends on how busy the machine was (when versions
    land is the one thing that does), so two runs of the same code give the same figures, and a
    difference between two variants is theirs, not the machine's.
    """

    def __init__(
        self,
        training: InProcessTraining,
        speed: float = 1.0,
        pickup_s: float = 1.0,
        train_s: float | None = None,
    ) -> None:
        self.training, self.speed, self.pickup_s, self.train_s = training, speed, pickup_s, train_s
        self.new = 0
        self.busy_until_s = -1.0  # simulated
        self._last_start_wall = -math.inf
        self._anchor_wall = 0.0
        self._swaps: list[tuple[float, str]] = []  # (simulated time, version) the replicas switch to
        self.runs: dict[str, float] = {"published": 0, "total": 0, "train_s": 0.0}

    def switch(self, t_s: float) -> str | None:
        """The newest version whose pickup time has come by ``t_s`` (None: keep serving)."""
        due = [v for at, v in self._swaps if at <= t_s]
        self._swaps = [(at, v) for at, v in self._swaps if at > t_s]
        return due[-1] if due else None

    def after_flush(self, t_s: float, new_samples: int, now_epoch_s: float) -> None:
        """After ``new_samples`` were ingested at ``t_s``: publish a calibration, retrain if due."""
        self.new += new_samples
        published = self.training.publish_calibration()
        if published is not None:
            self._swaps.append((t_s + self.pickup_s * self.speed, published.version))
        if t_s < self.busy_until_s or not self._due(t_s / self.speed):
            return
        self._last_start_wall = self._anchor_wall = t_s / self.speed
        self.new = 0
        started = time.perf_counter()
        outcome = self.training.retrain(now_epoch_s)
        took = time.perf_counter() - started
        self.runs["total"] += 1
        self.runs["train_s"] += took
        # The version exists from now on, but the service publishes it only once the run is over
        # (simulated: its duration x speed), and the replicas pick it up after that.
        self.busy_until_s = t_s + (took if self.train_s is None else self.train_s) * self.speed
        if outcome.outcome == "published" and outcome.version is not None:
            self.runs["published"] += 1
            self._swaps.append((self.busy_until_s + self.pickup_s * self.speed, outcome.version))

    def _due(self, wall_s: float) -> bool:
        s = self.training.settings
        enough = self.new >= max(s.min_new_samples, s.min_new_fraction * self.training.window.size)
        return (enough and wall_s - self._last_start_wall >= s.retrain_min_gap_s) or (
            self.new > 0 and wall_s - self._anchor_wall >= s.retrain_interval_s
        )
