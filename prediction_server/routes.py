"""HTTP endpoints of wire-contract.md section 2, plus /metrics.

The prediction endpoints are plain Starlette routes over the raw body: orjson in, shared
vectorised validation into numpy columns, the shared feature function, one forest call per
model, orjson out. No pydantic model or other Python object is built per row, except the
response dicts, whose constant part is built once per model version and per call.

Each call reads ``watcher.current`` once, so one call is answered by one version even if a
new version is swapped in meanwhile.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from prediction_server.config import PredictionSettings
from prediction_server.metrics import PredictionMetrics
from prediction_server.predictor import Predictor
from prediction_server.store_watcher import StoreWatcher
from shared.artifacts import MODEL_NAMES
from shared.errors import InvalidInput, ModelsNotReady
from shared.features import FEATURE_VERSION, build_features
from shared.http import check_token, json_response, read_body
from shared.identity import MODEL_TYPE, root_body
from shared.metrics import metrics_response
from shared.schemas import (
    MAX_BULK_ROWS,
    loads,
    parse_all_rows,
    parse_row,
    parse_rows,
    require_list,
    valid_columns,
)

# Any row without this key is invalid, so a body holding it more often than the row limit
# cannot be a valid request: refuse it without parsing it.
_ROW_MARKER = b'"input_token_length"'


class PredictionApi:
    """The endpoints, bound to one app's settings, watcher and metrics."""

    def __init__(
        self, settings: PredictionSettings, watcher: StoreWatcher, metrics: PredictionMetrics
    ) -> None:
        self.settings = settings
        self.watcher = watcher
        self.metrics = metrics
        self.max_body_bytes = settings.max_body_bytes

    def routes(self) -> list[Route]:
        return [
            Route("/predict/bulk/strict", self.predict_bulk_strict, methods=["POST"]),
            Route("/predict/bulk", self.predict_bulk, methods=["POST"]),
            Route("/predict", self.predict, methods=["POST"]),
            Route("/status", self.status, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/reload", self.reload, methods=["POST"]),
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            Route("/", self.root, methods=["GET"]),
        ]

    # -- predictions -------------------------------------------------------------------------

    async def predict_bulk_strict(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            predictor = self._predictor()
            rows = await self._rows(request)
            ttft, tpot = predictor.predict(build_features(parse_rows(rows)))
            body = _bulk_body(predictor, _predictions(predictor, ttft, tpot), len(rows), None, started)
        except Exception as exc:
            self.metrics.observe_failure("predict_bulk_strict", exc, time.perf_counter() - started)
            raise
        self.metrics.observe_success("predict_bulk_strict", len(rows), time.perf_counter() - started)
        return Response(body, media_type="application/json")

    async def predict_bulk(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            predictor = self._predictor()
            rows = await self._rows(request)
            predictions, errors = await self._lenient(predictor, rows)
            body = _bulk_body(predictor, predictions, len(rows), errors, started)
        except Exception as exc:
            self.metrics.observe_failure("predict_bulk", exc, time.perf_counter() - started)
            raise
        if errors:
            self.metrics.item_errors.inc(len(errors))
        self.metrics.observe_success("predict_bulk", len(rows) - len(errors), time.perf_counter() - started)
        return Response(body, media_type="application/json")

    async def _lenient(
        self, predictor: Predictor, rows: list[Any]
    ) -> tuple[list[dict[str, Any] | None], list[dict[str, Any]]]:
        """Every row valid: predictions, ``None`` (with an error item) for a row that was valid but
        could not be predicted (a non-finite model output). Any invalid row: the whole-body 422
        of ``parse_rows``, naming every bad row and field (as the llm-d predictor does)."""
        columns = valid_columns(rows)
        if columns is None:  # invalid: the full 422, explained off the event loop when large
            columns = await parse_all_rows(rows)
        ttft, tpot = predictor.predict(build_features(columns))
        predictions: list[dict[str, Any] | None] = list(_predictions(predictor, ttft, tpot))
        unpredictable = np.flatnonzero(~(np.isfinite(ttft) & np.isfinite(tpot))).tolist()
        errors = []
        for index in unpredictable:
            predictions[index] = None
            error = "the model gave no finite prediction"
            errors.append({"index": index, "error": error, "request": rows[index]})
        return predictions, errors

    async def predict(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            predictor = self._predictor()
            columns = parse_row(loads(await read_body(request, self.max_body_bytes)))
            ttft, tpot = predictor.predict(build_features(columns))
            body = orjson.dumps(_predictions(predictor, ttft, tpot)[0])
        except Exception as exc:
            self.metrics.observe_failure("predict", exc, time.perf_counter() - started)
            raise
        self.metrics.observe_success("predict", 1, time.perf_counter() - started)
        return Response(body, media_type="application/json")

    def _predictor(self) -> Predictor:
        predictor = self.watcher.current
        if predictor is None:
            raise ModelsNotReady()
        return predictor

    async def _rows(self, request: Request) -> list[Any]:
        raw = await read_body(request, self.max_body_bytes)
        if raw.count(_ROW_MARKER) > MAX_BULK_ROWS:
            raise InvalidInput(
                [
                    {
                        "type": "too_long",
                        "loc": ["body", "requests"],
                        "msg": f"List should have at most {MAX_BULK_ROWS} items after validation",
                        "input": None,
                    }
                ]
            )
        return require_list(loads(raw), "requests")

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


def _predictions(predictor: Predictor, ttft: np.ndarray, tpot: np.ndarray) -> list[dict[str, Any]]:
    constants = predictor.prediction_constants
    predicted_at = datetime.now(UTC).isoformat()
    return [
        {"ttft_ms": t, "tpot_ms": p, "predicted_at": predicted_at, **constants}
        for t, p in zip(ttft.tolist(), tpot.tolist(), strict=True)
    ]


def _bulk_body(
    predictor: Predictor,
    predictions: Sequence[dict[str, Any] | None],
    total: int,
    errors: list[dict[str, Any]] | None,
    started: float,
) -> bytes:
    failed = len(errors) if errors else 0
    return orjson.dumps(
        {
            "predictions": predictions,
            "total_requests": total,
            "successful_predictions": total - failed,
            "failed_predictions": failed,
            "processing_time_ms": (time.perf_counter() - started) * 1000.0,
            "model_version": predictor.version,
        }
        | ({} if errors is None else {"errors": errors})
    )
