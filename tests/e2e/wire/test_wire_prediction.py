"""wire-contract.md sections 1 and 2, row by row, against real processes: the prediction server
directly and the coalescer in front of it (every test runs against both URLs)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.e2e.wire.conftest import AUTH, Fleet, rows
from tests.procs import RunningService, wait_until

pytestmark = pytest.mark.e2e

RFC3339_ZONED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
MODEL_TYPES = {"xgboost", "lightgbm", "bayesian_ridge"}


def zoned(value: Any) -> bool:
    """An RFC 3339 datetime with a zone, as the Go client parses it."""
    return (
        isinstance(value, str)
        and bool(RFC3339_ZONED.match(value))
        and datetime.fromisoformat(value).tzinfo is not None
    )


def check_prediction(p: dict[str, Any]) -> None:
    assert isinstance(p["ttft_ms"], float) and p["ttft_ms"] >= 0
    assert isinstance(p["tpot_ms"], float) and p["tpot_ms"] >= 0
    assert zoned(p["predicted_at"])
    assert p["model_type"] == "xgboost"
    assert isinstance(p["objective_type"], str) and isinstance(p["quantile"], float)
    assert p["last_model_load"] is None or zoned(p["last_model_load"])
    assert p["model_version"]


def post(url: str, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30.0, **kwargs)


def test_strict_bulk_answers_every_row_in_request_order(prediction_url: str) -> None:
    batch = rows(50)
    response = post(prediction_url, "/predict/bulk/strict", {"requests": batch})
    assert response.status_code == 200
    body = response.json()
    assert (body["total_requests"], body["successful_predictions"], body["failed_predictions"]) == (50, 50, 0)
    assert isinstance(body["processing_time_ms"], float)
    assert len(body["predictions"]) == 50
    for p in body["predictions"]:
        check_prediction(p)
    singles = [post(prediction_url, "/predict", row).json() for row in batch[:8]]
    assert [p["ttft_ms"] for p in body["predictions"][:8]] == [p["ttft_ms"] for p in singles]
    assert [p["tpot_ms"] for p in body["predictions"][:8]] == [p["tpot_ms"] for p in singles]
    assert len({p["ttft_ms"] for p in body["predictions"]}) > 1  # the rows differ, so do the answers


@pytest.mark.parametrize(
    "body",
    [
        {"requests": []},
        {"requests": "x"},
        {},
        {"requests": [{"kv_cache_percentage": 0.5}]},
        {"requests": [{**rows(1)[0], "kv_cache_percentage": 1.01}]},
        {"requests": [{**rows(1)[0], "num_request_waiting": 1.5}]},
        {"requests": [{**rows(1)[0], "num_request_running": True}]},
        {"requests": [{**rows(1)[0], "prefix_cache_score": "0.5"}]},
        {"requests": [{**rows(1)[0], "pod_type": "gpu"}]},
    ],
)
def test_strict_bulk_refuses_any_invalid_body_with_422(prediction_url: str, body: Any) -> None:
    response = post(prediction_url, "/predict/bulk/strict", body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][:2] == ["body", "requests"]


def test_strict_bulk_refuses_more_than_10000_rows(prediction_url: str) -> None:
    response = post(prediction_url, "/predict/bulk/strict", {"requests": rows(1) * 10_001})
    assert response.status_code == 422
    assert post(prediction_url, "/predict/bulk/strict", {"requests": rows(1) * 10_000}).status_code == 200


def test_single_prediction_and_its_validation(prediction_url: str) -> None:
    row = rows(1)[0]
    response = post(prediction_url, "/predict", row)
    assert response.status_code == 200
    check_prediction(response.json())
    # Integers: 2.0 is 2, 1.5 is refused; booleans are not numbers; NaN is not JSON we accept.
    as_float = post(
        prediction_url, "/predict", {**row, "num_request_waiting": float(row["num_request_waiting"])}
    )
    assert as_float.status_code == 200 and as_float.json()["ttft_ms"] == response.json()["ttft_ms"]
    fractional = post(prediction_url, "/predict", {**row, "input_token_length": 1.5})
    assert fractional.status_code == 422
    assert fractional.json()["detail"][0]["loc"] == ["body", "input_token_length"]
    assert post(prediction_url, "/predict", {**row, "num_tokens_generated": False}).status_code == 422
    raw = (
        b'{"kv_cache_percentage": NaN, "input_token_length": 1, "num_request_waiting": 0, '
        b'"num_request_running": 0, "num_tokens_generated": 1, "prefix_cache_score": 0}'
    )
    nan = httpx.post(prediction_url + "/predict", content=raw, headers={"content-type": "application/json"})
    assert nan.status_code == 422
    assert post(prediction_url, "/predict", {**row, "unknown_field": [1]}).status_code == 200


def test_optional_features_are_accepted_on_every_endpoint(prediction_url: str) -> None:
    row = {
        **rows(1)[0],
        "pod_type": "prefill",
        "prefill_tokens_in_flight": 4000,
        "decode_tokens_in_flight": 12,
        "encoder_matched_size": 3,
        "encoder_input_size": 9,
    }
    single = post(prediction_url, "/predict", row)
    strict = post(prediction_url, "/predict/bulk/strict", {"requests": [row, {**row, "pod_type": None}]})
    lenient = post(prediction_url, "/predict/bulk", {"requests": [row]})
    assert single.status_code == strict.status_code == lenient.status_code == 200
    assert single.json()["ttft_ms"] == strict.json()["predictions"][0]["ttft_ms"]
    assert single.json()["ttft_ms"] == lenient.json()["predictions"][0]["ttft_ms"]
    for field, bad in (("pod_type", "mixed"), ("prefill_tokens_in_flight", -1), ("encoder_input_size", 0.5)):
        assert post(prediction_url, "/predict", {**row, field: bad}).status_code == 422


def test_lenient_bulk_answers_every_valid_item_with_an_empty_errors_list(prediction_url: str) -> None:
    batch = rows(20)
    body = post(prediction_url, "/predict/bulk", {"requests": batch}).json()
    assert body["errors"] == []
    assert (body["total_requests"], body["successful_predictions"], body["failed_predictions"]) == (20, 20, 0)
    strict = post(prediction_url, "/predict/bulk/strict", {"requests": batch}).json()
    assert [p["ttft_ms"] for p in body["predictions"]] == [p["ttft_ms"] for p in strict["predictions"]]


def test_lenient_bulk_with_any_invalid_item_is_a_whole_body_422_naming_every_item_and_field(
    prediction_url: str,
) -> None:
    batch: list[Any] = rows(6)
    del batch[1]["prefix_cache_score"]  # missing required field
    batch[2]["num_request_waiting"] = "3"  # wrong type
    batch[3]["kv_cache_percentage"] = 7.0  # out of bounds
    batch[4] = ["not", "an", "object"]
    batch[5]["input_token_length"] = -1
    batch[5]["pod_type"] = 3
    response = post(prediction_url, "/predict/bulk", {"requests": batch})
    assert response.status_code == 422
    named = sorted((tuple(e["loc"]), e["type"]) for e in response.json()["detail"])
    assert named == sorted(
        [
            (("body", "requests", 1, "prefix_cache_score"), "missing"),
            (("body", "requests", 2, "num_request_waiting"), "int_type"),
            (("body", "requests", 3, "kv_cache_percentage"), "less_than_equal"),
            (("body", "requests", 4), "dict_type"),
            (("body", "requests", 5, "input_token_length"), "greater_than_equal"),
            (("body", "requests", 5, "pod_type"), "enum"),
        ]
    )
    assert response.json()["total_errors"] == 6


def test_status_health_readiness_and_root(prediction_url: str, fleet: Fleet) -> None:
    status = httpx.get(prediction_url + "/status").json()
    assert status["is_ready"] is True
    assert status["model_type"] in MODEL_TYPES and status["model_type"] == "xgboost"
    assert status["objective_type"] in ("quantile", "mean") and isinstance(status["quantile"], float)
    assert zoned(status["last_model_load"])
    assert isinstance(status["training_server_url"], str)
    assert status["models_exist"] and all(v is True for v in status["models_exist"].values())
    assert status["ensemble_active"] is False
    assert status["model_version"] == fleet.version
    assert httpx.get(prediction_url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(prediction_url + "/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    root = httpx.get(prediction_url + "/")
    assert root.status_code == 200
    body = root.json()
    assert body["service"] in ("prediction_server", "coalescer")
    assert body["model_type"] == "xgboost" and body["is_ready"] is True
    assert body["objective_type"] == "quantile" and isinstance(body["quantile"], float)
    assert isinstance(body["version"], str) and body["version"]


def test_reload_returns_is_ready_as_status_does(prediction_url: str) -> None:
    assert httpx.post(prediction_url + "/reload").status_code == 401  # the token is configured
    response = httpx.post(prediction_url + "/reload", headers=AUTH, timeout=30.0)
    assert response.status_code == 200
    body = response.json()
    assert body["is_ready"] is True
    assert body["model_type"] == "xgboost"
    assert all(v is True for v in body["models_exist"].values())


@pytest.fixture(scope="module")
def not_ready(fleet: Fleet) -> Any:
    """A prediction server without any model (prior fallback off), alone and behind a coalescer."""
    empty = fleet.base / "empty-store"
    empty.mkdir(exist_ok=True)
    started: list[RunningService] = []
    try:
        replica = fleet.start_prediction(empty, "--no-prior-fallback", ready_path="/healthz")
        started.append(replica)
        coalescer = fleet.start_coalescer(replica, fleet.training.url, ready_path="/healthz")
        started.append(coalescer)
        yield {"direct": replica.url, "coalescer": coalescer.url}
    finally:
        for service in reversed(started):
            service.stop()


@pytest.mark.parametrize("via", ["direct", "coalescer"])
def test_no_model_is_503_models_not_ready_and_status_says_not_ready(
    not_ready: dict[str, str], via: str
) -> None:
    url = not_ready[via]
    for path, body in (("/predict", rows(1)[0]), ("/predict/bulk/strict", {"requests": rows(2)})):
        response = post(url, path, body)
        assert response.status_code == 503, response.text
        assert response.json() == {"detail": "Models not ready"}
    assert httpx.get(url + "/readyz").status_code == 503
    status = httpx.get(url + "/status").json()
    assert status["is_ready"] is False and all(v is False for v in status["models_exist"].values())
    reload = httpx.post(url + "/reload", headers=AUTH, timeout=30.0)
    assert reload.status_code == 200 and reload.json()["is_ready"] is False
    assert httpx.get(url + "/").json()["is_ready"] is False


def test_a_new_version_is_picked_up_and_named_on_each_prediction(fleet: Fleet) -> None:
    # Readiness and version naming: /status and every prediction say which version answered.
    for url in (fleet.prediction.url, fleet.coalescer.url):
        wait_until(
            lambda url=url: post(url, "/predict", rows(1)[0]).json()["model_version"] == fleet.version,
            timeout_s=60,
        )
