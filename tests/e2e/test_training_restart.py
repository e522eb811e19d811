"""Real ``python -m training_server`` processes on loopback: a restart is not a cold start."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from shared.artifacts import Manifest
from tests.procs import RunningService, start_service, wait_until
from training_server import synthetic

pytestmark = pytest.mark.e2e

FAST = ["--n-estimators", "20", "--min-train-samples", "200", "--trainer-nice", "0"]


def _start(data_dir: Path, log_dir: Path, *extra: str) -> RunningService:
    return start_service("training_server", ["--data-dir", str(data_dir), *FAST, *extra], log_dir=log_dir)


def _post(service: RunningService, n: int, seed: int) -> None:
    entries = synthetic.to_entries(synthetic.samples(n, np.random.default_rng(seed)))
    response = httpx.post(
        service.url + "/add_training_data_bulk", content=orjson.dumps({"entries": entries}), timeout=10
    )
    assert response.status_code == 202, response.text
    assert response.json() == {"message": f"Accepted {n} training samples."}


def _status(service: RunningService) -> dict[str, Any]:
    status: dict[str, Any] = httpx.get(service.url + "/status", timeout=10).json()
    return status


def _saved_samples(path: Path) -> int:
    with np.load(path, allow_pickle=False) as saved:  # replaced atomically: never half-written
        return int(saved["data"].shape[0])


def test_restarts_restore_the_window_and_keep_the_model(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    window_file = data_dir / "window.npz"
    no_auto = ["--min-new-samples", "1000000"]
    first = _start(data_dir, tmp_path, *no_auto)
    try:
        assert "prior" in httpx.get(first.url + "/readyz").json()["model_version"]
        for seed in range(5):
            _post(first, 1000, seed)
        wait_until(lambda: _status(first)["window"]["samples"] == 5000, "5000 samples in the window")
        trained = httpx.post(first.url + "/retrain", params={"wait": "true"}, timeout=60).json()
        assert trained["outcome"] == "published"
        before = _status(first)
        published = Manifest.from_json(httpx.get(first.url + "/models/current").content)
        trained_trees = {n: m.sha256 for n, m in published.models.items()}
    finally:
        # uvicorn re-raises SIGTERM after its graceful shutdown, hence -SIGTERM rather than 0.
        assert first.stop() in (0, -signal.SIGTERM), first.logs()[-3000:]
    assert '"window_samples_saved":5000' in first.logs()  # saved on shutdown

    # Graceful restart: the same window and model, and no cold start.
    second = _start(data_dir, tmp_path, *no_auto, "--persist-interval-s", "0.3")
    try:
        after = _status(second)
        assert after["window"]["samples"] == 5000
        assert after["window"]["strata"] == before["window"]["strata"]
        assert after["current_version"] == trained["version"] and after["is_prior"] is False
        listing = httpx.get(second.url + "/models").json()
        assert listing["current"] == trained["version"]
        # (calibration versions of the prior came before the first retrain; none after it)
        newer = [v for v in listing["versions"] if v > trained["version"]]
        assert not any("prior" in v for v in newer), "no prior republished"
        assert "prior_published" not in second.logs().split("training_server_started")[-1]
        # Then a crash: what the periodic save wrote survives SIGKILL (no shutdown hook runs).
        _post(second, 1000, 9)
        wait_until(lambda: _saved_samples(window_file) == 6000, "the periodic save of 6000 samples")
    finally:
        second.kill()

    third = _start(data_dir, tmp_path, *no_auto)
    try:
        status = _status(third)
        assert status["window"]["samples"] == 6000
        # The trained trees, possibly with online-calibration offsets the 1,000 samples moved.
        current = Manifest.from_json(httpx.get(third.url + "/models/current").content)
        assert current.version == trained["version"] or current.kind == "calibrated"
        assert {n: m.sha256 for n, m in current.models.items()} == trained_trees
    finally:
        third.stop()
