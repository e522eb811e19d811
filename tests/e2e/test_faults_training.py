"""Fault: the training server is SIGKILLed mid-ingest and restarted, with real processes.

Two prediction replicas keep serving throughout: one reads the store directory (a shared volume),
the other pulls it over HTTP from the training server (the multi-node topology), so while the
training server is dead its store is unreachable. Threads predict against both replicas and feed
samples the whole time. The restart resumes the window from its periodic save (no shutdown hook
ran), keeps the published model, and the next retrain reaches both replicas.

Graceful restarts and the exactness of the saved window are covered by
``tests/e2e/test_training_restart.py``; this test adds concurrent ingest, the kill itself and
prediction availability.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from tests.e2e.predicting import Predicting
from tests.load import LoadThreads
from tests.procs import RunningService, free_port, get_json, start_service, wait_until
from training_server import synthetic

pytestmark = pytest.mark.e2e

PERSIST_S = 0.5
TRAINING_FLAGS = [
    "--n-estimators", "20", "--min-train-samples", "200", "--trainer-nice", "0",
    "--persist-interval-s", str(PERSIST_S),
    # Retrains only when asked: the version serving at the kill is known exactly (no drift
    # retrains or calibration versions from live scoring either).
    "--min-new-samples", "1000000", "--retrain-interval-s", "3600", "--no-live-scoring",
]  # fmt: skip
ROWS = synthetic.to_entries(synthetic.pod_states(8, np.random.default_rng(0)))


class Feeding(LoadThreads):
    """A thread posting 250-sample batches every 50 ms; connection errors (a dead server) are retried."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.accepted = 0
        self.failed_calls = 0
        self.other: list[str] = []
        self._seed = 1000

    def step(self, client: httpx.Client, worker: int) -> None:
        entries = synthetic.to_entries(synthetic.samples(250, np.random.default_rng(self._seed)))
        try:
            response = client.post(
                self.url + "/add_training_data_bulk", content=orjson.dumps({"entries": entries})
            )
        except httpx.HTTPError:
            self.failed_calls += 1
            self.pause(0.1)
            return
        if response.status_code == 202:
            self.accepted += 250
            self._seed += 1
        elif response.status_code != 429:
            self.other.append(f"{response.status_code} {response.text[:200]}")
        self.pause(0.05)  # pacing: about 5,000 samples/s at most


def _retrain(url: str) -> str:
    outcome = httpx.post(url + "/retrain", params={"wait": "true"}, timeout=60).json()
    assert outcome["outcome"] == "published", outcome
    version: str = outcome["version"]
    return version


def _saved_samples(path: Path) -> int:
    with np.load(path, allow_pickle=False) as saved:
        return int(saved["data"].shape[0])


def test_sigkill_mid_ingest_then_restart_resumes_the_window_while_replicas_keep_serving(
    tmp_path: Path,
) -> None:
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    port = free_port()
    flags = ["--data-dir", str(data_dir), *TRAINING_FLAGS]
    services: list[RunningService] = []  # everything started, stopped at the end whatever happens
    try:
        training = start_service("training_server", flags, log_dir=logs, port=port)
        services.append(training)
        entries = synthetic.to_entries(synthetic.samples(4000, np.random.default_rng(1)))
        body = orjson.dumps({"entries": entries})
        assert httpx.post(training.url + "/add_training_data_bulk", content=body).status_code == 202
        wait_until(
            lambda: get_json(training.url + "/status")["window"]["samples"] == 4000, "the first samples"
        )
        first = _retrain(training.url)
        http_store = ["--store", training.url, "--cache-dir", str(tmp_path / "cache")]
        for store in (["--store", str(data_dir / "models")], http_store):  # a shared volume; over HTTP
            args = [*store, "--poll-interval-s", "0.1"]
            services.append(start_service("prediction_server", args, log_dir=logs, ready_path="/readyz"))
        urls = [r.url for r in services[1:]]
        wait_until(
            lambda: all(get_json(url + "/status")["model_version"] == first for url in urls),
            f"{first} served",
        )
        with Predicting(urls, ROWS) as predicting, Feeding(training.url) as feeding:
            window_file = data_dir / "window.npz"
            wait_until(
                lambda: feeding.accepted >= 5000 and _saved_samples(window_file) >= 7000, "saves under ingest"
            )
            before = get_json(training.url + "/status")["window"]["samples"]
            training.kill()  # SIGKILL while the feeder keeps posting: no shutdown hook, no final save
            saved = _saved_samples(window_file)
            calls_at_kill = {url: len(v) for url, v in predicting.versions.items()}
            wait_until(  # both replicas answer alone; the remote one cannot reach its store
                lambda: (
                    all(len(v) >= calls_at_kill[url] + 20 for url, v in predicting.versions.items())
                    and feeding.failed_calls > 0
                    and get_json(urls[1] + "/status")["store_reachable"] is False
                ),
                "both replicas answering through the outage",
            )
            outage = {url: v[calls_at_kill[url] :] for url, v in predicting.versions.items()}
            training = start_service("training_server", flags, log_dir=logs, port=port)
            services.append(training)
            restored = get_json(training.url + "/status")
            # The periodic save bounds what a crash loses: at most about one persist interval of
            # ingest (the feeder sends about 5,000 samples/s at most; the bound is generous).
            assert restored["window"]["samples"] >= saved >= before - 10_000, (before, saved, restored)
            assert restored["current_version"] == first and restored["is_prior"] is False
            # Ingestion resumes on the same port; the next retrain reaches both replicas.
            resumed = restored["window"]["samples"]
            wait_until(
                lambda: get_json(training.url + "/status")["window"]["samples"] > resumed,
                "ingestion after the restart",
            )
            second = _retrain(training.url)
            wait_until(
                lambda: all(predicting.versions[url][-1] == second for url in urls), f"{second} served"
            )
        assert predicting.errors == [], predicting.errors[:5]
        assert feeding.other == [], feeding.other[:5]
        assert feeding.failed_calls > 0, "the feeder really was mid-ingest when the server died"
        for url, versions in outage.items():
            assert len(versions) >= 20 and set(versions) == {first}, (url, len(versions), set(versions))
        status = get_json(urls[1] + "/status")
        assert status["store_reachable"] is True and status["model_version"] == second
    finally:
        for service in services:
            service.stop()
