"""The prediction API of wire-contract.md section 2, in process: shapes, status codes, parity, limits."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import pytest_asyncio
import xgboost as xgb

from prediction_server.app import create_app
from prediction_server.config import PredictionSettings
from shared.artifacts import Manifest, served_latency_ms
from shared.features import build_features
from shared.model_store import ModelStore
from shared.schemas import MAX_BULK_ROWS, parse_rows
from tests.prediction_support import ROW, publish_trained, random_rows
from tests.procs import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "s3cret"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
PREDICTION_FIELDS = {
    "ttft_ms": float,
    "tpot_ms": float,
    "predicted_at": str,
    "model_type": str,
    "objective_type": str,
    "quantile": float,
    "last_model_load": str,
    "model_version": str,
}


@asynccontextmanager
async def serving(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running, behind an in-process HTTP client."""
    app = create_app(PredictionSettings(**settings))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://prediction") as client,
    ):
        yield client


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelStore, Manifest]:
    store = ModelStore(tmp_path_factory.mktemp("store"))
    return store, publish_trained(store, seed=1, calibration_offsets={"ttft": 0.1, "tpot": 0.0})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(store: tuple[ModelStore, Manifest]) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(store=str(store[0].root), auth_token=TOKEN, training_server_url="http://ts:8000") as c:
        yield c


def assert_prediction(p: dict[str, Any], version: str) -> None:
    for name, kind in PREDICTION_FIELDS.items():
        assert isinstance(p[name], kind), (name, p[name])
    assert p["ttft_ms"] >= 0 and p["tpot_ms"] >= 0
    assert p["model_type"] == "xgboost" and p["objective_type"] == "quantile" and p["quantile"] == 0.9
    assert p["model_version"] == version
    for name in ("predicted_at", "last_model_load"):
        assert RFC3339.match(p[name]), p[name]
        assert datetime.fromisoformat(p[name]).tzinfo is not None


async def test_strict_bulk_answers_every_row_in_order_with_the_contract_shape(
    client: httpx.AsyncClient, store: tuple[ModelStore, Manifest]
) -> None:
    rows = [ROW, {**ROW, "num_request_waiting": 40}, {**ROW, "input_token_length": 9000, "pod_type": None}]
    response = await client.post("/predict/bulk/strict", json={"requests": rows})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert {"predictions", "total_requests", "successful_predictions", "failed_predictions"} <= body.keys()
    assert (body["total_requests"], body["successful_predictions"], body["failed_predictions"]) == (3, 3, 0)
    assert isinstance(body["processing_time_ms"], float) and body["processing_time_ms"] > 0
    assert len(body["predictions"]) == 3
    for p in body["predictions"]:
        assert_prediction(p, store[1].version)
    ttfts = [p["ttft_ms"] for p in body["predictions"]]
    assert len(set(ttfts)) == 3  # three different rows, three answers, in request order
    single = [(await client.post("/predict", json=row)).json()["ttft_ms"] for row in rows]
    assert single == ttfts


async def test_predictions_through_http_equal_xgboost_booster_predict(
    client: httpx.AsyncClient, store: tuple[ModelStore, Manifest]
) -> None:
    rows = random_rows(2000, np.random.default_rng(11))
    predictions: list[dict[str, Any]] = []
    for size in (2, 8, 10, 30, 50, 100, 300, 1500):  # small calls (compiled forest) and large (XGBoost)
        start = len(predictions)
        response = await client.post("/predict/bulk/strict", json={"requests": rows[start : start + size]})
        assert response.status_code == 200
        predictions.extend(response.json()["predictions"])
    assert len(predictions) == len(rows)
    model_set = store[0].load(store[1].version)
    features = build_features(parse_rows(rows))
    for name in ("ttft", "tpot"):
        booster = xgb.Booster(model_file=bytearray(model_set.files[name]))
        expected = served_latency_ms(
            booster.predict(xgb.DMatrix(features), output_margin=True),
            features,
            model_set.manifest.models[name],
        )
        got = np.array([p[f"{name}_ms"] for p in predictions])
        np.testing.assert_allclose(got, expected, rtol=1e-6)


