"""The FastAPI application factory: ``create_app(settings)``.

Nothing is created at import time. The lifespan owns the ``TrainingService`` (window,
intake thread, trainer thread, persistence) and stops it cleanly on shutdown, which
also writes the window to the data directory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from shared.http import docs_routes, install_error_handlers
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
        **docs_routes(settings.expose_internals),
    )
    app.state.settings = settings
    app.state.registry = registry
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(operator_router)  # after: /model/download/info wins over /model/{name}/info
    return app
