"""The training server in process (TestClient runs the lifespan): ingestion, validation, limits,
admin endpoints and the scheduler-facing read endpoints."""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.procs import wait_until

with warnings.catch_warnings():
    # starlette 1.x warns that its TestClient wants the httpx2 package; httpx works the same here.
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

from shared.model_store import ModelStore
from shared.prior import publish_prior
from training_server import synthetic
from training_server.app import create_app
from training_server.config import TrainingSettings
from training_server.service import TrainingService

TOKEN = "s3cret"


_PRIOR_STORES: dict[float, Path] = {}


def make_settings(tmp_path: Path, *, seed_prior: bool = True, **overrides: Any) -> TrainingSettings:
    """Small, fast settings; no automatic retrain unless a test asks for one.

    With ``seed_prior`` the store starts with a copy of a prior published once per test session
    (building the prior takes a while); tests of the cold start itself pass ``seed_prior=False``.
    """
    if seed_prior and not (tmp_path / "data" / "models").exists():
        quantile = float(overrides.get("quantile", 0.9))
        if quantile not in _PRIOR_STORES:
            root = Path(tmp_path.parent / f"prior-store-{quantile}")
            publish_prior(ModelStore(root), quantile)
            _PRIOR_STORES[quantile] = root
        shutil.copytree(_PRIOR_STORES[quantile], tmp_path / "data" / "models")
    base: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "n_estimators": 30,
        "min_train_samples": 200,
        "min_new_samples": 10_000_000,
        "retrain_interval_s": 3600,
        "persist_interval_s": 3600,
        "trainer_nice": 0,
    }
    return TrainingSettings(**{**base, **overrides})


def entries(n: int, seed: int = 0, **kw: int) -> list[dict[str, Any]]:
    return synthetic.to_entries(synthetic.samples(n, np.random.default_rng(seed), **kw))


def post_entries(client: TestClient, items: Any, **kw: Any) -> Any:
    return client.post("/add_training_data_bulk", content=orjson.dumps({"entries": items}), **kw)


def service_of(client: TestClient) -> TrainingService:
    app: Any = client.app
    service: TrainingService = app.state.service
    return service


def metric(client: TestClient, line_prefix: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(tmp_path, auth_token=TOKEN))) as c:
        yield c


@pytest.fixture
def cold_client(tmp_path: Path) -> Iterator[TestClient]:
    """A server on an empty data directory: it must publish the prior itself."""
    with TestClient(create_app(make_settings(tmp_path, seed_prior=False))) as c:
        yield c


def test_accepts_with_202_and_the_exact_message(client: TestClient) -> None:
    response = post_entries(client, entries(1000))
    assert response.status_code == 202
    assert response.json() == {"message": "Accepted 1000 training samples."}
    wait_until(
        lambda: service_of(client).window.size == 1000, "the intake to settle", timeout_s=10, poll_s=0.01
    )
    status = client.get("/status").json()
    assert status["window"]["samples"] == 1000 and status["intake"]["accepted_samples"] == 1000
    assert sum(status["window"]["strata"].values()) == 1000
    assert metric(client, "training_samples_accepted_total") == 1000
    assert metric(client, "training_window_samples") == 1000


def test_timestamps_and_optional_fields_are_honoured(client: TestClient) -> None:
    batch = entries(3)
    ten_minutes_ago = int(time.time()) - 600
    batch[0]["timestamp"] = datetime.fromtimestamp(ten_minutes_ago, UTC).isoformat().replace("+00:00", "Z")
    batch[1]["timestamp"] = "0001-01-01T00:00:00Z"  # the Go client's "unset": means now
    batch[2]["pod_type"] = None
    assert post_entries(client, batch).status_code == 202
    wait_until(lambda: service_of(client).window.size == 3, "the intake to settle", timeout_s=10, poll_s=0.01)
    stamps = sorted(service_of(client).window.snapshot().column("timestamp").tolist())
    assert stamps[0] == ten_minutes_ago
    assert stamps[1] == pytest.approx(time.time(), abs=60)


