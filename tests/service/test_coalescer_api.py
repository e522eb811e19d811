"""The rest of the coalescer's API in process: single and per-item bulk predictions, status,
readiness, reload, metrics, and the sample relay endpoint (202 only once the training server took
the samples; 422, 413, 429 and upstream faults answered as they are).
"""

from __future__ import annotations

import functools
from typing import Any

import httpx

from tests.fake_upstream import row, rows
from tests.procs import coalescer_in_loop, eventually

TOKEN = "s3cret"


# Fake replicas (the first also plays the training server) and a coalescer in front of them.
stack = functools.partial(coalescer_in_loop, training=True)


def entry(i: int, **extra: Any) -> dict[str, Any]:
    return {**row(i), "actual_ttft_ms": 100.0 + i, "actual_tpot_ms": 10.0, **extra}


async def test_single_prediction_has_the_wire_shape() -> None:
    async with stack() as (client, _):
        response = await client.post("/predict", json=row(41))
        assert response.status_code == 200
        p = response.json()
        assert p["ttft_ms"] == 41.5
        assert p["model_type"] == "xgboost"
        assert p["predicted_at"].endswith(("Z", "+00:00"))
        assert p["model_version"] == "fake-1"
        bad = await client.post("/predict", json={**row(1), "num_request_waiting": -1})
        assert bad.status_code == 422
        assert bad.json()["detail"][0]["loc"] == ["body", "num_request_waiting"]


async def test_bulk_with_an_invalid_item_is_a_whole_body_422_and_nothing_goes_upstream() -> None:
    async with stack() as (client, (k,)):
        items = [row(1), {**row(2), "kv_cache_percentage": 2.0}, row(3), "nope", {**row(5), "pod_type": "x"}]
        response = await client.post("/predict/bulk", json={"requests": items})
        assert response.status_code == 422
        locs = sorted((e["loc"] for e in response.json()["detail"]), key=str)
        assert locs == sorted(
            [
                ["body", "requests", 1, "kv_cache_percentage"],
                ["body", "requests", 3],
                ["body", "requests", 4, "pod_type"],
            ],
            key=str,
        )
        assert k.rows == 0
        # Many bad items: every one is named.
        many = [{**row(i), "input_token_length": -1} for i in range(300)]
        response = await client.post("/predict/bulk", json={"requests": many})
        assert response.status_code == 422 and len(response.json()["detail"]) == 300
        assert k.rows == 0
        # All valid: every item answered, in order, with an empty errors list.
        body = (await client.post("/predict/bulk", json={"requests": [row(1), row(3)]})).json()
        assert [p["ttft_ms"] for p in body["predictions"]] == [1.5, 3.5]
        assert body["errors"] == [] and body["failed_predictions"] == 0 and k.rows == 2
        assert (await client.post("/predict/bulk", json={"requests": "x"})).status_code == 422


async def test_status_aggregates_replicas_and_adds_the_coalescer_numbers() -> None:
    async with stack(replicas=2) as (client, (first, _)):
        first.ready = False
        status = (await client.get("/status")).json()
        assert status["is_ready"] is True  # one ready replica is enough
        assert status["model_type"] == "xgboost"
        assert status["models_exist"] == {"ttft": True, "tpot": True}
        assert isinstance(status["training_server_url"], str)
        replicas = status["coalescer"]["replicas"]
        assert [r["is_ready"] for r in replicas] == [False, True]
        assert status["coalescer"]["queued_rows"] == 0
        assert status["relay"]["inflight_bytes"] == 0


async def test_readyz_follows_the_replicas() -> None:
    async with stack(probe_interval_s=0.05, eject_cooldown_s=0.1) as (client, (k,)):
        await eventually(lambda: _status_is(client, "/readyz", 200), "ready")
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        k.ready = False
        assert (await client.post("/predict/bulk/strict", json={"requests": rows(1)})).status_code == 503
        await eventually(lambda: _status_is(client, "/readyz", 503), "not ready")
        k.ready = True
        await eventually(lambda: _status_is(client, "/readyz", 200), "ready")


async def _status_is(client: httpx.AsyncClient, path: str, code: int) -> bool:
    return (await client.get(path)).status_code == code


