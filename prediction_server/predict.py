"""The prediction endpoints as raw ASGI handlers: the hot path of every scheduler call.

``POST /predict/bulk/strict``, ``/predict/bulk`` and ``/predict`` are dispatched by the app before
Starlette's middleware stack and router (``shared.http.FastPathApp``), read the body from ASGI
messages within the byte limit, and answer bytes from ``prediction_server.responses``: msgspec
decodes a valid body straight into a row matrix (``shared.row_decoder``; anything else takes
orjson and the shared validation, which accepts it or writes the 422), one compiled pass builds
the features and evaluates both models (``Predictor.predict_rows``), prebuilt bytes out. No
pydantic model or dict is built per row.
Errors become responses in ``shared.http.error_response``, with the same statuses, headers and
bodies as every other route's (the rejection counter included).

Each call reads ``watcher.current`` once, so one call is answered by one version even if a new
version is swapped in meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from prediction_server.metrics import PredictionMetrics
from prediction_server.predictor import Predictor
from prediction_server.responses import bulk_body, prediction_items
from prediction_server.store_watcher import StoreWatcher
from shared.errors import InvalidInput, ModelsNotReady
from shared.http import ASGIApp, check_declared_size, error_response, receive_body
from shared.row_decoder import decode_bulk, decode_row, from_columns
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
_LENGTH = b"content-length"
_JSON = (b"content-type", b"application/json")

# (the version answering, the body, the start time) -> (the response body, rows answered)
Handler = Callable[[Predictor, bytes, float], Awaitable[tuple[bytes, int]]]


class PredictionEndpoints:
    """The three prediction handlers, bound to one app's watcher and metrics."""

    def __init__(self, watcher: StoreWatcher, metrics: PredictionMetrics, max_body_bytes: int) -> None:
        self.watcher = watcher
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    def handlers(self) -> dict[str, ASGIApp]:
        return {
            "/predict/bulk/strict": self._asgi(self._bulk_strict, "predict_bulk_strict"),
            "/predict/bulk": self._asgi(self._bulk, "predict_bulk"),
            "/predict": self._asgi(self._single, "predict"),
        }

    def _asgi(self, handler: Handler, endpoint: str) -> ASGIApp:
        metrics = self.metrics
        max_body = self.max_body_bytes

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            started = time.perf_counter()
            try:
                predictor = self.watcher.current
                if predictor is None:
                    raise ModelsNotReady()
                check_declared_size(_content_length(scope["headers"]), max_body)
                raw = await receive_body(receive, max_body)
                body, rows = await handler(predictor, raw, started)
            except Exception as exc:
                metrics.observe_failure(endpoint, exc, time.perf_counter() - started)
                await error_response(exc, scope["path"], metrics.count_error)(scope, receive, send)
                return
            metrics.observe_success(endpoint, rows, time.perf_counter() - started)
            headers = [(_LENGTH, b"%d" % len(body)), _JSON]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return app

    async def _bulk_strict(self, predictor: Predictor, raw: bytes, started: float) -> tuple[bytes, int]:
        rows = decode_bulk(raw)
        if rows is None:  # unusual or invalid: the general path accepts it or writes the 422
            rows = from_columns(parse_rows(_rows(raw)))
        ttft, tpot = predictor.predict_rows(rows)
        items = prediction_items(predictor.encoded_constants, ttft, tpot)
        return bulk_body(items, len(ttft), predictor.version, started), len(ttft)

    async def _bulk(self, predictor: Predictor, raw: bytes, started: float) -> tuple[bytes, int]:
        """Every row valid: predictions, ``null`` (with an error item) for a row that was valid but
        could not be predicted (a non-finite model output). Any invalid row: the whole-body 422
        of ``parse_rows``, naming every bad row and field (as the llm-d predictor does)."""
        rows = decode_bulk(raw)
        if rows is None:
            requests = _rows(raw)
            columns = valid_columns(requests)
            if columns is None:  # invalid: the full 422, explained off the event loop when large
                columns = await parse_all_rows(requests)
            rows = from_columns(columns)
        ttft, tpot = predictor.predict_rows(rows)
        unpredictable = np.flatnonzero(~(np.isfinite(ttft) & np.isfinite(tpot))).tolist()
        errors = []
        if unpredictable:
            requests = loads(raw)["requests"]
            errors = [
                {"index": index, "error": "the model gave no finite prediction", "request": requests[index]}
                for index in unpredictable
            ]
            self.metrics.item_errors.inc(len(errors))
        items = prediction_items(predictor.encoded_constants, ttft, tpot, unpredictable)
        return bulk_body(items, len(ttft), predictor.version, started, errors), len(ttft) - len(errors)

    async def _single(self, predictor: Predictor, raw: bytes, started: float) -> tuple[bytes, int]:
        rows = decode_row(raw)
        if rows is None:
            rows = from_columns(parse_row(loads(raw)))
        ttft, tpot = predictor.predict_rows(rows)
        return prediction_items(predictor.encoded_constants, ttft, tpot), 1


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _rows(raw: bytes) -> list[Any]:
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
