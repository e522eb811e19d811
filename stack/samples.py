"""Feed completed requests back as training samples, like a scheduler's client does.

Entries are buffered and posted to ``/add_training_data_bulk`` at most ``max_batch`` per
call, whenever a full batch is ready or ``flush_interval_s`` has passed. A 429/503 keeps the
batch and waits for ``Retry-After``; network errors and other 5xx back off exponentially and
retry; a 422 (or another 4xx) drops the batch and counts it as rejected. The buffer is bounded:
past ``max_buffered`` the oldest entries are dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from typing import Any

import httpx
import orjson

from shared.client import retry_after_s
from shared.logging import log_event

log = logging.getLogger(__name__)

_ACCEPTED = re.compile(rb"Accepted (\d+)")
_MAX_RETRY_AFTER_S = 30.0


class SampleSender:
    """Background relay of training entries; ``run()`` is its task, ``close()`` flushes and ends it."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        *,
        max_batch: int = 1000,
        flush_interval_s: float = 1.0,
        max_buffered: int = 100_000,
    ) -> None:
        if not 1 <= max_batch <= 1000:
            raise ValueError("max_batch must be within 1..1000 (the training API's flush size)")
        self._client = client
        self._url = url.rstrip("/") + "/add_training_data_bulk"
        self.max_batch = max_batch
        self.flush_interval_s = flush_interval_s
        self.max_buffered = max_buffered
        self._buffer: deque[dict[str, Any]] = deque()
        self._head_posted = 0  # entries at the buffer's head already posted once (being retried)
        self._wake = asyncio.Event()
        self._closing = False
        self._not_before = 0.0  # monotonic time before which nothing is sent (Retry-After)
        self._backoff_s = 0.0
        self.sent = 0  # distinct entries posted at least once
        self.accepted = 0
        self.rejected = 0
        self.throttled = 0  # 429/503 answers
        self.failed_calls = 0  # network errors and other 5xx
        self.dropped = 0  # buffer overflow

    @property
    def queued(self) -> int:
        return len(self._buffer)

    def add(self, entry: dict[str, Any]) -> None:
        self._buffer.append(entry)
        if len(self._buffer) > self.max_buffered:
            self._buffer.popleft()
            self._head_posted = max(0, self._head_posted - 1)
            self.dropped += 1
        if len(self._buffer) >= self.max_batch:
            self._wake.set()

    async def run(self) -> None:
        last_flush = time.monotonic()
        while not (self._closing and not self._buffer):
            now = time.monotonic()
            if now < self._not_before:
                await asyncio.sleep(self._not_before - now)
                continue
            full = len(self._buffer) >= self.max_batch
            due = now - last_flush >= self.flush_interval_s
            if self._buffer and (full or due or self._closing):
                await self._send_batch()
                last_flush = time.monotonic()
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), max(0.01, self.flush_interval_s - (now - last_flush))
                )

    async def close(self, task: asyncio.Task[None], timeout_s: float) -> None:
        """Flush what is buffered (within ``timeout_s``), then stop ``task``."""
        self._closing = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            log_event(log, "samples_unsent", logging.WARNING, unsent=len(self._buffer), timeout_s=timeout_s)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _send_batch(self) -> None:
        n = min(self.max_batch, len(self._buffer))
        batch = [self._buffer[i] for i in range(n)]
        self.sent += max(0, n - self._head_posted)
        self._head_posted = max(self._head_posted, n)
        try:
            resp = await self._client.post(
                self._url,
                content=orjson.dumps({"entries": batch}),
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            self._retry_later(f"{type(exc).__name__}: {exc}")
            return
        status = resp.status_code
        if status == 202:
            match = _ACCEPTED.search(resp.content)
            self.accepted += int(match.group(1)) if match else n
            self._pop(n)
            self._backoff_s = 0.0
        elif status in (429, 503):
            self.throttled += 1
            self._not_before = time.monotonic() + _retry_after_or_1s(resp)
        elif status >= 500:
            self._retry_later(f"HTTP {status}")
        else:
            self.rejected += n
            self._pop(n)
            log_event(
                log, "samples_rejected", logging.WARNING, status=status, entries=n, body=resp.text[:500]
            )

    def _pop(self, n: int) -> None:
        for _ in range(n):
            self._buffer.popleft()
        self._head_posted = max(0, self._head_posted - n)

    def _retry_later(self, error: str) -> None:
        self.failed_calls += 1
        self._backoff_s = min(8.0, max(0.25, self._backoff_s * 2))
        self._not_before = time.monotonic() + self._backoff_s
        log_event(log, "samples_send_failed", logging.WARNING, error=error, retry_in_s=self._backoff_s)


def _retry_after_or_1s(resp: httpx.Response) -> float:
    hinted = retry_after_s(resp.headers, _MAX_RETRY_AFTER_S)
    return 1.0 if hinted is None else hinted