@pytest.mark.parametrize(
    ("mutate", "index", "field", "kind"),
    [
        (lambda e: e[3].update(kv_cache_percentage=1.5), 3, "kv_cache_percentage", "less_than_equal"),
        (lambda e: e[7].update(input_token_length=12.5), 7, "input_token_length", "int_from_float"),
        (lambda e: e[0].update(num_request_waiting=-1), 0, "num_request_waiting", "greater_than_equal"),
        (lambda e: e[9].pop("prefix_cache_score"), 9, "prefix_cache_score", "missing"),
        (lambda e: e[2].update(num_request_running="many"), 2, "num_request_running", "int_type"),
        (lambda e: e[5].update(pod_type="gpu"), 5, "pod_type", "enum"),
        (lambda e: e[1].update(pod_type=["decode"]), 1, "pod_type", "enum"),  # was a 500
        (lambda e: e[4].update(actual_ttft_ms=-3.0), 4, "actual_ttft_ms", "greater_than_equal"),
        (lambda e: e[6].update(timestamp="yesterday"), 6, "timestamp", "datetime_parsing"),
    ],
)
def test_invalid_entry_is_a_422_naming_index_and_field(
    client: TestClient, mutate: Any, index: int, field: str, kind: str
) -> None:
    batch = entries(10)
    mutate(batch)
    response = post_entries(client, batch)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail[0]["loc"] == ["body", "entries", index, field]
    assert detail[0]["type"] == kind and detail[0]["msg"]
    assert service_of(client).window.size == 0 and service_of(client).intake.pending_samples == 0
    assert metric(client, 'training_samples_rejected_total{reason="invalid_input"}') == 10
    intake = client.get("/status").json()["intake"]
    assert intake["rejected_requests"] == {"invalid_input": 1}
    assert intake["rejected_samples"] == {"invalid_input": 10}
    # Nothing else is affected: the next valid batch goes in whole.
    assert post_entries(client, entries(10, seed=1)).status_code == 202
    wait_until(
        lambda: service_of(client).window.size == 10, "the intake to settle", timeout_s=10, poll_s=0.01
    )


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b'{"entries": [', "json_invalid"),
        (b'{"entries": [{"kv_cache_percentage": NaN}]}', "json_invalid"),
        (b'{"entries": [{"kv_cache_percentage": 1e999}]}', "json_invalid"),
        (b'{"entries": []}', "too_short"),
        (b'{"entries": {"a": 1}}', "list_type"),
        (b'{"samples": []}', "missing"),
        (b"[1, 2]", "dict_type"),
        (b'{"entries": [1]}', "dict_type"),
    ],
)
def test_malformed_bodies_are_clear_422s(client: TestClient, body: bytes, kind: str) -> None:
    response = client.post("/add_training_data_bulk", content=body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == kind
    assert metric(client, 'training_ingest_requests_rejected_total{reason="invalid_input"}') == 1
    assert service_of(client).window.size == 0


def test_too_many_entries_and_oversized_bodies(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_entries_per_request=100, max_body_bytes=64 * 1024)
    with TestClient(create_app(settings)) as client:
        too_many = post_entries(client, entries(101))
        assert too_many.status_code == 422 and too_many.json()["detail"][0]["type"] == "too_long"
        oversized = post_entries(client, entries(100) * 3)
        assert oversized.status_code == 413
        assert "limit" in oversized.json()["detail"]
        assert metric(client, 'training_ingest_requests_rejected_total{reason="payload_too_large"}') == 1
        assert service_of(client).window.size == 0


def test_saturated_intake_answers_429_with_retry_after(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_entries_per_request=1000, max_pending_samples=1000)
    with TestClient(create_app(settings)) as client:
        service = service_of(client)
        with service.window.lock:  # the inserter cannot insert: accepted samples stay pending
            assert post_entries(client, entries(1000)).status_code == 202
            wait_until(
                lambda: service.intake.pending_samples == 1000,
                "the intake to settle",
                timeout_s=10,
                poll_s=0.01,
            )
            refused = post_entries(client, entries(500, seed=1))
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) >= 1
            assert "saturated" in refused.json()["detail"]
        wait_until(
            lambda: service.window.size == 1000 and service.intake.pending_samples == 0,
            "the intake to settle",
            timeout_s=10,
            poll_s=0.01,
        )
        assert post_entries(client, entries(500, seed=2)).status_code == 202  # recovered
        wait_until(lambda: service.window.size == 1500, "the intake to settle", timeout_s=10, poll_s=0.01)
        assert metric(client, 'training_samples_rejected_total{reason="ingest_saturated"}') == 500


