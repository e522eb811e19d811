"""Corrupt input files never stop a service: real training servers and replicas start on damaged
stores and data directories and serve the last good version.

A template data directory (two trained versions, a saved window) is built once by a real training
server; each test copies it, damages one file as a crash, a bad disk or a bad copy would, and
starts real processes on it: the training server quarantines the file (``<store>/quarantine/``,
``window.npz.corrupt-*``), counts it and starts on the newest version that verifies, without
publishing a prior over trained versions; a replica reading the damaged store serves the newest
good trained version, not the prior, and ``/status`` says what is wrong.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from tests.procs import RunningService, get_json, start_service, wait_until
from training_server import synthetic

pytestmark = pytest.mark.e2e

FLAGS = ["--n-estimators", "20", "--min-train-samples", "200", "--trainer-nice", "0",
         "--min-new-samples", "1000000", "--retrain-interval-s", "3600"]  # fmt: skip


def _training(data_dir: Path, logs: Path) -> RunningService:
    return start_service("training_server", ["--data-dir", str(data_dir), *FLAGS], log_dir=logs)


def _replica(store: Path, logs: Path) -> RunningService:
    args = ["--store", str(store), "--poll-interval-s", "0.2"]
    return start_service("prediction_server", args, log_dir=logs, ready_path="/readyz")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A data directory with two trained versions (the second current) and a saved window."""
    root = tmp_path_factory.mktemp("template")
    data_dir = root / "data"
    server = _training(data_dir, root / "logs")
    versions = []
    try:
        for seed in (1, 2):
            entries = synthetic.to_entries(synthetic.samples(2000, np.random.default_rng(seed)))
            body = orjson.dumps({"entries": entries})
            assert httpx.post(server.url + "/add_training_data_bulk", content=body).status_code == 202
            wait_until(
                lambda s=seed: get_json(server.url + "/status")["window"]["samples"] == 2000 * s, "the window"
            )
            trained = httpx.post(server.url + "/retrain", params={"wait": "true"}, timeout=120).json()
            assert trained["outcome"] == "published", trained
            versions.append(trained["version"])
    finally:
        assert server.stop() in (0, -signal.SIGTERM)
    return data_dir, versions


def _copy(template: tuple[Path, list[str]], tmp_path: Path) -> tuple[Path, Path, list[str]]:
    data_dir = tmp_path / "data"
    shutil.copytree(template[0], data_dir)
    return data_dir, data_dir / "models", template[1]


def _assert_training_serves(server: RunningService, version: str, kind: str) -> None:
    status = get_json(server.url + "/status")
    assert status["current_version"] == version and status["is_prior"] is False, status
    listing = get_json(server.url + "/models")
    assert listing["current"] == version
    assert not any("prior" in v for v in listing["versions"] if v > version), "a prior published over them"
    assert f'training_quarantined_files_total{{kind="{kind}"}} 1.0' in httpx.get(server.url + "/metrics").text


def test_current_that_is_not_utf8(template: tuple[Path, list[str]], tmp_path: Path) -> None:
    data_dir, store, (_, newest) = _copy(template, tmp_path)
    (store / "CURRENT").write_bytes(b"\xff\xfe\x00\x9c garbage")
    replica = _replica(store, tmp_path / "logs")
    try:
        status = get_json(replica.url + "/status")
        assert status["model_version"] == newest, status  # the newest good version, not the prior
        assert status["store_current_readable"] is False
        training = _training(data_dir, tmp_path / "logs")
        try:
            _assert_training_serves(training, newest, "current")
            assert (store / "CURRENT").read_text() == newest
            assert list((store / "quarantine").glob("CURRENT.*"))
        finally:
            training.stop()
        wait_until(
            lambda: get_json(replica.url + "/status")["store_current_readable"] is True,
            "CURRENT readable again",
        )
    finally:
        replica.stop()


@pytest.mark.parametrize("damaged_file", ["manifest.json", "ttft.ubj"])
def test_a_truncated_current_version(
    template: tuple[Path, list[str]], tmp_path: Path, damaged_file: str
) -> None:
    data_dir, store, (_, newest) = _copy(template, tmp_path)
    # The last good version: the newest non-prior one before the damaged one (a drift-triggered
    # retrain or a calibration version may sit between the two explicit retrains).
    older = max(v.name for v in (store / "versions").iterdir() if v.name < newest and "prior" not in v.name)
    path = store / "versions" / newest / damaged_file
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    replica = _replica(store, tmp_path / "logs")
    try:
        status = get_json(replica.url + "/status")
        assert status["model_version"] == older, status  # falls back to the last good one, not the prior
        assert newest in status["refused_versions"]
        training = _training(data_dir, tmp_path / "logs")
        try:
            _assert_training_serves(training, older, "version")
            assert list((store / "quarantine").glob(f"{newest}.*"))
            assert get_json(training.url + "/status")["window"]["samples"] == 4000
            # The next version never reuses the quarantined name (replicas remember it as refused).
            trained = httpx.post(training.url + "/retrain", params={"wait": "true"}, timeout=120).json()
            assert trained["outcome"] == "published" and trained["version"] > newest, trained
            wait_until(
                lambda: get_json(replica.url + "/status")["model_version"] == trained["version"],
                "the new version",
            )
        finally:
            training.stop()
    finally:
        replica.stop()


def test_a_truncated_window_snapshot(template: tuple[Path, list[str]], tmp_path: Path) -> None:
    data_dir, _, (_, newest) = _copy(template, tmp_path)
    window = data_dir / "window.npz"
    window.write_bytes(window.read_bytes()[:1000])  # zipfile.BadZipFile before the fix
    training = _training(data_dir, tmp_path / "logs")
    try:
        status = get_json(training.url + "/status")
        assert status["current_version"] == newest and status["is_prior"] is False
        assert (
            'training_quarantined_files_total{kind="window"} 1.0' in httpx.get(training.url + "/metrics").text
        )
        assert list(data_dir.glob("window.npz.corrupt-*"))
        entries = synthetic.to_entries(synthetic.samples(500, np.random.default_rng(7)))
        body = orjson.dumps({"entries": entries})
        assert httpx.post(training.url + "/add_training_data_bulk", content=body).status_code == 202
        wait_until(lambda: get_json(training.url + "/status")["window"]["samples"] == 500, "ingestion")
    finally:
        training.stop()
