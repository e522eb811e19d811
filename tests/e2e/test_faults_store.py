"""Fault: a damaged model version in the store of a real training server, with real replicas.

The training server publishes a trained version; two replicas serve it, one reading the store
directory, one pulling it over the training server's own HTTP store API. Then the store is
damaged behind the servers' backs, as a disk-full partial write or a bad copy would: a new
version whose model file is truncated becomes current, then one whose manifest is truncated.
Both replicas refuse both, keep serving the trained version (threads predicting throughout see
no error), and switch to the next good version the training server publishes, which it does
although its own current version is unreadable.

A same-size tampered file (checksum mismatch) in a local store and in a minimal HTTP store is
covered by ``tests/e2e/test_prediction_server.py``; this test adds truncation, an unreadable
manifest and the real training server's HTTP store path.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from shared.artifacts import MANIFEST_FILE
from shared.model_store import ModelStore
from tests.e2e.predicting import Predicting
from tests.procs import RunningService, start_service, wait_until
from training_server import synthetic

pytestmark = pytest.mark.e2e

TRAINING_FLAGS = [
    "--n-estimators", "20", "--min-train-samples", "200", "--trainer-nice", "0",
    "--min-new-samples", "1000000", "--retrain-interval-s", "3600",  # retrains only when asked
]  # fmt: skip
ROWS = synthetic.to_entries(synthetic.pod_states(8, np.random.default_rng(0)))


def _damaged_copy(store: ModelStore, source: str, damage: Callable[[Path], None]) -> str:
    """A new version with ``source``'s files and manifest, damaged, then made current atomically."""
    sequence = 1 + max(int(v.split("-", 1)[0]) for v in store.versions())
    version = f"{sequence:06d}-trained"
    staging = store.root / f".staging-{uuid.uuid4().hex}"
    shutil.copytree(store.versions_dir / source, staging)
    manifest = orjson.loads((staging / MANIFEST_FILE).read_bytes())
    manifest.update(version=version, sequence=sequence)
    (staging / MANIFEST_FILE).write_bytes(orjson.dumps(manifest))
    damage(staging)
    os.rename(staging, store.versions_dir / version)
    pointer = store.root / f".CURRENT.{uuid.uuid4().hex}"
    pointer.write_text(version)
    os.replace(pointer, store.root / "CURRENT")
    return version


def _truncate_model(directory: Path) -> None:
    path = directory / "ttft.ubj"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _truncate_manifest(directory: Path) -> None:
    path = directory / MANIFEST_FILE
    path.write_bytes(path.read_bytes()[:40])


def _status(url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(url + "/status", timeout=5).json()
    return body


def _feed_and_retrain(training: RunningService, seed: int) -> str:
    entries = synthetic.to_entries(synthetic.samples(3000, np.random.default_rng(seed)))
    response = httpx.post(
        training.url + "/add_training_data_bulk", content=orjson.dumps({"entries": entries})
    )
    assert response.status_code == 202
    target = 3000 * (seed + 1)
    wait_until(lambda: _status(training.url)["window"]["samples"] >= target, "samples in the window")
    outcome = httpx.post(training.url + "/retrain", params={"wait": "true"}, timeout=60).json()
    assert outcome["outcome"] == "published", outcome
    version: str = outcome["version"]
    return version


def test_truncated_files_in_the_store_are_refused_and_the_trained_version_keeps_serving(
    tmp_path: Path,
) -> None:
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    training = start_service("training_server", ["--data-dir", str(data_dir), *TRAINING_FLAGS], log_dir=logs)
    replicas: list[RunningService] = []
    try:
        good = _feed_and_retrain(training, seed=0)
        for store_arg in (str(data_dir / "models"), training.url):
            replicas.append(
                start_service(
                    "prediction_server",
                    ["--store", store_arg, "--poll-interval-s", "0.1"],
                    log_dir=logs,
                    ready_path="/readyz",
                )
            )
        urls = [r.url for r in replicas]
        wait_until(
            lambda: all(_status(url)["model_version"] == good for url in urls), f"both to serve {good}"
        )
        store = ModelStore(data_dir / "models")
        with Predicting(urls, ROWS) as predicting:
            truncated = _damaged_copy(store, good, _truncate_model)
            wait_until(lambda: all(truncated in _status(url)["refused_versions"] for url in urls), "refusals")
            unreadable = _damaged_copy(store, good, _truncate_manifest)
            wait_until(
                lambda: all(len(_status(url)["refused_versions"]) == 2 for url in urls), "second refusals"
            )
            # More polls (0.1 s each) while the good version keeps answering: refusals are remembered.
            answered = {url: len(v) for url, v in predicting.versions.items()}
            wait_until(
                lambda: all(
                    len(v) >= answered[url] + 40 * len(ROWS) for url, v in predicting.versions.items()
                ),
                "more predictions after the refusals",
            )
            damaged_versions = {url: set(v) for url, v in predicting.versions.items()}
            statuses = {url: _status(url) for url in urls}
            # The training server's own current version is unreadable: it still trains and publishes.
            recovered = _feed_and_retrain(training, seed=1)
            wait_until(
                lambda: all(_status(url)["model_version"] == recovered for url in urls), "the next version"
            )
        assert predicting.errors == [], predicting.errors[:5]
        for url in urls:
            assert damaged_versions[url] == {good}, damaged_versions
            status = statuses[url]
            assert status["model_version"] == good
            assert "checksum mismatch" in status["refused_versions"][truncated], status["refused_versions"]
            assert unreadable not in predicting.versions[url]
        assert statuses[urls[1]]["store_reachable"] is True
        assert recovered not in (truncated, unreadable)
        assert int(recovered.split("-")[0]) > int(unreadable.split("-")[0])
    finally:
        for service in [*replicas, training]:
            service.stop()