def test_flush_and_retrain_need_the_token(client: TestClient) -> None:
    assert post_entries(client, entries(300)).status_code == 202
    wait_until(
        lambda: service_of(client).window.size == 300, "the intake to settle", timeout_s=10, poll_s=0.01
    )
    assert client.post("/flush").status_code == 401
    assert client.post("/flush", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/retrain").status_code == 401
    flushed = client.post("/flush", headers={"Authorization": f"Bearer {TOKEN}"})
    assert flushed.status_code == 200 and flushed.json()["flushed_samples"] == 300
    assert service_of(client).window.size == 0
    # The persisted copy is empty too (a snapshot past the journal's flush record, so a restart
    # replays nothing from before the flush).
    with np.load(service_of(client).settings.window_path, allow_pickle=False) as saved:
        assert saved["data"].shape[0] == 0
    assert metric(client, 'training_window_evicted_samples_total{reason="flush"}') == 300


def test_ingest_can_require_the_token(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, auth_token=TOKEN, token_protects_ingest=True)
    with TestClient(create_app(settings)) as client:
        assert post_entries(client, entries(5)).status_code == 401
        ok = post_entries(client, entries(5), headers={"X-Auth-Token": TOKEN})
        assert ok.status_code == 202


def test_prior_is_ready_immediately_and_says_so(cold_client: TestClient) -> None:
    client = cold_client
    ready = client.get("/readyz")
    assert ready.status_code == 200 and "prior" in ready.json()["model_version"]
    assert client.get("/healthz").json() == {"status": "ok"}
    status = client.get("/status").json()
    assert status["is_prior"] is True and "prior" in status["current_version"]
    info = client.get("/model/download/info").json()
    assert info["model_type"] == "xgboost" and info["quantile"] == 0.9
    assert info["objective_type"] == "quantile"
    assert info["model_status"] and all(v is True for v in info["model_status"].values())
    assert info["available_endpoints"]["trees"]["ttft_trees"] == "/model/ttft/xgb/json"
    manifest = client.get("/models/current").json()
    assert manifest["kind"] == "prior" and manifest["training_samples"] == {"ttft": 0, "tpot": 0}
    assert 'training_model_version_info{kind="prior"' in client.get("/metrics").text


def test_samples_too_old_on_arrival_are_accepted_not_kept_and_reported(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(tmp_path, max_age_s=3600))) as client:
        batch = entries(10)
        for entry in batch[:3]:
            entry["timestamp"] = "2020-01-01T00:00:00Z"
        batch[3]["timestamp"] = "1970-01-01T00:00:00Z"
        batch[4]["timestamp"] = "2999-01-01T00:00:00Z"  # sender clock far ahead: counts as now
        response = post_entries(client, batch)
        # Still 202 (the client drops a whole batch on anything else), but never silently.
        assert response.status_code == 202
        assert response.json()["message"] == (
            "Accepted 10 training samples; 4 of them are older than max-age (3600 s) and were discarded."
        )
        wait_until(
            lambda: service_of(client).window.size == 6, "the intake to settle", timeout_s=10, poll_s=0.01
        )
        assert service_of(client).window.snapshot().column("timestamp").max() <= time.time()
        assert metric(client, 'training_window_evicted_samples_total{reason="stale"}') == 4
        assert client.get("/status").json()["intake"]["stale_samples_discarded"] == 4
