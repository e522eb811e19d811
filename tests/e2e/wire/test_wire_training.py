"""wire-contract.md section 3 (and the read-only rows of section 5), row by row, against real
processes: the training server directly and the coalescer as TRAINING_SERVER_URL."""

from __future__ import annotations

import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.e2e.wire.conftest import Fleet, entries
from tests.e2e.wire.test_wire_prediction import zoned
from tests.procs import free_port, start_service, wait_until

pytestmark = pytest.mark.e2e


def bulk(url: str, body: Any) -> httpx.Response:
    return httpx.post(url + "/add_training_data_bulk", json=body, timeout=30.0)


def window_total(fleet: Fleet) -> int:
    return int(httpx.get(fleet.training.url + "/data/status").json()["training_data"]["total_samples"])


def test_bulk_ingest_answers_exactly_202_and_the_samples_arrive(training_url: str, fleet: Fleet) -> None:
    before = window_total(fleet)
    response = bulk(training_url, {"entries": entries(40, seed=5)})
    assert response.status_code == 202
    assert response.json() == {"message": "Accepted 40 training samples."}
    wait_until(lambda: window_total(fleet) >= before + 40, what="relayed samples in the window", timeout_s=60)


def test_timestamps_with_zones_and_the_go_zero_time_are_accepted(training_url: str) -> None:
    now = time.time()
    stamps = [
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now)),
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now + 3600)) + ".123456+01:00",
        "0001-01-01T00:00:00Z",
    ]
    batch = [{**e, "timestamp": t} for e, t in zip(entries(4, seed=6), stamps, strict=True)]
    assert bulk(training_url, {"entries": batch}).status_code == 202
    bad = bulk(training_url, {"entries": [{**batch[0], "timestamp": "yesterday"}]})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "entries", 0, "timestamp"]


def test_predicted_latency_fields_are_accepted_and_validated(training_url: str, fleet: Fleet) -> None:
    before = window_total(fleet)
    batch = entries(5, seed=7, predicted_ttft_ms=120.5, predicted_tpot_ms=9.25)
    batch[0] = {**batch[0], "predicted_ttft_ms": 0}  # 0: not sent
    assert bulk(training_url, {"entries": batch}).status_code == 202
    # Relayed as sent, the training server accepts them too (a 422 there would drop the batch).
    wait_until(
        lambda: window_total(fleet) >= before + 5, what="samples with predicted_* in the window", timeout_s=60
    )
    bad = bulk(training_url, {"entries": [{**batch[1], "predicted_tpot_ms": -1.0}]})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "entries", 0, "predicted_tpot_ms"]
    wrong = bulk(training_url, {"entries": [{**batch[1], "predicted_ttft_ms": "fast"}]})
    assert wrong.status_code == 422


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda e: e.pop("actual_ttft_ms"), "actual_ttft_ms"),
        (lambda e: e.update(actual_tpot_ms=-3.0), "actual_tpot_ms"),
        (lambda e: e.update(num_request_running=True), "num_request_running"),
        (lambda e: e.update(input_token_length=2.5), "input_token_length"),
        (lambda e: e.update(kv_cache_percentage=1.5), "kv_cache_percentage"),
    ],
)
def test_one_invalid_entry_is_a_precise_422_for_the_whole_batch(
    training_url: str, fleet: Fleet, mutate: Any, field: str
) -> None:
    batch = entries(10, seed=8)
    mutate(batch[7])
    response = bulk(training_url, {"entries": batch})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "entries", 7, field]


def test_bad_bodies_are_422(training_url: str) -> None:
    for body in ({}, {"entries": []}, {"entries": "x"}, [1]):
        assert bulk(training_url, body).status_code == 422
    raw = httpx.post(training_url + "/add_training_data_bulk", content=b"{not json")
    assert raw.status_code == 422


def test_saturated_ingestion_is_429_with_retry_after(fleet: Fleet, tmp_path: Any) -> None:
    # Directly: one ingest request may be read at a time; a second, while the first body is still
    # arriving, is refused with 429.
    training = fleet.start_training(tmp_path / "t", "--max-concurrent-ingest-requests", "1")
    try:
        host, port = urlsplit(training.url).hostname, urlsplit(training.url).port
        with socket.create_connection((host, port)) as slow:
            slow.sendall(
                b"POST /add_training_data_bulk HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n{"
            )

            def refused() -> httpx.Response | None:
                r = bulk(training.url, {"entries": entries(2)})
                return r if r.status_code == 429 else None

            response = wait_until(refused, timeout_s=20, what="a 429 while another body is being read")
            assert int(response.headers["Retry-After"]) >= 1
    finally:
        training.stop()
    # Through the coalescer: it acknowledges nothing the training server has not taken (the
    # training server is gone: 503 with Retry-After), and beyond its admission rate it answers 429.
    dead = f"http://127.0.0.1:{free_port()}"
    coalescer = fleet.start_coalescer(
        fleet.prediction,
        dead,
        "--relay-max-rate",
        "1",
        "--relay-min-rate",
        "0.5",
        "--relay-wait-budget-s",
        "1",
    )
    try:
        unreachable = bulk(coalescer.url, {"entries": entries(10)})
        assert unreachable.status_code == 503 and int(unreachable.headers["Retry-After"]) >= 1
        response = bulk(coalescer.url, {"entries": entries(5)})
        assert response.status_code == 429 and int(response.headers["Retry-After"]) >= 1
    finally:
        coalescer.stop()


def test_model_download_info_has_boolean_model_status(training_url: str, fleet: Fleet) -> None:
    response = httpx.get(training_url + "/model/download/info")
    assert response.status_code == 200
    body = response.json()
    assert body["model_type"] == "xgboost"
    assert isinstance(body["quantile"], float) and isinstance(body["objective_type"], str)
    assert isinstance(body["available_endpoints"], dict)
    assert body["model_status"] and all(v is True for v in body["model_status"].values())
    assert body == httpx.get(fleet.training.url + "/model/download/info").json()


