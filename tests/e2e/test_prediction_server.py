"""The prediction server as real processes on loopback: hot reload under load, refusal, HTTP pulls."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from shared.model_store import ModelStore
from tests.load import LoadThreads
from tests.prediction_support import (
    ROW,
    publish_corrupt,
    publish_trained,
    random_rows,
    serve_store_over_http,
    train_models,
)
from tests.procs import RunningService, start_service, wait_until

pytestmark = pytest.mark.e2e

SWITCH_DEADLINE_S = 1.5
_MODEL_SEQUENCE = re.compile(r'^prediction_model_sequence\{pid="(\d+)"\} ([0-9.]+)$', re.M)


def worker_versions(url: str) -> dict[int, int]:
    """Each live worker's served version (its sequence number), from one /metrics scrape."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {int(pid): int(float(sequence)) for pid, sequence in _MODEL_SEQUENCE.findall(text)}


def metric_total(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


class Hammer(LoadThreads):
    """Threads sending /predict/bulk/strict back to back; records every failure and answering version."""

    def __init__(self, url: str, threads: int = 2, rows: int = 20) -> None:
        super().__init__(threads, timeout_s=10)
        self.url = url
        self.body = {"requests": random_rows(rows, np.random.default_rng(0))}
        self.versions: set[str] = set()
        self.calls = 0

    def step(self, client: httpx.Client, worker: int) -> None:
        try:
            response = client.post(f"{self.url}/predict/bulk/strict", json=self.body)
            if response.status_code != 200:
                self.errors.append(f"{response.status_code}: {response.text[:200]}")
                return
            predictions = response.json()["predictions"]
            if len(predictions) != len(self.body["requests"]):
                self.errors.append("wrong number of predictions")
            with self.lock:
                self.versions.update(p["model_version"] for p in predictions)
                self.calls += 1
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def server(store: ModelStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    service = start_service(
        "prediction_server",
        ["--store", str(store.root), "--workers", "2", "--poll-interval-s", "0.25", "--expose-internals"],
        log_dir=tmp_path_factory.mktemp("logs"),
        ready_path="/readyz",
    )
    try:
        wait_until(lambda: len(worker_versions(service.url)) == 2, lambda: service.logs()[-3000:])
        yield service
    finally:
        code = service.stop()
        assert code == 0, service.logs()[-3000:]


def wait_all_workers(url: str, sequence: int, started: float) -> float:
    """Seconds from ``started`` until every worker serves version ``sequence`` (or a deadline passes)."""

    def switched() -> bool:
        versions = worker_versions(url)
        return len(versions) == 2 and set(versions.values()) == {sequence}

    wait_until(
        switched,
        lambda: f"workers still serve {worker_versions(url)}, expected {sequence}",
        timeout_s=SWITCH_DEADLINE_S + 3 - (time.monotonic() - started),
        poll_s=0.02,
    )
    return time.monotonic() - started


def test_two_workers_switch_to_each_new_version_within_the_deadline_under_load(
    server: RunningService, store: ModelStore
) -> None:
    # Both workers serve one version at the start, whichever test ran before (the built-in prior
    # when this one runs first).
    assert len(set(worker_versions(server.url).values())) == 1
    initial = httpx.get(f"{server.url}/status", timeout=5).json()["model_version"]
    models = [train_models(seed) for seed in (1, 2, 3)]  # trained up front: publishing is the event
    published, switch_s = [], []
    with Hammer(server.url) as hammer:
        wait_until(lambda: hammer.calls >= 5, "load before the first publication")
        for files in models:
            manifest = store.publish("trained", files, objective="quantile", quantile=0.9)
            published.append(manifest.version)
            started = time.monotonic()
            switch_s.append(wait_all_workers(server.url, manifest.sequence, started))
            assert switch_s[-1] <= SWITCH_DEADLINE_S, f"{manifest.version} took {switch_s[-1]:.2f}s"
            # Every connection, whichever worker accepts it, now answers with the new version.
            seen: dict[int, str] = {}
            for attempt in range(80):
                status = httpx.get(f"{server.url}/status", timeout=5).json()
                assert status["model_version"] == manifest.version, status
                seen[status["worker_pid"]] = status["model_version"]
                if len(seen) == 2 and attempt >= 10:
                    break
            assert len(seen) == 2
            calls = hammer.calls
            wait_until(lambda: hammer.calls >= calls + 5, "load on the new version")  # noqa: B023
    assert hammer.errors == []
    assert hammer.calls > 20
    assert hammer.versions <= {initial, *published}
    assert published[-1] in hammer.versions
    print(f"switch times under load: {[round(s, 3) for s in switch_s]} s, {hammer.calls} calls")


def test_a_corrupt_version_is_refused_by_every_worker_and_the_previous_keeps_serving(
    server: RunningService, store: ModelStore
) -> None:
    serving = set(worker_versions(server.url).values())
    assert len(serving) == 1
    serving_name = httpx.get(f"{server.url}/status", timeout=5).json()["model_version"]
    refused_before = metric_total(server.url, "prediction_refused_versions_total")
    with Hammer(server.url, threads=1) as hammer:
        bad = publish_corrupt(store, seed=9)
        wait_until(
            lambda: metric_total(server.url, "prediction_refused_versions_total") >= refused_before + 2,
            "the refusal counted by both workers",
            timeout_s=5,
        )
        # Pacing, not observing: a few more polls (0.25 s each) must not count the refusal again.
        time.sleep(0.6)
    assert metric_total(server.url, "prediction_refused_versions_total") == refused_before + 2
    assert set(worker_versions(server.url).values()) == serving
    assert hammer.errors == [] and hammer.versions == {serving_name}
    status = httpx.get(f"{server.url}/status", timeout=5).json()
    assert bad.version in status["refused_versions"]
    assert "checksum mismatch" in status["refused_versions"][bad.version]


def test_serving_workers_have_not_loaded_pandas(server: RunningService) -> None:
    pids = set(worker_versions(server.url))
    assert len(pids) == 2
    for pid in pids:
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "xgboost" in maps  # the check can see the libraries a worker loaded
        assert "/pandas/" not in maps and "/sklearn/" not in maps


def test_a_replica_pulls_and_verifies_versions_from_an_http_store(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "remote")
    with serve_store_over_http(store.root) as url:
        service = start_service(
            "prediction_server",
            ["--store", url, "--poll-interval-s", "0.2", "--cache-dir", str(tmp_path / "cache")],
            log_dir=tmp_path / "logs",
            ready_path="/readyz",
        )
        with service:
            assert _predict(service.url)["model_version"] == "builtin-prior"
            first = publish_trained(store, seed=4)
            _wait_version(service.url, first.version)
            bad = publish_corrupt(store, seed=5)

            def refused() -> dict[str, Any] | None:
                status: dict[str, Any] = httpx.get(f"{service.url}/status", timeout=5).json()
                return status if bad.version in status["refused_versions"] else None

            status = wait_until(refused, f"{bad.version} refused", timeout_s=10)
            assert status["model_version"] == first.version and bad.version in status["refused_versions"]
            assert status["training_server_url"] == url
            assert _predict(service.url)["model_version"] == first.version


def _predict(url: str) -> dict[str, Any]:
    response = httpx.post(f"{url}/predict", json=ROW, timeout=5)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _wait_version(url: str, version: str) -> None:
    wait_until(
        lambda: _predict(url)["model_version"] == version,
        f"the switch to {version}",
        timeout_s=SWITCH_DEADLINE_S + 1,
    )
