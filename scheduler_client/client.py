"""Async client of the latency-model services for schedulers (httpx).

``LatencyClient`` asks for per-pod predictions in one ``POST /predict/bulk/strict`` call per
routing decision and feeds completed-request samples back through a ``SampleFeeder``.

Predictions::

    async with LatencyClient("http://coalescer:8001", "http://coalescer:8001") as client:
        predictions = await client.predict_for_routing(rows)   # None -> use the fallback score
        ...
        client.add_sample(row, actual_ttft_ms, actual_tpot_ms)

- ``predict(rows)`` makes one call with a *total* deadline of ``predict_timeout_s``
  (connect + send + wait + read; httpx's own timeouts are per phase), resent at once if the
  connection broke before any answer (a keep-alive race; predicting is idempotent). It
  returns the predictions in row order, or ``None`` when the service is unavailable:
  timeout, connection error, 5xx (including 503 "Models not ready" and the coalescer's 503
  "overloaded"), or a malformed answer. The reason is in ``last_error`` and the counters.
  A 422 is the caller's bug, not an outage: it raises ``InvalidRowsError`` with the
  service's field-precise detail.
- ``predict_for_routing(rows)`` is the hot path. In ``predicted`` mode it is ``predict``. In
  ``fallback`` mode it returns ``None`` at once, so routing never waits on a failing
  service, and at most once per ``probe_interval_s`` sends the same rows as a background
  probe; a successful probe switches back to ``predicted``. Every failed or late call
  counts towards falling back (``FallbackPolicy.failures_to_fallback`` in a row).
- ``mode`` says which is in force; ``counters`` say how often each happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from scheduler_client.fallback import FallbackPolicy, FallbackSwitch, Mode
from scheduler_client.feeder import FeederConfig, SampleFeeder, training_entry
from scheduler_client.types import Prediction, Row

log = logging.getLogger(__name__)

MAX_ROWS = 10_000  # the services' per-call limit
_BROKEN_CONNECTION = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
_JSON_HEADERS = {"content-type": "application/json"}


class InvalidRowsError(ValueError):
    """The service answered 422: the rows are invalid. ``detail`` is its list of error items."""

    def __init__(self, detail: Any) -> None:
        super().__init__(f"prediction rows rejected (422): {detail!r}"[:2000])
        self.detail = detail


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings of a ``LatencyClient`` (seconds unless named otherwise)."""

    predict_timeout_s: float = 0.1
    fallback: FallbackPolicy = field(default_factory=FallbackPolicy)
    feeder: FeederConfig = field(default_factory=FeederConfig)
    max_connections: int = 64
    # Below uvicorn's 5 s keep-alive, so we drop an idle connection before the server does.
    keepalive_expiry_s: float = 4.0

    def __post_init__(self) -> None:
        if not self.predict_timeout_s > 0 or self.max_connections < 1 or self.keepalive_expiry_s < 0:
            raise ValueError("need predict_timeout_s > 0, max_connections >= 1, keepalive_expiry_s >= 0")


@dataclass(slots=True)
class ClientCounters:
    """Prediction-side counters (the feeder has its own, ``client.feeder.counters``)."""

    predict_calls: int = 0
    predict_ok: int = 0
    predict_timeouts: int = 0  # late: no answer within predict_timeout_s
    predict_errors: int = 0  # connection errors, 5xx/503, malformed answers
    predict_invalid: int = 0  # 422 (raised to the caller)
    predict_retries: int = 0  # resent at once after the connection broke before an answer
    routed_with_predictions: int = 0  # predict_for_routing answered with predictions
    routed_with_fallback: int = 0  # ... answered None (fallback mode or a failed call)
    probes: int = 0  # background probes sent in fallback mode


