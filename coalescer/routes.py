"""HTTP endpoints: the whole prediction API (wire-contract section 2) plus the sample relay (section 3).

The prediction endpoints are plain Starlette routes rather than FastAPI ones: they read and
write raw bytes themselves, and FastAPI's per-request dependency machinery would cost about
25 µs of the 300 µs the coalescer may add. Each caller's rows are validated here with
``shared.schemas`` before they reach the batcher, so an invalid caller gets its own 422 and never
shares a batch; the batcher only ever sees valid rows.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from coalescer.app import Runtime
from coalescer.batcher import Batcher, ClientDisconnected, Ticket
from shared.errors import InvalidInput, UpstreamUnavailable
from shared.http import check_token, json_response, read_body
from shared.metrics import metrics_response
from shared.schemas import loads, parse_row, parse_rows, parse_training_entries, require_list

DEADLINE_HEADER = b"x-deadline-ms"
STATUS_TIMEOUT_S = 1.0


def build_routes(rt: Runtime) -> list[BaseRoute]:
    s = rt.settings
    default_deadline_s = s.deadline_ms / 1000.0
    max_body = s.max_body_bytes
    calls = rt.metrics.callers
    strict_calls, single_calls, bulk_calls = (calls.labels(e) for e in ("bulk_strict", "single", "bulk"))
    row_counter = rt.metrics.rows

    def admit(n: int) -> None:
        # Shed load before spending CPU on validation (submit checks again).
        assert rt.batcher is not None
        rt.batcher.check_admission(n)

    async def predict_rows(request: Request, rows: list[Any], started: float) -> list[Any]:
        batcher = rt.batcher
        assert batcher is not None
        row_counter.inc(len(rows))
        deadline = started + _deadline_s(request, default_deadline_s)
        return await _await_tickets(batcher, batcher.submit(rows, deadline), request)

    async def predict_bulk_strict(request: Request) -> Response:
        started = time.monotonic()
        strict_calls.inc()
        rows = require_list(loads(await read_body(request, max_body)), "requests")
        admit(len(rows))
        parse_rows(rows)
        predictions = await predict_rows(request, rows, started)
        n = len(predictions)
        return json_response(
            {
                "predictions": predictions,
                "total_requests": n,
                "successful_predictions": n,
                "failed_predictions": 0,
                "processing_time_ms": (time.monotonic() - started) * 1000.0,
            }
        )

    async def predict_one(request: Request) -> Response:
        started = time.monotonic()
        single_calls.inc()
        row = loads(await read_body(request, max_body))
        admit(1)
        parse_row(row)
        predictions = await predict_rows(request, [row], started)
        return json_response(predictions[0])

    async def predict_bulk(request: Request) -> Response:
        started = time.monotonic()
        bulk_calls.inc()
        items = require_list(loads(await read_body(request, max_body)), "requests")
        admit(len(items))
        invalid = invalid_items(items)
        valid = [i for i in range(len(items)) if i not in invalid]
        predictions: list[Any] = [None] * len(items)
        if valid:
            answered = await predict_rows(request, [items[i] for i in valid], started)
            for i, prediction in zip(valid, answered, strict=True):
                predictions[i] = prediction
        return json_response(
            {
                "predictions": predictions,
                "total_requests": len(items),
                "successful_predictions": len(valid),
                "failed_predictions": len(invalid),
                "processing_time_ms": (time.monotonic() - started) * 1000.0,
                "errors": [
                    {"index": i, "error": _describe(errors), "request": items[i], "detail": errors}
                    for i, errors in sorted(invalid.items())
                ],
            }
        )

    async def add_training_data_bulk(request: Request) -> Response:
        check_token(request, s.token)
        if rt.relay is None:
            raise UpstreamUnavailable("no training server configured (--training-url)")
        entries = require_list(loads(await read_body(request, max_body)), "entries")
        parse_training_entries(entries, now_s=time.time())
        n = rt.relay.accept(entries)
        return json_response({"message": f"Accepted {n} training samples."}, status_code=202)

    async def status(request: Request) -> Response:
        return json_response(await _status(rt))

    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(request: Request) -> Response:
        pool = rt.pool
        healthy = pool.healthy_count if pool else 0
        known = len(pool.replicas) if pool else 0
        body = {"healthy_replicas": healthy, "replicas": known}
        if healthy:
            return json_response({"status": "ready", **body})
        return json_response({"status": "not_ready", "detail": "no prediction replica is ready", **body}, 503)

    async def reload(request: Request) -> Response:
        check_token(request, s.token)
        results = await _fan_out(rt, "POST", "/reload")
        if not any(r["ok"] for r in results):
            raise UpstreamUnavailable("no prediction replica reloaded")
        return json_response({"message": "Reload requested from every replica", "replicas": results})

    async def metrics(request: Request) -> Response:
        return metrics_response(rt.metrics.registry)

    endpoints: list[tuple[str, Callable[[Request], Awaitable[Response]], str]] = [
        ("/predict/bulk/strict", predict_bulk_strict, "POST"),
        ("/predict/bulk", predict_bulk, "POST"),
        ("/predict", predict_one, "POST"),
        ("/add_training_data_bulk", add_training_data_bulk, "POST"),
        ("/status", status, "GET"),
        ("/healthz", healthz, "GET"),
        ("/readyz", readyz, "GET"),
        ("/reload", reload, "POST"),
        ("/metrics", metrics, "GET"),
    ]
    return [Route(path, endpoint, methods=[method]) for path, endpoint, method in endpoints]


async def _await_tickets(batcher: Batcher, tickets: list[Ticket], request: Request) -> list[Any]:
    """Wait for the tickets' predictions; a client that disconnects meanwhile drops its tickets."""
    watcher = asyncio.get_running_loop().create_task(_watch_disconnect(batcher, tickets, request))
    try:
        if len(tickets) == 1:
            return await tickets[0].future
        predictions: list[Any] = []
        for ticket in tickets:
            predictions.extend(await ticket.future)
        return predictions
    finally:
        watcher.cancel()
        for ticket in tickets:
            batcher.abandon(ticket)


