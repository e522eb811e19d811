"""The training-sample relay: accept at once (202), buffer, forward in bulk at an adaptive rate.

Senders (the scheduler's Go client) drop a batch on any answer but 202, so acceptance must be
cheap and honest: validated samples go into a bounded buffer and the sender gets 202; a full
buffer answers 429 with ``Retry-After`` so the sender knows nothing was taken.

One sender task forwards the buffer to ``{training_url}/add_training_data_bulk`` one bulk call at
a time. New batches start at most ``rate`` times per second, and the rate follows AIMD: plus
``step`` after every accepted batch, times ``factor`` after a 429, a 5xx, a timeout or a network
error, clamped to ``[min_rate, max_rate]``. A batch that failed stays ours and is sent again
before anything else, after a short backoff (or the server's ``Retry-After``) rather than after
the rate interval, so a brief training-server restart loses nothing: samples wait in the buffer
and arrive once it answers again. Delivery is at least once (a timed-out call that actually
landed is sent again). Samples are dropped only when the training server refuses them as
invalid or too large, or when shutdown outlasts ``relay_drain_s``; each drop is counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from coalescer.metrics import CoalescerMetrics
from shared.errors import IngestSaturated
from shared.logging import log_event
from shared.schemas import ZERO_TIMESTAMPS

log = logging.getLogger(__name__)

RELAY_PATH = "/add_training_data_bulk"
RETRY_BACKOFF_MIN_S = 0.05
RETRY_BACKOFF_MAX_S = 1.0
RETRY_AFTER_CAP_S = 5.0


class AimdRate:
    """Additive-increase / multiplicative-decrease send rate in batches per second."""

    def __init__(
        self, *, min_rate: float, max_rate: float, initial: float, step: float, factor: float
    ) -> None:
        self.min_rate = min_rate
        self.max_rate = max_rate
        self.step = step
        self.factor = factor
        self.rate = self._clamp(initial)

    def increase(self) -> None:
        self.rate = self._clamp(self.rate + self.step)

    def decrease(self) -> None:
        self.rate = self._clamp(self.rate * self.factor)

    @property
    def interval_s(self) -> float:
        return 1.0 / self.rate

    def _clamp(self, rate: float) -> float:
        return min(self.max_rate, max(self.min_rate, rate))


class SampleRelay:
    """Bounded buffer of accepted samples and the task that forwards them."""

    def __init__(
        self,
        training_url: str,
        http: httpx.AsyncClient,
        metrics: CoalescerMetrics,
        rate: AimdRate,
        *,
        capacity: int,
        batch_samples: int,
        timeout_s: float,
        token: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.url = training_url.rstrip("/") + RELAY_PATH
        self._http = http
        self._metrics = metrics
        self.rate = rate
        self.capacity = capacity
        self.batch_samples = batch_samples
        self.timeout_s = timeout_s
        self._headers = {"content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._clock = clock
        self._sleep = sleep
        self._buffer: deque[dict[str, Any]] = deque()
        self._retry: list[dict[str, Any]] | None = None
        self._next_start = 0.0
        self._backoff_s = RETRY_BACKOFF_MIN_S
        self._wakeup = asyncio.Event()
        self.relayed = 0
        self.dropped = 0
        self.last_outcome: str | None = None

    @property
    def buffered(self) -> int:
        """Samples accepted and not yet delivered (waiting, or in the batch being sent or retried)."""
        return len(self._buffer) + (len(self._retry) if self._retry else 0)

    def accept(self, entries: list[dict[str, Any]]) -> int:
        """Take validated entries, all or nothing; raise ``IngestSaturated`` (429) when they do not fit."""
        n = len(entries)
        if self.buffered + n > self.capacity:
            raise IngestSaturated(
                f"relay buffer full: {self.buffered} samples waiting for the training server "
                f"(capacity {self.capacity})",
                retry_after_s=max(1.0, self.rate.interval_s),
            )
        # "No timestamp" means "now" to the training server; now is when we received it, not when
        # the relay gets round to sending it.
        stamp: str | None = None
        for entry in entries:
            ts = entry.get("timestamp")
            if ts is None or ts in ZERO_TIMESTAMPS:
                stamp = stamp or datetime.now(UTC).isoformat().replace("+00:00", "Z")
                entry["timestamp"] = stamp
        self._buffer.extend(entries)
        self._metrics.relay_accepted.inc(n)
        self._wakeup.set()
        return n

    async def run(self) -> None:
        """Forward forever (the app's lifespan owns and cancels this task)."""
        while True:
            if self._retry is not None:
                batch = self._retry
            else:
                if not self._buffer:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                wait_s = self._next_start - self._clock()
                if wait_s > 0:
                    await self._sleep(wait_s)
                    continue
                batch = self._take()
            self._next_start = self._clock() + self.rate.interval_s
            delay_s = await self.send(batch)
            if delay_s:
                await self._sleep(delay_s)

    def _take(self) -> list[dict[str, Any]]:
        count = min(self.batch_samples, len(self._buffer))
        return [self._buffer.popleft() for _ in range(count)]

    async def send(self, batch: list[dict[str, Any]]) -> float:
        """Send one batch; returns how long to wait before sending it again (0: it is done)."""
        self._retry = batch
        body = orjson.dumps({"entries": batch})
        retry_after: float | None = None
        try:
            response = await self._http.post(
                self.url, content=body, headers=self._headers, timeout=self.timeout_s
            )
            status = response.status_code
        except httpx.TimeoutException:
            outcome = "timeout"
        except httpx.HTTPError:
            outcome = "network"
        else:
            if 200 <= status < 300:
                outcome = "accepted"
            elif status == 429:
                outcome = "throttled"
                retry_after = _retry_after_s(response)
            elif status >= 500:
                outcome = "server_error"
            elif status in (401, 403):
                outcome = "unauthorized"
            else:
                outcome = "rejected"
        self._metrics.relay_batches.labels(outcome).inc()
        if outcome != self.last_outcome and (outcome != "accepted" or self.last_outcome is not None):
            log_event(
                log,
                "relay_outcome_changed",
                logging.INFO if outcome == "accepted" else logging.WARNING,
                outcome=outcome,
                rate=round(self.rate.rate, 2),
                buffered=self.buffered,
            )
        self.last_outcome = outcome
        if outcome == "accepted":
            self._retry = None
            self.rate.increase()
            self.relayed += len(batch)
            self._metrics.relay_relayed.inc(len(batch))
            self._backoff_s = RETRY_BACKOFF_MIN_S
            return 0.0
        if outcome == "rejected":
            # The training server refuses these samples as they are; sending them again cannot help.
            self._retry = None
            self.dropped += len(batch)
            self._metrics.relay_dropped.labels("rejected").inc(len(batch))
            log_event(log, "relay_batch_dropped", logging.ERROR, samples=len(batch), status=status)
            return 0.0
        if outcome != "unauthorized":
            self.rate.decrease()
        delay_s = self._backoff_s
        self._backoff_s = min(RETRY_BACKOFF_MAX_S, self._backoff_s * 2)
        if retry_after is not None:
            delay_s = max(delay_s, retry_after)
        return delay_s

    async def drain(self, budget_s: float) -> None:
        """On shutdown: send on, ignoring the rate, for up to ``budget_s``; count what is left as dropped."""
        deadline = self._clock() + budget_s
        while self.buffered and self._clock() < deadline:
            batch = self._retry if self._retry is not None else self._take()
            delay_s = await self.send(batch)
            if delay_s:
                await self._sleep(min(delay_s, max(0.0, deadline - self._clock())))
        left = self.buffered
        if left:
            self.dropped += left
            self._metrics.relay_dropped.labels("shutdown").inc(left)
            self._buffer.clear()
            self._retry = None
        log_event(log, "relay_drained", relayed=self.relayed, dropped=self.dropped, left_behind=left)

    def snapshot(self) -> dict[str, Any]:
        return {
            "training_url": self.url.removesuffix(RELAY_PATH),
            "buffered_samples": self.buffered,
            "capacity": self.capacity,
            "rate_batches_per_s": round(self.rate.rate, 3),
            "relayed_samples": self.relayed,
            "dropped_samples": self.dropped,
            "last_outcome": self.last_outcome,
        }


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return min(RETRY_AFTER_CAP_S, max(0.0, float(value)))
    except ValueError:
        return None
