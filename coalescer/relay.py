"""The training-sample relay: forward each sender's request synchronously, pace admission with AIMD.

The sender's answer is the training server's answer. A request is admitted (or refused at once),
read, validated with the same rules and byte caps as the training server (``shared.schemas``),
and forwarded as it came to ``{training_url}/add_training_data_bulk``; the sender gets 202 only
once the training server answered 202, and the training server's 422/413/429/5xx with the same
body and ``Retry-After`` otherwise. The coalescer holds nothing it has acknowledged, so a crash
or a restart of either process loses nothing a sender was told was taken.

Admission is paced: a token bucket at the AIMD rate (requests per second; plus ``step`` after
every 202 from the training server, times ``factor`` after a 429, a 5xx, a timeout or a network
error, clamped to ``[min_rate, max_rate]``). Beyond the rate, or when the bodies in flight would
exceed ``max_inflight_bytes``, the sender gets 429 with ``Retry-After`` before its body is read.
Memory therefore stays bounded in bytes whatever the training server does.

Every forwarded request carries an ``Idempotency-Key`` (the sender's own, or a fresh UUID); a call
that times out or fails on the network is resent with the same key within ``wait_budget_s``,
without waiting for the rate, and the training server drops a key it already accepted, so
nothing is delivered twice. When the budget runs out the sender gets 504 (timed out: the samples
may have arrived; resending with the same key is safe) or 503 (unreachable).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from coalescer.metrics import CoalescerMetrics
from shared.errors import (
    DeadlineExceeded,
    IngestSaturated,
    InvalidInput,
    Overloaded,
    ServiceError,
    UpstreamUnavailable,
)
from shared.http import check_declared_size
from shared.logging import log_event
from shared.schemas import MAX_TRAINING_BODY_BYTES, parse_training_entries, require_entries

log = logging.getLogger(__name__)

RELAY_PATH = "/add_training_data_bulk"
IDEMPOTENCY_HEADER = "idempotency-key"
MAX_KEY_CHARS = 128
RETRY_BACKOFF_MIN_S = 0.05
RETRY_BACKOFF_MAX_S = 1.0
MIN_ATTEMPT_S = 0.05
BURST_S = 1.0  # the token bucket holds one second of the current rate
_PASSED_HEADERS = ("retry-after", "content-type")


class AimdRate:
    """Additive-increase / multiplicative-decrease rate (requests per second) and its token bucket."""

    def __init__(
        self,
        *,
        min_rate: float,
        max_rate: float,
        initial: float,
        step: float,
        factor: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_rate = min_rate
        self.max_rate = max_rate
        self.step = step
        self.factor = factor
        self.rate = self._clamp(initial)
        self._clock = clock
        self._tokens = self._burst
        self._filled_at = clock()

    def increase(self) -> None:
        self.rate = self._clamp(self.rate + self.step)

    def decrease(self) -> None:
        self.rate = self._clamp(self.rate * self.factor)

    def take(self) -> float:
        """Take one token: 0.0 if admitted, else the seconds until the next token."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._filled_at) * self.rate)
        self._filled_at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate

    @property
    def _burst(self) -> float:
        return max(1.0, self.rate * BURST_S)

    def _clamp(self, rate: float) -> float:
        return min(self.max_rate, max(self.min_rate, rate))


@dataclass(frozen=True)
class Answer:
    """What the sender gets back: the training server's status, body and relevant headers."""

    status: int
    body: bytes
    headers: dict[str, str]


