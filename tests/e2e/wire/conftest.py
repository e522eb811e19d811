"""The fleet the wire-contract suite runs against: real processes on loopback ports.

One training server (with a token, trained once on synthetic samples so every endpoint has a real
model to show), one prediction server on its store, and one coalescer in front of both
(``--prediction-urls`` and ``--training-url``), so the scheduler's two URLs can both point at it.
Tests that change state (flush, import, kill) start their own servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.procs import RunningService, start_service, wait_until

TOKEN = "wire-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TRAINING_FLAGS = (
    "--min-train-samples",
    "200",
    "--n-estimators",
    "30",
    "--max-depth",
    "4",
    "--min-new-samples",
    "1000000",
    "--retrain-interval-s",
    "3600",
    "--auth-token",
    TOKEN,
)


@dataclass
class Fleet:
    training: RunningService
    prediction: RunningService
    coalescer: RunningService
    base: Path
    version: str  # the trained version every service serves

    @property
    def log_dir(self) -> Path:
        return self.base / "logs"

    def start_training(self, data_dir: Path, *extra: str) -> RunningService:
        return start_service(
            "training_server",
            ["--data-dir", str(data_dir), *TRAINING_FLAGS, *extra],
            log_dir=self.log_dir,
            ready_path="/readyz",
        )

    def start_prediction(self, store: Path, *extra: str, ready_path: str = "/readyz") -> RunningService:
        return start_service(
            "prediction_server",
            ["--store", str(store), "--poll-interval-s", "0.1", "--auth-token", TOKEN, *extra],
            log_dir=self.log_dir,
            ready_path=ready_path,
        )

    def start_coalescer(
        self, prediction: RunningService, training_url: str, *extra: str, ready_path: str = "/readyz"
    ) -> RunningService:
        return start_service(
            "coalescer",
            [
                "--prediction-urls",
                prediction.url,
                "--training-url",
                training_url,
                "--auth-token",
                TOKEN,
                "--deadline-ms",
                "5000",
                *extra,
            ],
            log_dir=self.log_dir,
            ready_path=ready_path,
        )


def entries(n: int, seed: int = 0, **extra: Any) -> list[dict[str, Any]]:
    """Training entries whose latencies depend on the features (so trees have something to learn)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = int(rng.integers(10, 4000))
        cached = float(rng.uniform(0, 1))
        waiting = int(rng.integers(0, 8))
        running = int(rng.integers(0, 16))
        kv = float(rng.uniform(0, 1))
        ttft = 20 + tokens * (1 - cached) * 0.05 + waiting * 30 + float(rng.exponential(5))
        tpot = 8 + running * 0.8 + kv * 10 + float(rng.exponential(1))
        out.append(
            {
                "kv_cache_percentage": kv,
                "input_token_length": tokens,
                "num_request_waiting": waiting,
                "num_request_running": running,
                "num_tokens_generated": int(rng.integers(1, 200)),
                "prefix_cache_score": cached,
                "actual_ttft_ms": ttft,
                "actual_tpot_ms": tpot,
                "timestamp": "0001-01-01T00:00:00Z",
                **extra,
            }
        )
    return out


def rows(n: int, seed: int = 1) -> list[dict[str, Any]]:
    keep = ("actual_ttft_ms", "actual_tpot_ms", "timestamp")
    return [{k: v for k, v in e.items() if k not in keep} for e in entries(n, seed)]


def train(training: RunningService, n: int = 1500, seed: int = 0) -> str:
    """Send ``n`` samples, retrain now and return the published version."""
    response = httpx.post(training.url + "/add_training_data_bulk", json={"entries": entries(n, seed)})
    assert response.status_code == 202, response.text
    wait_until(
        lambda: httpx.get(training.url + "/data/status").json()["training_data"]["total_samples"] >= n,
        what="samples in the window",
        timeout_s=60,
    )
    outcome = httpx.post(training.url + "/retrain?wait=true", headers=AUTH, timeout=120.0).json()
    assert outcome["outcome"] == "published", outcome
    return str(outcome["version"])


def serving(service: RunningService, version: str) -> bool:
    return bool(httpx.get(service.url + "/status").json().get("model_version") == version)


@pytest.fixture(scope="package")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = tmp_path_factory.mktemp("wire")
    logs = base / "logs"
    training = start_service(
        "training_server",
        ["--data-dir", str(base / "training"), *TRAINING_FLAGS],
        log_dir=logs,
        ready_path="/readyz",
    )
    started: list[RunningService] = [training]
    try:
        version = train(training)
        fleet = Fleet(training, training, training, base, version)  # placeholders until started
        fleet.prediction = fleet.start_prediction(base / "training" / "models")
        started.append(fleet.prediction)
        wait_until(
            lambda: serving(fleet.prediction, version),
            what="prediction server on the trained version",
            timeout_s=60,
        )
        fleet.coalescer = fleet.start_coalescer(fleet.prediction, training.url)
        started.append(fleet.coalescer)
        yield fleet
    finally:
        for service in reversed(started):
            service.stop()


@pytest.fixture(params=["direct", "coalescer"])
def prediction_url(request: pytest.FixtureRequest, fleet: Fleet) -> str:
    """The scheduler's PREDICTION_SERVER_URL: the prediction server itself, or the coalescer."""
    return fleet.prediction.url if request.param == "direct" else fleet.coalescer.url


@pytest.fixture(params=["direct", "coalescer"])
def training_url(request: pytest.FixtureRequest, fleet: Fleet) -> str:
    """The scheduler's TRAINING_SERVER_URL: the training server itself, or the coalescer."""
    return fleet.training.url if request.param == "direct" else fleet.coalescer.url
