"""A fault-injectable stand-in for a prediction replica, run as a real process on a real port.

``python -m tests.fake_upstream --host 127.0.0.1 --port P`` answers ``/predict/bulk/strict``
with valid wire shapes. Its predictions are a function of each row (``ttft_ms =
input_token_length + 0.5``, ``tpot_ms = num_request_waiting + 0.25``), so a test can tell whether
every caller got *its own* rows' predictions back, in order. Knobs (``POST /_control``) inject
what real replicas do only rarely: a fixed or random delay (random delays complete concurrent
calls out of order), failures (HTTP 500, 503 "Models not ready", a dropped connection, a hang,
an answer one prediction short)
for every call or the next N calls, not-ready, and a gate that holds every prediction call until
the test releases it (in process: ``knobs.gate``). ``GET /_counters`` tells how many calls and
rows arrived, the largest batch and the most calls in flight at once.

It also takes ``POST /add_training_data_bulk`` (counting samples, answering ``training_status``)
so relay faults (429, 5xx) can be injected. It is a fake only for fault injection; tests of normal
behaviour use the real prediction and training servers.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from datetime import UTC, datetime
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import Response

MODEL_VERSION = "fake-1"


class Knobs:
    def __init__(self) -> None:
        self.delay_ms = 0.0
        self.jitter_ms = 0.0
        self.fail = "none"  # none | 500 | 503 | close | hang | short
        self.fail_next = 0  # >0: only the next N calls fail (then back to normal)
        self.ready = True
        self.calls = 0
        self.rows = 0
        self.max_rows = 0
        self.batch_sizes: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.training_status = 202  # what POST /add_training_data_bulk answers
        self.samples = 0  # training samples accepted (answered 202)
        self.training_calls = 0
        self.gate: asyncio.Event | None = None  # when set to an Event, predictions wait for it
        self.health_checks = 0  # GET /healthz answered


def prediction(row: dict[str, Any], now: str) -> dict[str, Any]:
    return {
        "ttft_ms": float(row["input_token_length"]) + 0.5,
        "tpot_ms": float(row["num_request_waiting"]) + 0.25,
        "predicted_at": now,
        "model_type": "xgboost",
        "objective_type": "quantile",
        "quantile": 0.9,
        "last_model_load": now,
        "model_version": MODEL_VERSION,
    }


def row(input_token_length: int, **extra: Any) -> dict[str, Any]:
    """A valid prediction row; the fake predicts ``ttft_ms = input_token_length + 0.5``."""
    return {
        "kv_cache_percentage": 0.25,
        "input_token_length": input_token_length,
        "num_request_waiting": 1,
        "num_request_running": 3,
        "num_tokens_generated": 1,
        "prefix_cache_score": 0.5,
        **extra,
    }


def rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [row(start + i) for i in range(n)]


def create_app() -> FastAPI:
    """The fake replica; its knobs and counters are ``app.state.knobs`` (or ``/_control``, ``/_counters``)."""
    app = FastAPI()
    k = Knobs()
    app.state.knobs = k

    def json(content: Any, status: int = 200) -> Response:
        return Response(orjson.dumps(content), status_code=status, media_type="application/json")

    @app.post("/predict/bulk/strict")
    async def strict(request: Request) -> Response:
        batch = orjson.loads(await request.body())["requests"]
        k.calls += 1
        k.rows += len(batch)
        k.max_rows = max(k.max_rows, len(batch))
        k.batch_sizes.append(len(batch))
        k.in_flight += 1
        k.max_in_flight = max(k.max_in_flight, k.in_flight)
        try:
            fail = k.fail
            if k.fail_next > 0:
                k.fail_next -= 1
                if k.fail_next == 0:
                    k.fail = "none"
            delay_s = (k.delay_ms + random.uniform(0, k.jitter_ms)) / 1000.0  # as set when it arrived
            if k.gate is not None:  # held until the test releases it: "busy" without guessing a delay
                await k.gate.wait()
            if delay_s:
                await asyncio.sleep(delay_s)
            if fail == "500":
                return json({"detail": "injected failure"}, 500)
            if fail == "503" or not k.ready:
                return json({"detail": "Models not ready"}, 503)
            if fail == "close":
                transport = request.scope.get("transport") or _transport(request)
                if transport is not None:
                    transport.abort()
                return json({"detail": "closed"}, 500)
            if fail == "hang":
                await asyncio.sleep(3600)
            now = datetime.now(UTC).isoformat()
            predictions = [prediction(r, now) for r in batch]
            if fail == "short":  # a broken replica: one prediction missing
                predictions = predictions[:-1]
            n = len(predictions)
            return json(
                {
                    "predictions": predictions,
                    "total_requests": n,
                    "successful_predictions": n,
                    "failed_predictions": 0,
                    "processing_time_ms": delay_s * 1000,
                }
            )
        finally:
            k.in_flight -= 1

    @app.post("/add_training_data_bulk")
    async def add_training_data_bulk(request: Request) -> Response:
        entries = orjson.loads(await request.body())["entries"]
        k.training_calls += 1
        if k.training_status != 202:
            return Response(
                orjson.dumps({"detail": "injected"}),
                status_code=k.training_status,
                headers={"Retry-After": "0"} if k.training_status == 429 else None,
                media_type="application/json",
            )
        k.samples += len(entries)
        return json({"message": f"Accepted {len(entries)} training samples."}, 202)

    @app.post("/_control")
    async def control(request: Request) -> Response:
        for key, value in orjson.loads(await request.body()).items():
            if not hasattr(k, key):
                return json({"detail": f"unknown knob {key}"}, 422)
            setattr(k, key, value)
        return json({"ok": True})

    @app.get("/_counters")
    async def counters() -> Response:
        return json(
            {
                "calls": k.calls,
                "rows": k.rows,
                "max_rows": k.max_rows,
                "max_in_flight": k.max_in_flight,
                "samples": k.samples,
                "training_calls": k.training_calls,
            }
        )

    @app.get("/healthz")
    async def healthz() -> Response:
        k.health_checks += 1
        return json({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        return json({"status": "ready"}) if k.ready else json({"detail": "Models not ready"}, 503)

    @app.get("/status")
    async def status() -> Response:
        return json(
            {
                "is_ready": k.ready,
                "model_type": "xgboost",
                "objective_type": "quantile",
                "quantile": 0.9,
                "last_model_load": None,
                "training_server_url": "",
                "models_exist": {"ttft": True, "tpot": True},
                "ensemble_active": False,
                "model_version": MODEL_VERSION,
            }
        )

    @app.post("/reload")
    async def reload() -> Response:
        return json({"message": "reloaded"})

    return app


def _transport(request: Request) -> Any:
    # uvicorn does not put the transport in the scope; reach it through the ASGI receive closure.
    receive = request.receive
    cycle = getattr(receive, "__self__", None)
    return getattr(cycle, "transport", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        create_app(),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_config=None,
        access_log=False,
    )


if __name__ == "__main__":
    main()