async def test_single_predict_returns_one_prediction_object(
    client: httpx.AsyncClient, store: tuple[ModelStore, Manifest]
) -> None:
    response = await client.post("/predict", json={**ROW, "unknown_field": "ignored", "pod_type": "decode"})
    assert response.status_code == 200
    assert_prediction(response.json(), store[1].version)
    bad = await client.post("/predict", json={**ROW, "input_token_length": 1.5})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "input_token_length"]


async def test_bulk_with_any_invalid_item_is_a_whole_body_422_naming_every_bad_item_and_field(
    client: httpx.AsyncClient,
) -> None:
    good = random_rows(5, np.random.default_rng(3))
    rows: list[Any] = [
        good[0],
        {**good[1], "kv_cache_percentage": 1.5},
        good[2],
        "not a row",
        {k: v for k, v in good[3].items() if k != "num_request_running"},
        {**good[4], "num_request_waiting": 1.5, "pod_type": "gpu"},
    ]
    response = await client.post("/predict/bulk", json={"requests": rows})
    assert response.status_code == 422
    body = response.json()
    found = sorted((tuple(e["loc"]), e["type"]) for e in body["detail"])
    assert found == sorted(
        [
            (("body", "requests", 1, "kv_cache_percentage"), "less_than_equal"),
            (("body", "requests", 3), "dict_type"),
            (("body", "requests", 4, "num_request_running"), "missing"),
            (("body", "requests", 5, "num_request_waiting"), "int_from_float"),
            (("body", "requests", 5, "pod_type"), "enum"),
        ]
    )
    assert body["total_errors"] == 5
    clean = (await client.post("/predict/bulk", json={"requests": good})).json()
    assert clean["errors"] == [] and clean["failed_predictions"] == 0
    assert clean["successful_predictions"] == 5 and None not in clean["predictions"]


async def test_bulk_with_many_bad_rows_names_each_of_them(client: httpx.AsyncClient) -> None:
    rows = random_rows(400, np.random.default_rng(4))
    for i in range(0, 400, 3):
        rows[i] = {**rows[i], "num_request_waiting": -1, "prefix_cache_score": 2}
    response = await client.post("/predict/bulk", json={"requests": rows})
    assert response.status_code == 422
    detail = response.json()["detail"]
    bad = list(range(0, 400, 3))
    assert sorted({e["loc"][2] for e in detail}) == bad
    assert len(detail) == 2 * len(bad) == response.json()["total_errors"]


@pytest.mark.parametrize(
    ("body", "status", "loc"),
    [
        ({"requests": []}, 422, ["body", "requests"]),
        ({"requests": "x"}, 422, ["body", "requests"]),
        ({}, 422, ["body", "requests"]),
        ([ROW], 422, ["body"]),
    ],
)
async def test_bulk_bodies_that_are_invalid_as_a_whole_are_422(
    client: httpx.AsyncClient, body: Any, status: int, loc: list[Any]
) -> None:
    for path in ("/predict/bulk/strict", "/predict/bulk"):
        response = await client.post(path, json=body)
        assert response.status_code == status
        assert response.json()["detail"][0]["loc"] == loc


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({"kv_cache_percentage": 1.01}, "less_than_equal"),
        ({"num_request_waiting": -1}, "greater_than_equal"),
        ({"input_token_length": 2.5}, "int_from_float"),
        ({"input_token_length": "12"}, "int_type"),
        ({"pod_type": "gpu"}, "enum"),
        ({"prefix_cache_score": None}, "float_type"),
    ],
)
async def test_strict_bulk_names_the_row_index_and_field_of_an_invalid_value(
    client: httpx.AsyncClient, change: dict[str, Any], kind: str
) -> None:
    rows = [ROW, ROW, ROW, {**ROW, **change}]
    response = await client.post("/predict/bulk/strict", json={"requests": rows})
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["type"] == kind
    assert error["loc"] == ["body", "requests", 3, next(iter(change))]


