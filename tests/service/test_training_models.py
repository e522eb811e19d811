"""The training server in process: retraining, the model store over HTTP, tree dumps, the
automatic retrain trigger and window persistence across an app restart."""

from __future__ import annotations

from pathlib import Path

import orjson

from shared.artifacts import MODEL_NAMES, Manifest, verify_model_set
from shared.model_store import ModelStore
from tests.procs import wait_until
from tests.service.test_training_api import (
    TestClient,
    entries,
    make_settings,
    metric,
    post_entries,
    service_of,
)
from training_server.app import create_app


def _fill(client: TestClient, batches: int, size: int = 1000) -> None:
    for i in range(batches):
        assert post_entries(client, entries(size, seed=100 + i)).status_code == 202
    wait_until(
        lambda: service_of(client).window.size == batches * size, "the window", timeout_s=10, poll_s=0.01
    )


def test_retrain_publishes_and_replicas_can_pull_and_verify_over_http(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(tmp_path))) as client:
        _fill(client, 4)
        result = client.post("/retrain", params={"wait": "true"})
        assert result.status_code == 200
        body = result.json()
        assert body["outcome"] == "published" and "trained" in body["version"]
        assert body["models"]["ttft"]["accepted"] and body["models"]["tpot"]["accepted"]

        listing = client.get("/models").json()
        assert listing["current"] == body["version"] and body["version"] in listing["versions"]
        raw_manifest = client.get("/models/current")
        assert raw_manifest.headers["content-type"].startswith("application/json")
        manifest = Manifest.from_json(raw_manifest.content)
        assert manifest.version == body["version"]
        by_version = client.get(f"/models/versions/{manifest.version}/manifest.json")
        assert by_version.content == raw_manifest.content
        files = {}
        for name in MODEL_NAMES:
            response = client.get(f"/models/versions/{manifest.version}/{manifest.models[name].file}")
            assert response.headers["content-type"] == "application/octet-stream"
            files[name] = response.content
        verify_model_set(manifest, files)  # what a replica on another machine does
        assert ModelStore(service_of(client).settings.store_dir).load().manifest == manifest

        assert client.get("/models/versions/999999-none/manifest.json").status_code == 404
        assert client.get(f"/models/versions/{manifest.version}/nope.ubj").status_code == 404
        assert client.get(f"/models/versions/{manifest.version}/.hidden").status_code == 404
        # A NUL byte or a traversal in a store path is a clean 404, not a 500.
        assert client.get(f"/models/versions/{manifest.version}%00/manifest.json").status_code == 404
        assert client.get(f"/models/versions/{manifest.version}/ttft.ubj%00").status_code == 404
        assert client.get("/models/versions/..%2F..%2Fetc/passwd").status_code == 404
        # The cheap poll: If-None-Match with the current ETag is a bodiless 304.
        etag = raw_manifest.headers["etag"]
        unchanged = client.get("/models/current", headers={"If-None-Match": etag})
        assert unchanged.status_code == 304 and unchanged.content == b""
        assert client.get("/models/current", headers={"If-None-Match": '"other"'}).status_code == 200

        status = client.get("/status").json()
        assert status["is_prior"] is False and status["current_version"] == manifest.version
        assert status["training"]["last_outcome"] == "published"
        assert status["current_metrics"]["ttft"]["coverage"] > 0.5
        assert metric(client, "training_publishes_total") == 1
        assert metric(client, 'training_runs_total{outcome="published"}') == 1
        assert 0.5 < metric(client, 'training_model_coverage{model="ttft",role="current"}') <= 1
        assert metric(client, 'training_model_pinball_loss_ms{model="tpot",role="candidate"}') > 0
        assert metric(client, "training_run_seconds_count") == 1


def test_tree_dumps_follow_the_current_version(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(tmp_path, n_estimators=12))) as client:
        prior_trees = client.get("/model/ttft/xgb/json").json()
        assert isinstance(prior_trees, list) and prior_trees and "nodeid" in prior_trees[0]
        _fill(client, 2)
        assert client.post("/retrain", params={"wait": "true"}).json()["outcome"] == "published"
        for name in MODEL_NAMES:
            response = client.get(f"/model/{name}/xgb/json")
            assert response.status_code == 200
            trees = orjson.loads(response.content)
            assert len(trees) == 12 and all("nodeid" in tree for tree in trees)
        assert client.get("/model/other/xgb/json").status_code == 404


def test_enough_new_samples_trigger_a_retrain_without_asking(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, min_new_samples=2000, retrain_min_gap_s=0)
    with TestClient(create_app(settings)) as client:
        _fill(client, 2)
        wait_until(
            lambda: client.get("/status").json()["is_prior"] is False,
            "a trained model",
            timeout_s=30,
            poll_s=0.01,
        )
        status = client.get("/status").json()
        assert status["training"]["runs"] == 1 and status["training"]["new_samples"] == 0


def test_window_survives_an_app_restart_without_a_cold_start(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with TestClient(create_app(settings)) as client:
        _fill(client, 3)
        assert client.post("/retrain", params={"wait": "true"}).json()["outcome"] == "published"
        strata = client.get("/status").json()["window"]["strata"]
    assert settings.window_path.exists()  # saved on shutdown
    # Read after shutdown: the live scorer may still publish a calibration of the trained version
    # (it scores the samples in the background) until the app stops.
    version = ModelStore(settings.store_dir).current_version()
    assert version is not None and not version.endswith("-prior")
    with TestClient(create_app(settings)) as client:
        status = client.get("/status").json()
        assert status["window"]["samples"] == 3000 and status["window"]["strata"] == strata
        assert status["current_version"] == version and status["is_prior"] is False
        assert client.get("/models").json()["versions"][-1] == version  # no prior republished


def test_a_restored_window_replaces_the_prior_at_start(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)  # no automatic retrain while running
    with TestClient(create_app(settings)) as client:
        _fill(client, 2)
        assert client.get("/status").json()["is_prior"] is True
    with TestClient(create_app(settings)) as client:
        wait_until(
            lambda: client.get("/status").json()["is_prior"] is False,
            "a trained model",
            timeout_s=30,
            poll_s=0.01,
        )
        assert client.get("/status").json()["training"]["last_outcome"] == "published"


def test_a_drift_request_retrains_at_once_and_model_age_is_reported(tmp_path: Path) -> None:
    """``request_now`` (the drift detector's call, from any thread) starts a retrain without new-sample
    or interval triggers; ``/status`` and ``/metrics`` report the serving version's age."""
    with TestClient(create_app(make_settings(tmp_path))) as client:
        _fill(client, 2)
        prior_age = client.get("/status").json()["current_age_s"]
        assert prior_age is not None and prior_age >= 0
        wait_until(
            lambda: metric(client, "training_model_age_seconds") > prior_age,
            "the serving model to age",
            timeout_s=10,
            poll_s=0.01,
        )
        service_of(client).scheduler.request_now("drift: ttft coverage fell in waiting=8-15")
        wait_until(
            lambda: client.get("/status").json()["is_prior"] is False,
            "a trained model",
            timeout_s=30,
            poll_s=0.01,
        )
        status = client.get("/status").json()
        assert status["training"]["last_trigger"] == "drift: ttft coverage fell in waiting=8-15"
        assert status["current_age_s"] < metric(client, "training_model_age_seconds") + 1.0
        assert status["current_age_s"] < 10.0
