"""The FastAPI application factory: ``create_app(settings)``.

Nothing is created at import time. The lifespan owns the ``TrainingService`` (window,
intake thread, trainer thread, persistence) and stops it cleanly on shutdown, which
also writes the window to the data directory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from shared.errors import InvalidInput
from shared.http import error_response, install_error_handlers
from shared.metrics import new_registry
from training_server.config import TrainingSettings
from training_server.metrics import TrainingMetrics
from training_server.operator_routes import router as operator_router
from training_server.routes import router
from training_server.service import TrainingService


def create_app(settings: TrainingSettings) -> FastAPI:
    """Build the training server app; its lifespan starts and stops the service."""
    registry = new_registry()
    metrics = TrainingMetrics(registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = TrainingService(settings, metrics)
        await service.start()
        app.state.service = service
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="training_server",
        summary="Online TTFT/TPOT latency-model training",
        lifespan=lifespan,
        **_docs_routes(settings.expose_internals),
    )
    app.state.settings = settings
    app.state.registry = registry
    install_error_handlers(app)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.include_router(router)
    app.include_router(operator_router)  # after: /model/download/info wins over /model/{name}/info
    return app


async def _validation_error(request: Request, exc: Exception) -> Response:
    """FastAPI's own validation errors (query parameters, typed bodies) as the same 422 as ours."""
    assert isinstance(exc, RequestValidationError)
    errors = [{k: v for k, v in e.items() if k in ("type", "loc", "msg", "input")} for e in exc.errors()]
    return error_response(InvalidInput(errors), request.url.path)


def _docs_routes(expose: bool) -> dict[str, Any]:
    """FastAPI's ``docs_url`` / ``redoc_url`` / ``openapi_url``: served only with ``--expose-internals``.

    The wire contract (docs/wire-contract in the handbook) documents the API; an interactive page
    on a production port only tells a stranger what to try.
    """
    if expose:
        return {"docs_url": "/docs", "redoc_url": "/redoc", "openapi_url": "/openapi.json"}
    return {"docs_url": None, "redoc_url": None, "openapi_url": None}