async def test_missing_fields_nan_and_malformed_json_are_422(client: httpx.AsyncClient) -> None:
    missing = {k: v for k, v in ROW.items() if k != "prefix_cache_score"}
    response = await client.post("/predict/bulk/strict", json={"requests": [ROW, missing]})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "requests", 1, "prefix_cache_score"]
    # NaN, Infinity and numbers beyond float range are not JSON numbers: refused while parsing.
    nan_row = orjson.dumps({"requests": [ROW]}).replace(b"0.3", b"NaN")
    inf_row = orjson.dumps({"requests": [ROW]}).replace(b"800", b"1e999")
    for raw in (nan_row, inf_row, b'{"requests": [', b""):
        response = await client.post("/predict/bulk/strict", content=raw)
        assert response.status_code == 422 and response.json()["detail"][0]["type"] == "json_invalid"
    # 2.0 is an integer; null optional fields take their defaults; unknown fields are ignored.
    fine = {**ROW, "input_token_length": 800.0, "decode_tokens_in_flight": None, "extra": [1, 2]}
    response = await client.post("/predict/bulk/strict", json={"requests": [ROW, fine]})
    assert response.status_code == 200
    first, second = response.json()["predictions"]
    assert first["ttft_ms"] == second["ttft_ms"]


async def test_row_limit_is_inclusive_and_larger_bodies_are_refused(client: httpx.AsyncClient) -> None:
    response = await client.post("/predict/bulk/strict", json={"requests": [ROW] * MAX_BULK_ROWS})
    assert response.status_code == 200 and len(response.json()["predictions"]) == MAX_BULK_ROWS
    for path in ("/predict/bulk/strict", "/predict/bulk"):
        response = await client.post(path, json={"requests": [ROW] * (MAX_BULK_ROWS + 1)})
        assert response.status_code == 422
        assert response.json()["detail"][0]["type"] == "too_long"


async def test_oversized_bodies_are_refused_with_413(store: tuple[ModelStore, Manifest]) -> None:
    async with serving(store=str(store[0].root), max_body_bytes=4096) as small:
        response = await small.post("/predict/bulk/strict", json={"requests": [ROW] * 100})
        assert response.status_code == 413
        ok = await small.post("/predict/bulk/strict", json={"requests": [ROW] * 5})
        assert ok.status_code == 200
        metrics = (await small.get("/metrics")).text
        assert 'prediction_errors_total{kind="payload_too_large"} 1.0' in metrics


async def test_status_health_and_readiness(
    client: httpx.AsyncClient, store: tuple[ModelStore, Manifest]
) -> None:
    status = (await client.get("/status")).json()
    assert status["is_ready"] is True
    assert status["model_type"] == "xgboost"
    assert status["objective_type"] == "quantile" and status["quantile"] == 0.9
    assert datetime.fromisoformat(status["last_model_load"]).tzinfo is not None
    assert status["training_server_url"] == "http://ts:8000"
    assert status["models_exist"] == {"ttft": True, "tpot": True}
    assert all(type(v) is bool for v in status["models_exist"].values())
    assert status["ensemble_active"] is False
    assert status["model_version"] == store[1].version and status["model_kind"] == "trained"
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