class SampleRelay:
    """Admission, validation and synchronous forwarding of training samples."""

    def __init__(
        self,
        training_url: str,
        http: httpx.AsyncClient,
        metrics: CoalescerMetrics,
        rate: AimdRate,
        *,
        max_inflight_bytes: int,
        timeout_s: float,
        wait_budget_s: float,
        headers: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.url = training_url.rstrip("/") + RELAY_PATH
        self._http = http
        self._metrics = metrics
        self.rate = rate
        self.max_inflight_bytes = max_inflight_bytes
        self.timeout_s = timeout_s
        self.wait_budget_s = wait_budget_s
        self._headers = {"content-type": "application/json", **(headers or {})}
        self._clock = clock
        self._sleep = sleep
        self.inflight_bytes = 0
        self.inflight_requests = 0
        self.closing = False
        self.last_outcome: str | None = None

    async def handle(
        self, declared_bytes: int | None, read_body: Callable[[int], Awaitable[bytes]], key: str | None
    ) -> Answer:
        """One sender request: admit, read, validate, forward; every outcome is counted.

        ``read_body(limit)`` reads the body (413 beyond ``limit``); ``key`` is the sender's
        ``Idempotency-Key``, if it sent one.
        """
        try:
            answer = await self._handle(declared_bytes, read_body, key)
        except ServiceError as exc:
            self._metrics.relay_requests.labels(_refusal(exc)).inc()
            raise
        self._metrics.relay_requests.labels(_answered(answer.status)).inc()
        return answer

    async def _handle(
        self, declared_bytes: int | None, read_body: Callable[[int], Awaitable[bytes]], key: str | None
    ) -> Answer:
        if self.closing:
            raise Overloaded("the coalescer is shutting down", retry_after_s=1.0)
        check_declared_size(declared_bytes, MAX_TRAINING_BODY_BYTES)
        key = _checked_key(key) or uuid.uuid4().hex
        # A body without Content-Length may be as large as the cap: reserve that while it is read.
        reserved = MAX_TRAINING_BODY_BYTES if declared_bytes is None else declared_bytes
        self._reserve(reserved)
        try:
            body = await read_body(MAX_TRAINING_BODY_BYTES)
            self.inflight_bytes += len(body) - reserved
            reserved = len(body)
            samples = _validate(body)
            return await self._forward(body, samples, key)
        finally:
            self.inflight_bytes -= reserved
            self.inflight_requests -= 1

    def _reserve(self, size: int) -> None:
        if self.inflight_bytes + size > self.max_inflight_bytes:
            raise IngestSaturated(
                f"relay busy: {self.inflight_bytes} bytes of samples in flight to the training server "
                f"(bound {self.max_inflight_bytes})",
                retry_after_s=1.0,
            )
        wait_s = self.rate.take()
        if wait_s > 0:
            raise _RateLimited(
                f"relay rate limit: {self.rate.rate:.1f} requests per second; retry later",
                retry_after_s=wait_s,
            )
        self.inflight_bytes += size
        self.inflight_requests += 1

    async def _forward(self, body: bytes, samples: int, key: str) -> Answer:
        give_up_at = self._clock() + self.wait_budget_s
        headers = {**self._headers, IDEMPOTENCY_HEADER: key}
        backoff_s = RETRY_BACKOFF_MIN_S
        while True:
            timeout_s = max(MIN_ATTEMPT_S, min(self.timeout_s, give_up_at - self._clock()))
            response: httpx.Response | None = None
            try:
                response = await self._http.post(self.url, content=body, headers=headers, timeout=timeout_s)
            except httpx.TimeoutException:
                outcome = "timeout"
            except httpx.HTTPError:
                outcome = "network"
            else:
                outcome = _outcome(response.status_code)
            self._record(outcome)
            if response is not None and outcome != "unauthorized":
                if outcome == "accepted":
                    self.rate.increase()
                    self._metrics.relay_samples_accepted.inc(samples)
                elif outcome in ("throttled", "server_error"):
                    self.rate.decrease()
                return Answer(
                    response.status_code,
                    response.content,
                    {k: v for k in _PASSED_HEADERS if (v := response.headers.get(k)) is not None},
                )
            if outcome == "unauthorized":
                raise UpstreamUnavailable("the training server refused the coalescer's token (--auth-token)")
            # Timed out or failed on the network: it may have landed. Resend with the same key
            # (the training server drops a key it already took), ignoring the rate.
            self.rate.decrease()
            if give_up_at - self._clock() < backoff_s + MIN_ATTEMPT_S:
                break
            await self._sleep(backoff_s)
            backoff_s = min(RETRY_BACKOFF_MAX_S, backoff_s * 2)
            self._metrics.relay_retries.inc()
        if outcome == "timeout":
            raise DeadlineExceeded(
                f"the training server did not answer within {self.wait_budget_s:g} s; the samples may "
                f"have arrived: resend with the same Idempotency-Key ({key}) to be sure they arrive once"
            )
        raise TrainingUnreachable(
            f"the training server is unreachable (tried for {self.wait_budget_s:g} s); nothing was taken",
            headers={"Retry-After": "1"},
        )

    def _record(self, outcome: str) -> None:
        self._metrics.relay_batches.labels(outcome).inc()
        if outcome != self.last_outcome and (outcome != "accepted" or self.last_outcome is not None):
            log_event(
                log,
                "relay_outcome_changed",
                logging.INFO if outcome == "accepted" else logging.WARNING,
                outcome=outcome,
                rate=round(self.rate.rate, 2),
                inflight_bytes=self.inflight_bytes,
            )
        self.last_outcome = outcome

    def close(self) -> None:
        """Refuse new requests (503); those in flight finish or their senders get an error."""
        self.closing = True

    def snapshot(self) -> dict[str, Any]:
        m = self._metrics
        return {
            "training_url": self.url.removesuffix(RELAY_PATH),
            "mode": "synchronous",
            "rate_requests_per_s": round(self.rate.rate, 3),
            "inflight_requests": self.inflight_requests,
            "inflight_bytes": self.inflight_bytes,
            "max_inflight_bytes": self.max_inflight_bytes,
            "accepted_samples": int(m.relay_samples_accepted.value),
            "requests": {k[0]: int(c.value) for k, c in m.relay_requests.children.items()},
            "last_outcome": self.last_outcome,
        }


class _RateLimited(IngestSaturated):
    reason = "rate_limited"


class TrainingUnreachable(UpstreamUnavailable):
    """503: the training server could not be reached within the budget; nothing was taken."""

    status_code = 503
    reason = "training_unreachable"


def _validate(body: bytes) -> int:
    """422/413 exactly as the training server would; the parsed entries are freed on return."""
    entries = require_entries(body)
    parse_training_entries(entries, now_s=time.time())
    return len(entries)


def _checked_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_CHARS or not key.isascii() or not key.isprintable():
        raise InvalidInput(
            [
                {
                    "type": "string_type",
                    "loc": ["header", IDEMPOTENCY_HEADER],
                    "msg": f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} printable ASCII characters",
                    "input": key[:MAX_KEY_CHARS],
                }
            ]
        )
    return key


def _outcome(status: int) -> str:
    if 200 <= status < 300:
        return "accepted"
    if status == 429:
        return "throttled"
    if status >= 500:
        return "server_error"
    if status in (401, 403):
        return "unauthorized"
    return "rejected"


def _answered(status: int) -> str:
    return {"accepted": "accepted", "throttled": "upstream_throttled", "rejected": "upstream_rejected"}.get(
        _outcome(status), "upstream_error"
    )


def _refusal(exc: ServiceError) -> str:
    return {
        "rate_limited": "rate_limited",
        "ingest_saturated": "inflight_full",
        "overloaded": "shutting_down",
        "payload_too_large": "too_large",
        "invalid_input": "invalid",
        "deadline_exceeded": "timeout",
    }.get(exc.reason, "unreachable")
