"""The in-process training harness of the replays retrains as the service's scheduler does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.inprocess_training import InProcessTraining, ServiceSchedule
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


def test_a_fixed_run_time_makes_when_a_version_serves_independent_of_the_machine(tmp_path: Path) -> None:
    # With ``train_s`` a run occupies the trainer for that long whatever it measured, so a replay's
    # figures do not depend on how busy the machine was; two variants compared this way differ by
    # their code only.
    training = InProcessTraining(tmp_path, 0.9, live_scoring=False, min_new_samples=200)
    schedule = ServiceSchedule(training, speed=5.0, pickup_s=0.2, train_s=0.4)
    rng = np.random.default_rng(0)
    training.ingest(synthetic.samples(400, rng), np.full(400, 1.7e9))
    schedule.after_flush(10.0, 400, 1.7e9)
    assert schedule.runs["published"] == 1
    assert schedule.busy_until_s == 10.0 + 0.4 * 5.0
    assert schedule.switch(10.0 + 0.4 * 5.0 + 0.2 * 5.0 - 0.01) is None  # not before run + pickup
    assert schedule.switch(10.0 + 0.4 * 5.0 + 0.2 * 5.0) is not None