class LatencyClient:
    """Predictions with automatic fallback, plus sample feeding (see the module docstring)."""

    def __init__(
        self,
        prediction_url: str,
        training_url: str | None = None,
        config: ClientConfig | None = None,
        *,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.config = config or ClientConfig()
        self.predict_url = prediction_url.rstrip("/") + "/predict/bulk/strict"
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(
            limits=httpx.Limits(
                max_connections=self.config.max_connections,
                max_keepalive_connections=self.config.max_connections,
                keepalive_expiry=self.config.keepalive_expiry_s,
            ),
            timeout=httpx.Timeout(self.config.feeder.request_timeout_s),
        )
        self.switch = FallbackSwitch(self.config.fallback)
        self.counters = ClientCounters()
        self.last_error: str | None = None
        self.last_model_version: str | None = None
        self.feeder = SampleFeeder(training_url, self._http, self.config.feeder) if training_url else None
        self._probes: set[asyncio.Task[None]] = set()

    @property
    def mode(self) -> Mode:
        """``predicted`` or ``fallback``."""
        return self.switch.mode

    async def __aenter__(self) -> LatencyClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the sample feeder's background sender (no-op without a training URL)."""
        if self.feeder is not None:
            await self.feeder.start()

    async def aclose(self, flush_timeout_s: float = 5.0) -> None:
        """Deliver buffered samples (bounded by ``flush_timeout_s``), cancel probes, close HTTP."""
        if self.feeder is not None:
            await self.feeder.aclose(flush_timeout_s)
        for task in list(self._probes):
            task.cancel()
        for task in list(self._probes):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._owns_http:
            await self._http.aclose()

    async def predict(self, rows: Sequence[Row]) -> list[Prediction] | None:
        """One bulk call; predictions in row order, or ``None`` if unavailable or late."""
        if not 1 <= len(rows) <= MAX_ROWS:
            raise ValueError(f"need 1..{MAX_ROWS} rows, got {len(rows)}")
        self.counters.predict_calls += 1
        body = orjson.dumps({"requests": list(rows)})
        try:
            async with asyncio.timeout(self.config.predict_timeout_s):
                try:
                    response = await self._http.post(self.predict_url, content=body, headers=_JSON_HEADERS)
                except _BROKEN_CONNECTION:
                    # A pooled connection the server had just closed: predicting is idempotent,
                    # so resend once on a fresh connection, within the same deadline.
                    self.counters.predict_retries += 1
                    response = await self._http.post(self.predict_url, content=body, headers=_JSON_HEADERS)
        except TimeoutError:
            self.counters.predict_timeouts += 1
            self._failed(f"timeout after {self.config.predict_timeout_s * 1e3:.0f} ms")
            return None
        except httpx.HTTPError as exc:
            self.counters.predict_errors += 1
            self._failed(f"{type(exc).__name__}: {exc}")
            return None
        if response.status_code == 422:
            self.counters.predict_invalid += 1
            raise InvalidRowsError(_detail(response))
        if response.status_code != 200:
            self.counters.predict_errors += 1
            self._failed(f"HTTP {response.status_code}: {_detail(response)!r}"[:500])
            return None
        predictions = _parse_predictions(response.content, len(rows))
        if predictions is None:
            self.counters.predict_errors += 1
            self._failed("malformed prediction response")
            return None
        self.counters.predict_ok += 1
        self.last_model_version = predictions[0].model_version
        previous = self.switch.mode
        self.switch.record_success()
        if previous is not self.switch.mode:
            log.info("predictions are back: leaving the fallback score")
        return predictions

    async def predict_for_routing(self, rows: Sequence[Row]) -> list[Prediction] | None:
        """The hot path: predictions, or ``None`` (use the fallback) without waiting when falling back."""
        predictions: list[Prediction] | None = None
        if self.switch.should_predict():
            predictions = await self.predict(rows)
        elif self.switch.try_start_probe(time.monotonic()):
            self.counters.probes += 1
            task = asyncio.create_task(self._probe(list(rows)), name="prediction-probe")
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)
        if predictions is None:
            self.counters.routed_with_fallback += 1
        else:
            self.counters.routed_with_predictions += 1
        return predictions

    def add_sample(self, row: Row, actual_ttft_ms: float, actual_tpot_ms: float) -> None:
        """Queue a completed request's sample (routing-time row + actual latencies) for training."""
        if self.feeder is None:
            raise RuntimeError("no training_url was given: samples cannot be fed")
        self.feeder.add(training_entry(row, actual_ttft_ms, actual_tpot_ms))

    async def flush_samples(self, timeout_s: float = 10.0) -> bool:
        """Deliver buffered samples now; False if that did not finish within ``timeout_s``."""
        return True if self.feeder is None else await self.feeder.flush(timeout_s)

    async def _probe(self, rows: list[Row]) -> None:
        try:
            await self.predict(rows)
        except Exception:  # a probe's outcome only matters through the switch
            log.exception("prediction probe failed unexpectedly")
        finally:
            self.switch.probe_finished()

    def _failed(self, reason: str) -> None:
        """Record a failed or late call; may switch to the fallback."""
        self.last_error = reason
        previous = self.switch.mode
        self.switch.record_failure(time.monotonic())
        if previous is not self.switch.mode:
            log.warning("predictions unavailable (%s): switching to the fallback score", reason)


def _detail(response: httpx.Response) -> Any:
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.text[:500]
    return body.get("detail", body) if isinstance(body, dict) else body


def _parse_predictions(content: bytes, expected: int) -> list[Prediction] | None:
    """Predictions from a strict bulk answer, or None if it is not one for ``expected`` rows."""
    try:
        items = orjson.loads(content)["predictions"]
        if not isinstance(items, list) or len(items) != expected:
            return None
        out = []
        for item in items:
            ttft, tpot = float(item["ttft_ms"]), float(item["tpot_ms"])
            if not (math.isfinite(ttft) and math.isfinite(tpot) and ttft >= 0 and tpot >= 0):
                return None
            version = item.get("model_version")
            out.append(Prediction(ttft, tpot, None if version is None else str(version)))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return out
