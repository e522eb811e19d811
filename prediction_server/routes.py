"""HTTP endpoints of wire-contract.md section 2, plus /metrics.

The prediction endpoints are raw ASGI handlers (``prediction_server.predict``) that the app
calls before Starlette for a POST; their routes here only answer other methods (405) and list
them at ``/``. The service endpoints are plain Starlette routes.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from prediction_server.config import PredictionSettings
from prediction_server.metrics import PredictionMetrics
from prediction_server.predict import PredictionEndpoints
from prediction_server.store_watcher import StoreWatcher
from shared.artifacts import MODEL_NAMES
from shared.features import FEATURE_VERSION
from shared.http import ASGIApp, check_token, json_response
from shared.identity import MODEL_TYPE, root_body
from shared.metrics import metrics_response


class PredictionApi:
    """The endpoints, bound to one app's settings, watcher and metrics."""

    def __init__(
        self, settings: PredictionSettings, watcher: StoreWatcher, metrics: PredictionMetrics
    ) -> None:
        self.settings = settings
        self.watcher = watcher
        self.metrics = metrics
        self.fast_paths = PredictionEndpoints(watcher, metrics, settings.max_body_bytes).handlers()

    def routes(self) -> list[Route]:
        return [
            *(Route(path, _AsgiEndpoint(app), methods=["POST"]) for path, app in self.fast_paths.items()),
            Route("/status", self.status, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/reload", self.reload, methods=["POST"]),
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            Route("/", self.root, methods=["GET"]),
        ]

    # -- service endpoints ---------------------------------------------------------------------

    async def status(self, request: Request) -> Response:
        return json_response(self._status())

    def _status(self) -> dict[str, Any]:
        predictor = self.watcher.current
        ready = predictor is not None
        body: dict[str, Any] = {
            "is_ready": ready,
            "model_type": MODEL_TYPE,
            "objective_type": predictor.objective_type if predictor else "quantile",
            "quantile": predictor.quantile if predictor else self.settings.quantile,
            "last_model_load": predictor.last_model_load if predictor else None,
            "training_server_url": self.settings.reported_training_server_url,
            "models_exist": {name: ready for name in MODEL_NAMES},
            "ensemble_active": False,
            "model_version": predictor.version if predictor else None,
            "model_kind": predictor.kind if predictor else None,
            "model_created_at": predictor.manifest.created_at if predictor else None,
            "training_samples": predictor.manifest.training_samples if predictor else None,
            "feature_version": FEATURE_VERSION,
            "evaluator": predictor.evaluator if predictor else None,
            # Whether calls are answered by the JIT's fused kernel (features to latencies in one
            # compiled pass, checked bit for bit against the reference path): see predictor.ServedPath.
            "served_kernel": predictor.served.reproduced if predictor else False,
            "store": self._shown_store(),
            "store_reachable": self.watcher.store_reachable,
            "store_current_readable": self.watcher.current_readable,
            "last_store_error": self.watcher.last_store_error,
            "refused_versions": dict(self.watcher.refused),
            "poll_interval_s": self.settings.poll_interval_s,
        }
        if self.settings.expose_internals:
            body["worker_pid"] = os.getpid()
        return body

    def _shown_store(self) -> str | None:
        """The store's URL; a directory's path only with --expose-internals."""
        s = self.settings
        if not s.store or s.store_is_url or s.expose_internals:
            return s.store or None
        return "directory"

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        predictor = self.watcher.current
        if predictor is None:
            return json_response({"status": "not ready", "detail": "Models not ready"}, 503)
        return json_response(
            {"status": "ready", "model_version": predictor.version, "model_kind": predictor.kind}
        )

    async def reload(self, request: Request) -> Response:
        """Re-read the store now; the body is ``/status`` (clients poll ``is_ready``) plus ``changed``."""
        check_token(request, self.settings.token)
        changed = await self.watcher.reload()
        return json_response({"status": "ok", "changed": changed, **self._status()})

    async def root(self, request: Request) -> Response:
        predictor = self.watcher.current
        return json_response(
            root_body(
                "prediction_server",
                is_ready=predictor is not None,
                objective_type=predictor.objective_type if predictor else "quantile",
                quantile=predictor.quantile if predictor else self.settings.quantile,
                model_version=predictor.version if predictor else None,
                model_kind=predictor.kind if predictor else None,
                last_model_load=predictor.last_model_load if predictor else None,
                endpoints=[r.path for r in self.routes()],
            )
        )

    async def metrics_endpoint(self, request: Request) -> Response:
        return metrics_response(self.metrics.registry)


class _AsgiEndpoint:
    """A raw ASGI handler as a Starlette route's endpoint (an object, so Starlette does not wrap
    it as a request/response function)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)
