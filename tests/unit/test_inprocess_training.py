"""The in-process training harness of the replays retrains as the service's scheduler does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.inprocess_training import InProcessTraining
from training_server import synthetic


def test_a_retrain_ages_out_samples_older_than_max_age_first(tmp_path: Path) -> None:
    # The service's scheduler ages the window out before each snapshot; a replay that did not would
    # train on samples a service no longer holds (``--setting max_age_s=...`` would change nothing).
    training = InProcessTraining(tmp_path, 0.9, max_age_s=60.0, live_scoring=False)
    rng = np.random.default_rng(0)
    now_s = 1.7e9
    training.ingest(synthetic.samples(400, rng), np.full(400, now_s - 600.0))
    training.ingest(synthetic.samples(300, rng), np.full(300, now_s - 10.0))
    assert training.window.size == 700
    training.retrain(now_s)
    assert training.window.size == 300
