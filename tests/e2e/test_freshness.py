"""Freshness with default retrain triggers: after a regime change the served model follows in seconds.

A real training server (default retrain triggers and guard) and a real prediction server reading
its store, on loopback. The pool slows down fourfold; 4,000 samples of the new regime stream in over
a few seconds, as a scheduler sends them. The model that was serving gets the new regime wrong, and
within seconds a new version serves predictions that cover it (before, a retrain waited for 5,000
new samples or a minute).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.procs import RunningService, start_service, wait_until
from training_server import synthetic

pytestmark = pytest.mark.e2e

# Only the model size is made small; the retrain triggers and the guard are the defaults. The
# slowdown is invisible in the features, so only recency tells the regimes apart: samples are
# weighted with a short half-life (the trees then follow the newest samples).
FAST = ["--n-estimators", "30", "--min-train-samples", "200", "--recency-half-life-s", "5"]
SLOWDOWN = 4.0
FOLLOW_DEADLINE_S = 30.0


def _regime(n: int, seed: int, slowdown: float = 1.0) -> dict[str, np.ndarray]:
    columns = synthetic.samples(n, np.random.default_rng(seed))
    columns["actual_ttft_ms"] = columns["actual_ttft_ms"] * slowdown
    columns["actual_tpot_ms"] = columns["actual_tpot_ms"] * slowdown
    return columns


def _send(training: RunningService, columns: dict[str, np.ndarray]) -> None:
    body = orjson.dumps({"entries": synthetic.to_entries(columns)})
    response = httpx.post(training.url + "/add_training_data_bulk", content=body, timeout=10)
    assert response.status_code == 202, response.text


def _predict(prediction: RunningService, columns: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    rows = [
        {k: v for k, v in entry.items() if not k.startswith("actual_")}
        for entry in synthetic.to_entries(columns)
    ]
    response = httpx.post(prediction.url + "/predict/bulk/strict", json={"requests": rows}, timeout=10)
    assert response.status_code == 200, response.text
    predictions: list[dict[str, Any]] = response.json()["predictions"]
    return np.array([p["ttft_ms"] for p in predictions]), predictions[0]["model_version"]


def _coverage(prediction: RunningService, probe: dict[str, np.ndarray]) -> tuple[float, str]:
    predicted, version = _predict(prediction, probe)
    return float(np.mean(probe["actual_ttft_ms"] <= predicted)), version


def test_after_a_slowdown_a_new_model_follows_within_seconds(tmp_path: Path) -> None:
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    with start_service("training_server", ["--data-dir", str(data_dir), *FAST], log_dir=logs) as training:
        store = ["--store", str(data_dir / "models"), "--poll-interval-s", "0.1"]
        with start_service("prediction_server", store, log_dir=logs, ready_path="/readyz") as prediction:
            _send(training, _regime(2000, seed=1))
            before = _regime(500, seed=2)
            wait_until(
                lambda: not (cov := _coverage(prediction, before))[1].endswith("prior") and cov[0] >= 0.8,
                lambda: f"a trained model for the first regime: {_coverage(prediction, before)}",
                timeout_s=60,
                poll_s=0.2,
            )

            probe = _regime(500, seed=3, slowdown=SLOWDOWN)
            stale_coverage, stale_version = _coverage(prediction, probe)
            assert stale_coverage < 0.5, "the model trained before the slowdown gets it wrong"

            started = time.monotonic()
            for seed in range(10, 26):  # 4,000 samples of the slow regime, streamed
                _send(training, _regime(250, seed=seed, slowdown=SLOWDOWN))
                time.sleep(0.25)
            wait_until(
                lambda: (c := _coverage(prediction, probe))[1] != stale_version and c[0] >= 0.8,
                lambda: (
                    f"the new regime followed: still {_coverage(prediction, probe)} after "
                    f"{time.monotonic() - started:.0f} s; "
                    f"training status: {httpx.get(training.url + '/status').json()['training']}"
                ),
                timeout_s=FOLLOW_DEADLINE_S - (time.monotonic() - started),
                poll_s=0.2,
            )
            status = httpx.get(training.url + "/status").json()
            assert status["current_age_s"] < FOLLOW_DEADLINE_S
            metrics = httpx.get(training.url + "/metrics").text
            assert "training_model_age_seconds" in metrics
