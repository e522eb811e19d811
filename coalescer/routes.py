"""HTTP endpoints besides the prediction hot path: status, health, readiness, reload, metrics,
``GET /``, the sample relay's ``POST /add_training_data_bulk`` (wire-contract section 3
semantics) and the training server's read-only endpoints (``coalescer.training_proxy``).

``/status`` aggregates the replicas' own status (ready when any replica is) and adds the
coalescer's numbers; ``/reload`` fans out to every replica. The prediction endpoints themselves
are raw ASGI handlers in ``coalescer.predict``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from coalescer.predict import ASGIApp
from coalescer.relay import IDEMPOTENCY_HEADER
from coalescer.runtime import Runtime
from coalescer.training_proxy import PROXIED_PATHS, TrainingServerUnavailable
from shared.artifacts import LISTED_MODEL_NAMES, MODEL_NAMES
from shared.errors import NotFound, ServiceError, UpstreamUnavailable
from shared.http import check_token, json_response, read_body
from shared.identity import root_body
from shared.metrics import metrics_response

STATUS_TIMEOUT_S = 1.0


def build_routes(rt: Runtime, prediction_handlers: dict[str, ASGIApp]) -> list[BaseRoute]:
    """Every route of the app: the raw prediction handlers plus the status, admin and relay endpoints."""
    s = rt.settings

    async def add_training_data_bulk(request: Request) -> Response:
        if s.token_protects_ingest:
            check_token(request, s.token)
        if rt.relay is None:
            raise UpstreamUnavailable("no training server configured (--training-url)")
        declared = request.headers.get("content-length")
        answer = await rt.relay.handle(
            int(declared) if declared is not None and declared.isdigit() else None,
            lambda limit: read_body(request, limit),
            request.headers.get(IDEMPOTENCY_HEADER),
        )
        return Response(answer.body, answer.status, answer.headers)

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
        # The /status body after the reload: clients poll is_ready here (wire-contract 2).
        return json_response(
            {**await _status(rt), "message": "Reload requested from every replica", "replicas": results}
        )

    async def root(request: Request) -> Response:
        pool = rt.pool
        training: Any = None
        if rt.training is not None:
            with contextlib.suppress(ServiceError, ValueError):
                answer, _ = await rt.training.get("/")
                training = orjson.loads(answer.body) if answer.status_code == 200 else None
        return json_response(
            root_body(
                "coalescer",
                is_ready=bool(pool and pool.healthy_count),
                objective_type=training.get("objective_type") if isinstance(training, dict) else None,
                quantile=training.get("quantile") if isinstance(training, dict) else None,
                healthy_replicas=pool.healthy_count if pool else 0,
                replicas=len(pool.replicas) if pool else 0,
                training_server_url=s.training_url,
                training_server=training,
                endpoints=list(prediction_handlers) + [path for path, _, _ in endpoints],
            )
        )

    async def training_read(request: Request) -> Response:
        """One of the training server's read-only endpoints, from the proxy's brief cache."""
        name = request.path_params.get("name")
        if name is not None:
            known = MODEL_NAMES if request.url.path.endswith("/xgb/json") else LISTED_MODEL_NAMES
            if name not in known:
                raise NotFound(f"Unknown model {name!r}; expected one of {list(known)}")
        if rt.training is None:
            raise TrainingServerUnavailable("no training server configured (--training-url)")
        answer, how = await rt.training.get(request.url.path)
        return Response(answer.body, answer.status_code, headers={**answer.headers, "X-Cache": how})

    async def metrics(request: Request) -> Response:
        return metrics_response(rt.metrics.registry)

    endpoints: list[tuple[str, Callable[[Request], Awaitable[Response]], str]] = [
        ("/add_training_data_bulk", add_training_data_bulk, "POST"),
        ("/status", status, "GET"),
        ("/healthz", healthz, "GET"),
        ("/readyz", readyz, "GET"),
        ("/reload", reload, "POST"),
        ("/metrics", metrics, "GET"),
        ("/", root, "GET"),
        *((path, training_read, "GET") for path in PROXIED_PATHS),
    ]
    # The prediction handlers are raw ASGI apps; the app calls them before its middleware, and
    # these routes make them answer 405 (not 404) to other methods.
    predictions: list[BaseRoute] = [
        Route(path, handler, methods=["POST"]) for path, handler in prediction_handlers.items()
    ]
    return predictions + [Route(path, endpoint, methods=[method]) for path, endpoint, method in endpoints]


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
