"""The prediction server's ASGI app: ``create_app(settings)``; the lifespan owns the store watcher.

A plain Starlette app (no OpenAPI schema or ``/docs``: wire-contract.md documents the API), except
that the POSTs of the prediction endpoints go straight to their raw ASGI handlers
(``prediction_server.predict``, dispatched by ``shared.http.FastPathApp``).
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prediction_server.config import PredictionSettings
from prediction_server.metrics import PredictionMetrics
from prediction_server.routes import PredictionApi
from prediction_server.store_watcher import StoreWatcher
from shared.http import FastPathApp, install_error_handlers
from shared.logging import configure_logging
from shared.metrics import new_registry


def create_app(settings: PredictionSettings) -> FastPathApp:
    """Build the app; nothing is loaded until the lifespan starts (the first model before serving)."""
    metrics = PredictionMetrics(new_registry())
    watcher = StoreWatcher(settings, metrics)
    api = PredictionApi(settings, watcher, metrics)

    @asynccontextmanager
    async def lifespan(_: FastPathApp) -> AsyncIterator[None]:
        await watcher.start()
        # Start-up objects (xgboost, numpy, the first model) live as long as the process: keep
        # them out of the cyclic collector so its full passes stay short on the hot path.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await watcher.stop()

    app = FastPathApp(routes=api.routes(), lifespan=lifespan, fast_paths=api.fast_paths)
    install_error_handlers(app, on_error=metrics.count_error)
    app.state.settings = settings
    app.state.watcher = watcher
    app.state.metrics = metrics
    return app


def create_app_from_env() -> FastPathApp:
    """Factory for worker processes: settings come from ``PREDICTION_SERVER_*`` (set by ``__main__``)."""
    settings = PredictionSettings()
    configure_logging("prediction_server", settings.log_level)
    return create_app(settings)