async def test_reload_needs_the_token_and_fans_out() -> None:
    async with stack(replicas=2, auth_token=TOKEN) as (client, _):
        assert (await client.post("/reload")).status_code == 401
        response = await client.post("/reload", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200
        assert [r["ok"] for r in response.json()["replicas"]] == [True, True]


async def test_metrics_expose_the_coalescer_numbers() -> None:
    async with stack() as (client, _):
        await client.post("/predict/bulk/strict", json={"requests": rows(3)})
        text = (await client.get("/metrics")).text
        for name in (
            "coalescer_queue_rows",
            "coalescer_inflight_calls",
            "coalescer_queue_wait_seconds_bucket",
            "coalescer_batch_rows_sum 3.0",
            "coalescer_batch_callers_count 1.0",
            "coalescer_replica_healthy{",
            "coalescer_replica_outstanding_rows{",
            "coalescer_relay_rate",
            "coalescer_relay_inflight_bytes",
        ):
            assert name in text, name


async def test_samples_are_accepted_with_exactly_202_and_relayed() -> None:
    async with stack() as (client, (trainer,)):
        response = await client.post(
            "/add_training_data_bulk", json={"entries": [entry(i) for i in range(7)]}
        )
        assert response.status_code == 202
        assert response.json() == {"message": "Accepted 7 training samples."}
        assert trainer.samples == 7  # forwarded before the answer, not after


async def test_invalid_samples_get_a_precise_422_and_nothing_is_relayed() -> None:
    async with stack() as (client, (trainer,)):
        entries = [entry(0), entry(1, actual_ttft_ms=float("nan"))]
        response = await client.post(
            "/add_training_data_bulk",
            content=b'{"entries": [' + b",".join(_json(e) for e in entries) + b"]}",
        )
        assert response.status_code == 422
        assert response.json()["detail"][0]["type"] == "json_invalid"  # NaN is not JSON
        response = await client.post(
            "/add_training_data_bulk", json={"entries": [entry(0), entry(1, actual_ttft_ms=-3.0)]}
        )
        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["body", "entries", 1, "actual_ttft_ms"]
        response = await client.post(
            "/add_training_data_bulk", json={"entries": [entry(0, timestamp="yesterday")]}
        )
        assert response.json()["detail"][0]["loc"] == ["body", "entries", 0, "timestamp"]
        assert trainer.training_calls == 0  # the relay is synchronous: nothing can follow the 422


def _json(value: dict[str, Any]) -> bytes:
    import json

    return json.dumps(value).encode()  # the stdlib writes NaN, which is what a broken client sends


async def test_beyond_the_rate_senders_get_429_at_once_and_nothing_is_forwarded() -> None:
    async with stack(relay_max_rate=1.0, relay_min_rate=0.5) as (client, (trainer,)):
        body = {"entries": [entry(i) for i in range(8)]}
        assert (await client.post("/add_training_data_bulk", json=body)).status_code == 202
        limited = await client.post("/add_training_data_bulk", json=body)
        assert limited.status_code == 429
        assert int(limited.headers["retry-after"]) >= 1
        assert trainer.samples == 8 and trainer.training_calls == 1
        text = (await client.get("/metrics")).text
        assert 'coalescer_relay_requests_total{outcome="rate_limited"} 1.0' in text
        assert "coalescer_relay_samples_accepted_total 8.0" in text


async def test_the_training_servers_refusals_reach_the_sender_as_they_are() -> None:
    async with stack() as (client, (trainer,)):
        body = {"entries": [entry(i) for i in range(30)]}
        for status in (503, 429, 500):
            trainer.training_status = status
            response = await client.post("/add_training_data_bulk", json=body)
            assert response.status_code == status  # never a 202 for samples the training server lacks
            if status == 429:
                assert response.headers["retry-after"] == "0"
        assert trainer.samples == 0
        trainer.training_status = 202
        assert (await client.post("/add_training_data_bulk", json=body)).status_code == 202
        assert trainer.samples == 30
        status_body = (await client.get("/status")).json()["relay"]
        assert status_body["accepted_samples"] == 30
        assert status_body["rate_requests_per_s"] < 100.0  # backed off after the 429 and the 5xx


async def test_an_oversized_body_or_entry_is_refused_413_and_never_forwarded() -> None:
    async with stack() as (client, (trainer,)):
        big = {"entries": [entry(0, blob="x" * (9 * 1024 * 1024))]}
        assert (await client.post("/add_training_data_bulk", json=big)).status_code == 413
        one_big = {"entries": [entry(i) for i in range(5)] + [entry(9, blob="y" * (1024 * 1024 + 10))]}
        response = await client.post("/add_training_data_bulk", json=one_big)
        assert response.status_code == 413
        assert "Entry 5" in response.json()["detail"]
        assert trainer.training_calls == 0


async def test_ingestion_takes_the_token_only_when_told_to() -> None:
    async with stack(auth_token=TOKEN) as (client, (trainer,)):
        body = {"entries": [entry(1)]}
        assert (await client.post("/add_training_data_bulk", json=body)).status_code == 202  # Go client
        assert trainer.samples == 1
    async with stack(auth_token=TOKEN, token_protects_ingest=True) as (client, (trainer,)):
        assert (await client.post("/add_training_data_bulk", json=body)).status_code == 401
        ok = await client.post(
            "/add_training_data_bulk", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert ok.status_code == 202
        assert trainer.samples == 1


async def test_no_openapi_pages_and_json_404_405_even_with_internals_exposed() -> None:
    async with stack(expose_internals=True) as (client, _):
        for path in ("/docs", "/redoc", "/openapi.json", "/nope"):
            missing = await client.get(path)
            assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
        wrong = await client.get("/predict/bulk/strict")
        assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
        assert wrong.headers["allow"] == "POST"