async def _watch_disconnect(batcher: Batcher, tickets: list[Ticket], request: Request) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for ticket in tickets:
        batcher.abandon(ticket, "disconnected", ClientDisconnected("client disconnected"))


def _deadline_s(request: Request, default_s: float) -> float:
    """The default deadline, or the caller's shorter ``X-Deadline-Ms`` (a longer one is ignored)."""
    for name, value in request.scope["headers"]:
        if name == DEADLINE_HEADER:
            try:
                ms = float(value)
            except ValueError:
                ms = math.nan
            if not math.isfinite(ms) or ms <= 0:
                raise InvalidInput(
                    [
                        {
                            "type": "greater_than",
                            "loc": ["header", "x-deadline-ms"],
                            "msg": "Input should be a positive number of milliseconds",
                            "input": value.decode("latin-1"),
                        }
                    ]
                )
            return min(default_s, ms / 1000.0)
    return default_s


def invalid_items(items: list[Any]) -> dict[int, list[dict[str, Any]]]:
    """Index -> error items of every invalid row, found by bisection (a valid half costs one check).

    Error items are located at ``body.requests.<index>.<field>``, as the prediction server does.
    """
    invalid: dict[int, list[dict[str, Any]]] = {}

    def check(lo: int, hi: int) -> None:
        try:
            parse_rows(items[lo:hi], loc=())
        except InvalidInput as exc:
            if hi - lo == 1:
                invalid[lo] = [{**e, "loc": ["body", "requests", lo, *e["loc"][1:]]} for e in exc.errors]
            else:
                mid = (lo + hi) // 2
                check(lo, mid)
                check(mid, hi)

    check(0, len(items))
    return invalid


def _describe(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{e['loc'][3]}: {e['msg']}" if len(e["loc"]) > 3 else str(e["msg"]) for e in errors)


async def _fan_out(rt: Runtime, method: str, path: str) -> list[dict[str, Any]]:
    assert rt.http is not None and rt.pool is not None
    http = rt.http

    async def one(url: str) -> dict[str, Any]:
        try:
            response = await http.request(method, url + path, timeout=STATUS_TIMEOUT_S * 5)
        except httpx.HTTPError as exc:
            return {"url": url, "ok": False, "error": repr(exc)}
        return {"url": url, "ok": response.is_success, "status_code": response.status_code}

    return list(await asyncio.gather(*(one(r.url) for r in rt.pool.replicas)))


async def _status(rt: Runtime) -> dict[str, Any]:
    """The replicas' ``/status`` aggregated (ready if any replica is), plus the coalescer's own numbers."""
    assert rt.http is not None and rt.pool is not None and rt.batcher is not None
    http, pool, batcher = rt.http, rt.pool, rt.batcher

    async def one(url: str) -> dict[str, Any] | None:
        try:
            response = await http.get(url + "/status", timeout=STATUS_TIMEOUT_S)
            body = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    replicas = list(pool.replicas)
    reports = await asyncio.gather(*(one(r.url) for r in replicas))
    ready = [r for r in reports if r and r.get("is_ready") is True]
    answered = [r for r in reports if r]
    # The newest model any ready replica serves speaks for the fleet.
    base = max(ready or answered or [{}], key=lambda r: str(r.get("last_model_load") or ""))
    now = time.monotonic()
    models_exist = base.get("models_exist")
    return {
        "is_ready": bool(ready),
        "model_type": "xgboost",
        "objective_type": base.get("objective_type", "quantile"),
        "quantile": base.get("quantile", 0.9),
        "last_model_load": base.get("last_model_load"),
        "training_server_url": rt.settings.training_url or base.get("training_server_url") or "",
        "models_exist": (
            {str(k): bool(v) for k, v in models_exist.items()}
            if isinstance(models_exist, dict)
            else {"ttft": False, "tpot": False}
        ),
        "ensemble_active": bool(base.get("ensemble_active", False)),
        "model_version": base.get("model_version"),
        "coalescer": {
            "queued_rows": batcher.queued_rows,
            "queued_callers": batcher.queued_callers,
            "inflight_calls": batcher.inflight_calls,
            "inflight_rows": batcher.inflight_rows,
            "batch_window_us": rt.settings.batch_window_us,
            "max_batch_rows": batcher.max_batch_rows,
            "max_queued_rows": batcher.max_queued_rows,
            "deadline_ms": rt.settings.deadline_ms,
            "healthy_replicas": pool.healthy_count,
            "replicas": [
                {
                    **replica.snapshot(now),
                    "is_ready": bool(report and report.get("is_ready")),
                    "model_version": report.get("model_version") if report else None,
                }
                for replica, report in zip(replicas, reports, strict=True)
            ],
        },
        "relay": rt.relay.snapshot() if rt.relay is not None else None,
    }
