"""The training server's read-only endpoints, answered by the coalescer (wire-contract section 5).

A scheduler may set ``TRAINING_SERVER_URL`` to the coalescer; the llm-d Go client then polls
``/model/download/info`` and ``/model/{ttft,tpot}/xgb/json`` from it (and refuses single
predictions until ``/model/download/info`` has answered once). Operators' tools read
``/models/list``, ``/model/{name}/info`` and ``GET /`` too.

Answers are fetched from ``--training-url`` with this module's own httpx client (never the
prediction hot path's connections) and cached for ``ttl_s``, at most ``max_bytes`` in all.
When the training server cannot be reached, a cached answer is served however old (marked
``X-Cache: stale``); with nothing cached the answer is a 503 saying why.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from shared.client import bearer_headers
from shared.errors import ServiceError

PROXIED_PATHS: tuple[str, ...] = (
    "/model/download/info",
    "/model/{name}/xgb/json",
    "/models/list",
    "/model/{name}/info",
)
_PASSED_HEADERS = ("content-type", "etag")


class TrainingServerUnavailable(ServiceError):
    status_code = 503
    reason = "training_server_unavailable"


@dataclass(frozen=True)
class Answer:
    """One upstream answer as the coalescer serves it."""

    status_code: int
    body: bytes
    headers: dict[str, str]
    fetched_at: float


class TrainingProxy:
    """Fetches and briefly caches GETs to the training server (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        ttl_s: float,
        max_bytes: int,
        timeout_s: float,
        token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._http = httpx.AsyncClient(headers=bearer_headers(token), timeout=httpx.Timeout(timeout_s))
        self._cache: dict[str, Answer] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.fetches = 0

    async def get(self, path: str) -> tuple[Answer, str]:
        """The answer for ``path`` and how it was served: ``hit``, ``miss`` or ``stale``."""
        cached = self._cache.get(path)
        if cached is not None and time.monotonic() - cached.fetched_at < self.ttl_s:
            return cached, "hit"
        lock = self._locks.setdefault(path, asyncio.Lock())
        async with lock:  # one fetch per path at a time; the others take its answer
            cached = self._cache.get(path)
            if cached is not None and time.monotonic() - cached.fetched_at < self.ttl_s:
                return cached, "hit"
            try:
                answer = await self._fetch(path)
            except httpx.HTTPError as exc:
                if cached is not None:
                    return cached, "stale"
                raise TrainingServerUnavailable(
                    f"training server {self.base_url} is unreachable and nothing is cached for {path}: "
                    f"{type(exc).__name__}"
                ) from None
            if answer.status_code >= 500 and cached is not None:
                return cached, "stale"
            self._store(path, answer)
            return answer, "miss"

    async def _fetch(self, path: str) -> Answer:
        self.fetches += 1
        response = await self._http.get(self.base_url + path)
        headers = {k: v for k, v in response.headers.items() if k.lower() in _PASSED_HEADERS}
        return Answer(response.status_code, response.content, headers, time.monotonic())

    def _store(self, path: str, answer: Answer) -> None:
        if answer.status_code >= 500 or len(answer.body) > self.max_bytes:
            return
        self._cache[path] = answer
        total = sum(len(a.body) for a in self._cache.values())
        for key in sorted(self._cache, key=lambda k: self._cache[k].fetched_at):
            if total <= self.max_bytes:
                break
            if key != path:
                total -= len(self._cache.pop(key).body)

    @property
    def cached_bytes(self) -> int:
        return sum(len(a.body) for a in self._cache.values())

    async def close(self) -> None:
        await self._http.aclose()