async def test_reload_requires_the_token_when_one_is_configured(client: httpx.AsyncClient) -> None:
    assert (await client.post("/reload")).status_code == 401
    assert (await client.post("/reload", headers={"Authorization": "Bearer wrong"})).status_code == 401
    response = await client.post("/reload", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200 and response.json()["status"] == "ok"
    assert (await client.post("/reload", headers={"X-Auth-Token": TOKEN})).status_code == 200


async def test_metrics_count_requests_rows_errors_and_the_served_version(
    client: httpx.AsyncClient, store: tuple[ModelStore, Manifest]
) -> None:
    await client.post("/predict/bulk/strict", json={"requests": [ROW] * 7})
    await client.post("/predict/bulk/strict", json={"requests": [{**ROW, "kv_cache_percentage": 9}]})
    text = (await client.get("/metrics")).text
    assert 'prediction_requests_total{endpoint="predict_bulk_strict",status="200"}' in text
    assert 'prediction_requests_total{endpoint="predict_bulk_strict",status="422"}' in text
    assert 'prediction_errors_total{kind="invalid_input"}' in text
    assert 'prediction_rows_per_call_bucket{endpoint="predict_bulk_strict",le="10.0"}' in text
    assert 'prediction_request_duration_seconds_count{endpoint="predict_bulk_strict"}' in text
    assert f"prediction_model_sequence {float(store[1].sequence)}" in text
    assert "prediction_model_is_prior 0.0" in text
    assert "prediction_model_age_seconds " in text


async def test_an_empty_store_serves_the_prior_from_the_start(tmp_path: Path) -> None:
    async with serving(store=str(tmp_path / "empty")) as client:
        status = (await client.get("/status")).json()
        assert status["is_ready"] is True and status["model_kind"] == "prior"
        assert status["model_version"] == "builtin-prior"
        body = (
            await client.post(
                "/predict/bulk/strict", json={"requests": random_rows(20, np.random.default_rng(1))}
            )
        ).json()
        for p in body["predictions"]:
            assert_prediction(p, "builtin-prior")
            assert p["ttft_ms"] > 0 and p["tpot_ms"] > 0 and p["model_kind"] == "prior"


async def test_without_any_model_every_prediction_endpoint_is_503(tmp_path: Path) -> None:
    async with serving(store=str(tmp_path / "empty"), prior_fallback=False) as client:
        for path, body in (
            ("/predict/bulk/strict", {"requests": [ROW]}),
            ("/predict/bulk", {"requests": [ROW]}),
            ("/predict", ROW),
        ):
            response = await client.post(path, json=body)
            assert response.status_code == 503 and response.json() == {"detail": "Models not ready"}
        assert (await client.get("/readyz")).status_code == 503
        status = (await client.get("/status")).json()
        assert status["is_ready"] is False and status["last_model_load"] is None
        assert status["models_exist"] == {"ttft": False, "tpot": False}


async def test_a_newly_published_version_answers_within_a_poll(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    first = publish_trained(store, seed=1)
    async with serving(store=str(store.root), poll_interval_s=0.05) as client:
        before = (await client.post("/predict", json=ROW)).json()
        assert before["model_version"] == first.version
        second = publish_trained(store, seed=2)

        async def switched() -> dict[str, Any] | None:
            after: dict[str, Any] = (await client.post("/predict", json=ROW)).json()
            return after if after["model_version"] == second.version else None

        after = await eventually(switched, f"{second.version} to answer", timeout_s=5)
        assert after["model_version"] == second.version
        assert after["ttft_ms"] != before["ttft_ms"]
        assert after["last_model_load"] > before["last_model_load"]


async def test_bulk_with_every_row_bad_names_every_row(client: httpx.AsyncClient) -> None:
    rows: list[Any] = [{**ROW, "num_tokens_generated": -i - 1} for i in range(3000)]
    rows[7] = None
    response = await client.post("/predict/bulk", json={"requests": rows})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert sorted(e["loc"][2] for e in detail) == list(range(3000))
    assert {"loc": ["body", "requests", 7], "type": "dict_type"}.items() <= next(
        e for e in detail if e["loc"][2] == 7
    ).items()
    assert any(e["loc"] == ["body", "requests", 2999, "num_tokens_generated"] for e in detail)


async def test_no_openapi_pages_and_json_404_405_even_with_internals_exposed(
    store: tuple[ModelStore, Manifest],
) -> None:
    async with serving(store=str(store[0].root), expose_internals=True) as client:
        for path in ("/docs", "/redoc", "/openapi.json", "/nope"):
            missing = await client.get(path)
            assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
        wrong = await client.get("/predict")
        assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
        assert wrong.headers["allow"] == "POST"
