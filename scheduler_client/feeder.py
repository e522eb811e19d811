"""Buffered, backpressure-aware delivery of completed-request samples to the training side.

``SampleFeeder.add`` is synchronous and never blocks: it appends to a bounded buffer (when
full, the *oldest* sample is dropped and counted: for an online model the newest samples
matter most). One background task sends the buffer in bulk, at most ``batch_size`` (<= 1000)
entries per ``POST /add_training_data_bulk``, every ``flush_interval_s`` or as soon as a full
batch is waiting. Answers:

- 202: delivered.
- 429: the receiver is saturated. Wait ``Retry-After`` seconds (capped at
  ``max_retry_after_s``; exponential backoff if the header is missing), then resend the same
  batch. Nothing else is sent meanwhile, so the buffer absorbs the pressure.
- 503, other 5xx, 408, timeouts, connection errors: exponential backoff from
  ``backoff_initial_s`` doubling to ``backoff_max_s`` (``Retry-After`` honoured if present),
  then resend; after ``max_attempts`` attempts the batch is dropped and counted.
- 422: some entries are invalid. If the body names every bad entry (``loc`` =
  ``["body", "entries", i, field]`` and ``total_errors`` equals the items listed), those are
  dropped and the rest resent once; otherwise the whole batch is counted as rejected.
- Any other 4xx: the batch is rejected (resending cannot help).

Start it with ``await feeder.start()`` (or use the ``LatencyClient``, which does) and stop it
with ``await feeder.aclose()``, which tries to deliver what is buffered within a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from scheduler_client.types import Row
from shared.client import retry_after_s

log = logging.getLogger(__name__)

MAX_BATCH = 1000  # the llm-d client's per-flush limit, which receivers are sized for
_JSON_HEADERS = {"content-type": "application/json"}


def training_entry(
    row: Row, actual_ttft_ms: float, actual_tpot_ms: float, timestamp: str | None = None
) -> dict[str, Any]:
    """A training entry: the routing-time feature row plus what the request actually got.

    ``actual_tpot_ms=0`` means "no TPOT" (a one-token output); ``timestamp`` is RFC 3339, or
    ``None`` for "now" (the receiver's clock).
    """
    entry = dict(row)
    entry["actual_ttft_ms"] = float(actual_ttft_ms)
    entry["actual_tpot_ms"] = float(actual_tpot_ms)
    if timestamp is not None:
        entry["timestamp"] = timestamp
    return entry


@dataclass(frozen=True, slots=True)
class FeederConfig:
    """Buffering and retry settings of a ``SampleFeeder`` (seconds unless named otherwise)."""

    batch_size: int = MAX_BATCH
    flush_interval_s: float = 1.0
    max_buffered: int = 50_000
    request_timeout_s: float = 5.0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 10.0
    max_retry_after_s: float = 60.0
    max_attempts: int = 8

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be in 1..{MAX_BATCH}")
        if self.max_buffered < 1 or self.max_attempts < 1:
            raise ValueError("max_buffered and max_attempts must be >= 1")
        if min(self.flush_interval_s, self.request_timeout_s, self.backoff_initial_s) <= 0:
            raise ValueError("intervals and timeouts must be > 0")
        if self.backoff_max_s < self.backoff_initial_s or self.max_retry_after_s < 0:
            raise ValueError("need backoff_max_s >= backoff_initial_s and max_retry_after_s >= 0")


@dataclass(slots=True)
class FeederCounters:
    """What happened to the samples handed to the feeder (all monotonically increasing)."""

    queued: int = 0  # accepted by add()
    sent: int = 0  # acknowledged with 202
    batches_sent: int = 0
    dropped_buffer_full: int = 0  # oldest samples pushed out of a full buffer
    rejected_invalid: int = 0  # refused by the receiver (422 / other 4xx)
    dropped_after_retries: int = 0  # batches that failed max_attempts times, in samples
    dropped_on_close: int = 0  # still buffered when aclose() gave up
    throttled: int = 0  # 429 answers
    retries: int = 0  # resends after 5xx, timeouts, network errors


class SampleFeeder:
    """Bounded sample buffer with one background sender (see the module docstring)."""

    def __init__(
        self, training_url: str, http: httpx.AsyncClient, config: FeederConfig | None = None
    ) -> None:
        self.url = training_url.rstrip("/") + "/add_training_data_bulk"
        self.config = config or FeederConfig()
        self.counters = FeederCounters()
        self.paused_until_s = 0.0  # time.monotonic() before which the receiver asked us to wait
        self._http = http
        self._buffer: deque[dict[str, Any]] = deque()
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: asyncio.Task[None] | None = None

    @property
    def buffered(self) -> int:
        """Samples waiting, including a batch being sent."""
        return len(self._buffer) + self._in_flight

    def add(self, entry: Mapping[str, Any]) -> None:
        """Queue one training entry (see ``training_entry``); never blocks."""
        if len(self._buffer) >= self.config.max_buffered:
            self._buffer.popleft()
            self.counters.dropped_buffer_full += 1
        self._buffer.append(dict(entry))
        self.counters.queued += 1
        self._drained.clear()
        if len(self._buffer) >= self.config.batch_size:
            self._wake.set()

    def add_many(self, entries: Sequence[Mapping[str, Any]]) -> None:
        for entry in entries:
            self.add(entry)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sample-feeder")

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Send everything buffered now; True once delivered (or dropped), False on timeout."""
        self._wake.set()
        try:
            async with asyncio.timeout(timeout_s):
                await self._drained.wait()
        except TimeoutError:
            return False
        return True

    async def aclose(self, flush_timeout_s: float = 5.0) -> None:
        """Try to deliver what is buffered within ``flush_timeout_s``, then stop the sender."""
        if self._task is not None:
            await self.flush(flush_timeout_s)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.counters.dropped_on_close += self.buffered
        self._buffer.clear()
        self._in_flight = 0

    async def _run(self) -> None:
        cfg = self.config
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(cfg.flush_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            while self._buffer:
                n = min(len(self._buffer), cfg.batch_size)
                batch = [self._buffer.popleft() for _ in range(n)]
                self._in_flight = n
                try:
                    await self._deliver(batch)
                except asyncio.CancelledError:
                    self._buffer.extendleft(reversed(batch))  # aclose() counts them
                    raise
                except Exception:  # never let one bad batch kill the sender
                    log.exception("sample batch delivery failed")
                    self.counters.dropped_after_retries += n
                finally:
                    self._in_flight = 0
            if not self._buffer:
                self._drained.set()

    async def _deliver(self, batch: list[dict[str, Any]]) -> None:
        cfg = self.config
        backoff_s = cfg.backoff_initial_s
        trimmed = False
        for attempt in range(1, cfg.max_attempts + 1):
            response: httpx.Response | None = None
            try:
                response = await self._http.post(
                    self.url,
                    content=orjson.dumps({"entries": batch}),
                    headers=_JSON_HEADERS,
                    timeout=cfg.request_timeout_s,
                )
            except httpx.HTTPError as exc:
                log.debug("sample batch attempt %d failed: %r", attempt, exc)
            status = response.status_code if response is not None else None
            if status == 202:
                self.counters.sent += len(batch)
                self.counters.batches_sent += 1
                return
            if status == 422 and not trimmed and response is not None:
                bad = _invalid_indices(response, len(batch))
                if bad:
                    trimmed = True
                    self.counters.rejected_invalid += len(bad)
                    batch = [entry for i, entry in enumerate(batch) if i not in bad]
                    if not batch:
                        return
                    continue
            if status is not None and 400 <= status < 500 and status not in (408, 429):
                self.counters.rejected_invalid += len(batch)
                log.warning("training receiver refused %d samples with %d", len(batch), status)
                return
            if attempt == cfg.max_attempts:
                break
            hinted = retry_after_s(response.headers, cfg.max_retry_after_s) if response is not None else None
            if status == 429:
                self.counters.throttled += 1
            else:
                self.counters.retries += 1
            wait_s = hinted if hinted is not None else backoff_s
            if hinted is None:
                backoff_s = min(backoff_s * 2.0, cfg.backoff_max_s)
            self.paused_until_s = time.monotonic() + wait_s
            await asyncio.sleep(wait_s)
        self.counters.dropped_after_retries += len(batch)
        log.warning("dropped %d samples after %d attempts", len(batch), cfg.max_attempts)


def _invalid_indices(response: httpx.Response, batch_len: int) -> set[int] | None:
    """Entry indices a 422 names, if it names every error; else None (reject the whole batch)."""
    try:
        body = orjson.loads(response.content)
        items = body["detail"]
        total = int(body.get("total_errors", len(items)))
        if not isinstance(items, list) or total != len(items):
            return None
        bad = set()
        for item in items:
            loc = item["loc"]
            index = loc[2]
            if loc[:2] != ["body", "entries"] or type(index) is not int or not 0 <= index < batch_len:
                return None
            bad.add(index)
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        return None
    return bad
