"""The prediction endpoints as raw ASGI handlers: the scheduler's hot path.

``/predict/bulk/strict``, ``/predict/bulk`` and ``/predict`` read the body from ASGI messages,
answer with orjson bytes, and are dispatched by the app before Starlette's middleware stack and
router (see ``shared.http.FastPathApp``). On this 2-core box that stack (error and exception middleware,
routing, ``Request``/``Response`` objects) costs a few tens of µs per call,
a large share of the 300 µs the coalescer may add. Errors still become responses in
``shared.http.error_response`` with the app's rejection counter, as every other route's do.

Each caller's rows are validated here with ``shared.schemas`` before they reach the batcher, so
an invalid caller gets its own 422 and never shares a batch: the batcher only sees valid rows.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from coalescer.batcher import Batcher, ClientDisconnected, Ticket
from shared.errors import DeadlineExceeded, InvalidInput, Overloaded, ServiceError
from shared.http import ASGIApp, check_declared_size, dump_json, error_response, receive_body
from shared.schemas import loads, parse_all_rows, parse_row, parse_rows, require_list, rows_valid

Handler = Callable[[bytes, "_Call"], Awaitable[Any]]

# Loop lag below this is ordinary jitter on a busy machine: it still counts against the deadline,
# but sheds nobody (a 30 ms deadline would otherwise be shed at 9 ms of lag).
MIN_SHED_LAG_S = 0.02
_JSON_HEADER = (b"content-type", b"application/json")


class LoopLagging(Overloaded):
    """503 at once: the event loop is so late that this call would most likely miss its deadline."""

    reason = "loop_lag"


class _Call:
    """What a handler needs to know about its call besides the body."""

    __slots__ = ("deadline", "receive", "started")

    def __init__(self, started: float, deadline: float, receive: Any) -> None:
        self.started = started
        self.deadline = deadline
        self.receive = receive


class PredictionEndpoints:
    """Builds the three raw ASGI prediction handlers around one batcher."""

    def __init__(
        self,
        batcher: Callable[[], Batcher],
        *,
        default_deadline_ms: float,
        max_body_bytes: int,
        count_call: Callable[[str], Callable[[], None]],
        time_call: Callable[[str, int], Callable[[float], None]],
        on_error: Callable[[ServiceError], None],
        loop_lag: Callable[[], float] = lambda: 0.0,
        max_lag_share: float = 1.0,
    ) -> None:
        self._batcher = batcher
        self._loop_lag = loop_lag
        self._max_lag_share = max_lag_share
        self._default_deadline_s = default_deadline_ms / 1000.0
        self._max_body = max_body_bytes
        self._count_call = count_call
        self._time_call = time_call
        self._on_error = on_error

    def handlers(self) -> dict[str, ASGIApp]:
        return {
            "/predict/bulk/strict": self._asgi(self._bulk_strict, "bulk_strict"),
            "/predict/bulk": self._asgi(self._bulk, "bulk"),
            "/predict": self._asgi(self._single, "single"),
        }

    def _asgi(self, handler: Handler, name: str) -> ASGIApp:
        count = self._count_call(name)
        timers: dict[int, Callable[[float], None]] = {}

        async def endpoint(scope: dict[str, Any], receive: Any, send: Any) -> None:
            started = time.monotonic()
            lag_s = 0.0
            count()
            try:
                deadline_s, declared = self._scan_headers(scope["headers"])
                # The loop's lag is time this call most likely spent queued before this handler:
                # it counts against the deadline, and beyond a share of it the call is shed at once.
                lag_s = self._loop_lag()
                if lag_s > max(MIN_SHED_LAG_S, self._max_lag_share * deadline_s):
                    raise LoopLagging(
                        f"overloaded: the event loop runs {lag_s * 1000:.0f} ms late", retry_after_s=1.0
                    )
                check_declared_size(declared, self._max_body)
                body = await receive_body(receive, self._max_body, _disconnected)
                call = _Call(started, started - lag_s + deadline_s, receive)
                result = await handler(body, call)
                payload = dump_json(result)
            except Exception as exc:
                response = error_response(exc, scope["path"], self._on_error)
                status = response.status_code
                await response(scope, receive, send)
            else:
                status = 200
                headers = [_JSON_HEADER, (b"content-length", b"%d" % len(payload))]
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": payload})
            observe = timers.get(status)
            if observe is None:
                observe = timers[status] = self._time_call(name, status)
            observe(time.monotonic() - started + lag_s)  # from the estimated arrival

        return endpoint

    def _scan_headers(self, raw: list[tuple[bytes, bytes]]) -> tuple[float, int | None]:
        """The call's deadline (the default, or a shorter ``X-Deadline-Ms``) and its Content-Length."""
        deadline_s = self._default_deadline_s
        declared: int | None = None
        for name, value in raw:
            if name == b"x-deadline-ms":
                deadline_s = min(deadline_s, _deadline_header_s(value))
            elif name == b"content-length" and value.isdigit():
                declared = int(value)
        return deadline_s, declared

    # handlers: body bytes in, JSON-able result out
    async def _bulk_strict(self, body: bytes, call: _Call) -> Any:
        batcher = self._batcher()
        batcher.check_admission(1, call.deadline)  # a full queue refuses before any parsing
        rows = require_list(loads(body), "requests")
        batcher.check_admission(len(rows), call.deadline)  # ... and before validation
        if not rows_valid(rows):
            parse_rows(rows)  # raises the precise 422
        predictions = await self._predict(rows, call)
        n = len(predictions)
        return {
            "predictions": predictions,
            "total_requests": n,
            "successful_predictions": n,
            "failed_predictions": 0,
            "processing_time_ms": (time.monotonic() - call.started) * 1000.0,
        }

    async def _single(self, body: bytes, call: _Call) -> Any:
        self._batcher().check_admission(1, call.deadline)
        row = loads(body)
        if not rows_valid([row]):
            parse_row(row)  # raises the precise 422
        return (await self._predict([row], call))[0]

    async def _bulk(self, body: bytes, call: _Call) -> Any:
        """As the prediction server: a whole-body 422 naming every bad item and field when any
        item is invalid; otherwise every item answered (a ``null`` only for an item the replica
        could not predict, with its entry in ``errors``)."""
        batcher = self._batcher()
        batcher.check_admission(1, call.deadline)
        items = require_list(loads(body), "requests")
        batcher.check_admission(len(items), call.deadline)
        if not rows_valid(items):
            await parse_all_rows(items)  # raises the precise, complete 422
        predictions = await self._predict(items, call)
        errors = [
            {"index": i, "error": "the model gave no prediction", "request": items[i]}
            for i, prediction in enumerate(predictions)
            if prediction is None
        ]
        return {
            "predictions": predictions,
            "total_requests": len(items),
            "successful_predictions": len(items) - len(errors),
            "failed_predictions": len(errors),
            "processing_time_ms": (time.monotonic() - call.started) * 1000.0,
            "errors": errors,
        }

    async def _predict(self, rows: list[Any], call: _Call) -> list[Any]:
        """Queue validated rows and wait for their predictions.

        While a ticket waits in the queue, a watcher listens for the client hanging up so the
        ticket is dropped before dispatch; a ticket that left at once needs no watcher.
        """
        batcher = self._batcher()
        tickets = batcher.submit(rows, call.deadline)
        watcher = None
        if any(t.waiting for t in tickets):
            watcher = asyncio.get_running_loop().create_task(
                _watch_disconnect(batcher, tickets, call.receive)
            )
        try:
            if len(tickets) == 1:
                predictions: list[Any] = await tickets[0].future
            else:
                predictions = []
                for ticket in tickets:
                    predictions.extend(await ticket.future)
            # Predictions that came back after the caller's deadline (counted from its estimated
            # arrival, see coalescer.loop_lag) are an answer nobody waits for any more.
            if time.monotonic() > call.deadline:
                raise DeadlineExceeded("deadline exceeded before the prediction arrived")
            return predictions
        finally:
            if watcher is not None:
                watcher.cancel()
            for ticket in tickets:
                batcher.abandon(ticket)


def _disconnected() -> ClientDisconnected:
    return ClientDisconnected("client disconnected")


async def _watch_disconnect(batcher: Batcher, tickets: list[Ticket], receive: Any) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass
    for ticket in tickets:
        batcher.abandon(ticket, "disconnected", ClientDisconnected("client disconnected"))


def _deadline_header_s(value: bytes) -> float:
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
    return ms / 1000.0