@pytest.mark.parametrize("name", ["ttft", "tpot"])
def test_tree_dumps_are_json_arrays(training_url: str, fleet: Fleet, name: str) -> None:
    response = httpx.get(training_url + f"/model/{name}/xgb/json")
    assert response.status_code == 200
    trees = response.json()
    assert isinstance(trees, list) and len(trees) == 30  # --n-estimators of the fleet
    assert trees[0]["nodeid"] == 0
    assert response.content == httpx.get(fleet.training.url + f"/model/{name}/xgb/json").content
    assert httpx.get(training_url + "/model/nope/xgb/json").status_code == 404


def test_health_and_readiness(training_url: str) -> None:
    assert httpx.get(training_url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(training_url + "/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_models_list_and_model_info(training_url: str, fleet: Fleet) -> None:
    listed = httpx.get(training_url + "/models/list").json()
    assert set(listed["models"]) == {"ttft", "tpot", "ttft_gated", "tpot_gated"}
    for name, entry in listed["models"].items():
        assert isinstance(entry["exists"], bool) and isinstance(entry["size_bytes"], int)
        assert entry["exists"] is (name in ("ttft", "tpot"))
        assert (entry["last_modified"] is None) is (not entry["exists"])
        assert entry["last_modified"] is None or zoned(entry["last_modified"])
    assert listed["model_type"] == "xgboost" and isinstance(listed["quantile"], float)
    assert zoned(listed["server_time"])
    manifest = httpx.get(fleet.training.url + "/models/current").json()
    for name in ("ttft", "tpot"):
        info = httpx.get(training_url + f"/model/{name}/info").json()
        assert info["model_name"] == name and info["exists"] is True
        assert info["size_bytes"] == manifest["models"][name]["size_bytes"] > 0
        assert zoned(info["last_modified"]) and info["model_type"] == "xgboost"
        assert info["quantile"] == manifest["quantile"]
    gated = httpx.get(training_url + "/model/ttft_gated/info").json()
    assert gated["exists"] is False and gated["size_bytes"] == 0
    unknown = httpx.get(training_url + "/model/lightgbm/info")
    assert unknown.status_code == 404


def test_root_is_a_json_object_naming_the_service(training_url: str) -> None:
    body = httpx.get(training_url + "/").json()
    assert body["model_type"] == "xgboost" and isinstance(body["quantile"], float | None)
    assert isinstance(body["is_ready"], bool) and body["service"] in ("training_server", "coalescer")
    if body["service"] == "coalescer":
        assert body["training_server"]["service"] == "training_server"


def test_training_metrics_carry_our_series_and_the_llmd_names(fleet: Fleet) -> None:
    text = httpx.get(fleet.training.url + "/metrics").text
    assert "training_samples_accepted_total" in text and "training_model_version_info" in text
    for line in (
        'model_type{model="ttft",type="xgboost"} 1.0',
        'model_type{model="tpot",type="xgboost"} 1.0',
        "ensemble_active 0.0",
        "ensemble_mode 0.0",
    ):
        assert line in text.splitlines(), line
    samples = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("training_samples_count{")
    }
    assert samples['training_samples_count{model="ttft"}'] > 0
    for name in ("ttft", "tpot"):
        shares = {
            line.split("{")[1].split('"')[1]: float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(f"{name}_importance{{")
        }
        assert "input_token_length" in shares and "prefix_cache_score" in shares
        assert abs(sum(shares.values()) - 1.0) < 1e-6 and all(v >= 0 for v in shares.values())
    assert (
        max(
            (float(line.split()[-1]), line)
            for line in text.splitlines()
            if line.startswith("ttft_importance{")
        )[0]
        > 0.05
    )


def test_the_coalescer_caches_training_reads_and_survives_the_training_server_going_away(
    fleet: Fleet, tmp_path: Any
) -> None:
    training = fleet.start_training(tmp_path / "t")
    coalescer = fleet.start_coalescer(fleet.prediction, training.url, "--training-cache-s", "60")
    try:
        first = httpx.get(coalescer.url + "/model/download/info")
        assert first.status_code == 200 and first.headers["x-cache"] == "miss"
        again = httpx.get(coalescer.url + "/model/download/info")
        assert again.headers["x-cache"] == "hit" and again.content == first.content
        training.kill()
        # Cached: still answered (the Go client must not lose readiness while training restarts).
        assert httpx.get(coalescer.url + "/model/download/info").json() == first.json()
        # Never fetched: a 503 saying why. Predictions are not affected.
        missing = httpx.get(coalescer.url + "/model/ttft/xgb/json")
        assert missing.status_code == 503
        assert "training server" in missing.json()["detail"] and "unreachable" in missing.json()["detail"]
        row = {k: v for k, v in entries(1)[0].items() if not k.startswith(("actual", "timestamp"))}
        assert httpx.post(coalescer.url + "/predict", json=row, timeout=30).status_code == 200
    finally:
        coalescer.stop()
        training.stop()


def test_a_coalescer_without_a_training_server_says_so(fleet: Fleet, tmp_path: Any) -> None:
    coalescer = start_service(
        "coalescer", ["--prediction-urls", fleet.prediction.url], log_dir=fleet.log_dir, ready_path="/readyz"
    )
    try:
        response = httpx.get(coalescer.url + "/model/download/info")
        assert response.status_code == 503 and "--training-url" in response.json()["detail"]
        assert orjson.loads(httpx.get(coalescer.url + "/").content)["training_server"] is None
    finally:
        coalescer.stop()
