"""The prediction replica pool: selection, health, ejection and discovery.

A replica is *healthy* (gets traffic), *pending* (just discovered, not yet probed ready) or
*ejected* (failed a call; no traffic for ``eject_cooldown_s``, then probed on ``/readyz``).
A timed-out call does not eject by itself: the replica is asked ``/healthz`` first, and one that
answers is only marked *slow* (alive, overloaded) for the cool-down, so retries avoid it.
Selection takes the healthy replica with the least outstanding work (rows in flight, then calls
in flight), below a per-replica in-flight cap; ties rotate so idle traffic spreads. When no
replica is healthy we fail open and use the others rather than refuse everything: a fleet that
was ejected wholesale (a brief network blip) recovers on its first successful call.

Replicas come from a static URL list or from a DNS name re-resolved every ``dns_refresh_s``
(every A/AAAA address is a replica). A replica that leaves DNS finishes its calls in flight and
is then closed; a failed resolution keeps the current set.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal

import httpx

from coalescer.config import split_host_port
from coalescer.http1 import Http1Pool
from shared.logging import log_event, log_task_failure

log = logging.getLogger(__name__)

HEALTHZ_TIMEOUT_S = 1.0

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``(name, port) -> addresses``: every IPv4/IPv6 address the name resolves to."""

State = Literal["pending", "healthy", "ejected"]


class Replica:
    """One prediction replica: its connections, its load and its health."""

    __slots__ = (
        "calls",
        "ejected_until",
        "failures",
        "inflight_calls",
        "inflight_rows",
        "last_error",
        "pool",
        "removed",
        "slow_until",
        "state",
        "url",
    )

    def __init__(self, url: str, max_inflight: int) -> None:
        self.url = url
        self.pool = Http1Pool(url, max_idle=max_inflight)
        self.state: State = "pending"
        self.inflight_calls = 0
        self.inflight_rows = 0
        self.ejected_until = 0.0
        self.calls = 0
        self.failures = 0
        self.last_error: str | None = None
        self.removed = False
        self.slow_until = 0.0  # a call timed out but /healthz answered: alive, just slow

    @property
    def healthy(self) -> bool:
        return self.state == "healthy"

    def snapshot(self, now: float) -> dict[str, Any]:
        return {
            "url": self.url,
            "state": self.state,
            "inflight_calls": self.inflight_calls,
            "outstanding_rows": self.inflight_rows,
            "calls": self.calls,
            "failures": self.failures,
            "ejected_for_s": round(max(0.0, self.ejected_until - now), 3) if self.state == "ejected" else 0.0,
            "last_error": self.last_error,
        }


async def resolve_all(name: str, port: int) -> list[str]:
    """Every address ``name`` resolves to (A and AAAA), sorted and without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def url_for(address: str, port: int, scheme: str = "http") -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


class ReplicaPool:
    """The current replicas, with selection by least outstanding work and health tracking."""

    def __init__(
        self,
        *,
        max_inflight: int,
        eject_cooldown_s: float,
        http: httpx.AsyncClient,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_inflight = max_inflight
        self.eject_cooldown_s = eject_cooldown_s
        self._http = http
        self._clock = clock
        self._replicas: list[Replica] = []
        self._by_url: dict[str, Replica] = {}
        self._rotate = 0
        self._listeners: list[Callable[[], None]] = []
        self._checks: set[asyncio.Task[None]] = set()  # /healthz checks in flight (hard references)

    @property
    def replicas(self) -> Sequence[Replica]:
        return self._replicas

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs whenever capacity may have appeared (a slot freed, a replica healthy)."""
        self._listeners.append(listener)

    def set_urls(self, urls: Iterable[str]) -> None:
        """Make the replica set exactly ``urls``: new ones start pending, missing ones are retired."""
        wanted = list(dict.fromkeys(urls))
        for url in wanted:
            if url not in self._by_url:
                replica = Replica(url, self.max_inflight)
                self._by_url[url] = replica
                self._replicas.append(replica)
                log_event(log, "replica_added", url=url)
        for replica in [r for r in self._replicas if r.url not in set(wanted)]:
            self._replicas.remove(replica)
            del self._by_url[replica.url]
            replica.removed = True
            if replica.inflight_calls == 0:
                replica.pool.close()
            log_event(log, "replica_removed", url=replica.url)

    # selection and accounting (hot path: plain attribute work, no awaits)
    def pick(self, limit: int, exclude: Sequence[Replica] = ()) -> Replica | None:
        """The least-loaded replica with fewer than ``limit`` calls in flight, or ``None``."""
        replicas = self._replicas
        n = len(replicas)
        if n == 0:
            return None
        any_healthy = any(r.state == "healthy" and r not in exclude for r in replicas)
        best: Replica | None = None
        start = self._rotate % n
        for i in range(n):
            r = replicas[(start + i) % n]
            if r.inflight_calls >= limit or (any_healthy and r.state != "healthy") or r in exclude:
                continue
            if best is None or (r.inflight_rows, r.inflight_calls) < (
                best.inflight_rows,
                best.inflight_calls,
            ):
                best = r
        if best is not None:
            self._rotate += 1
        return best

    def has_candidates(self, exclude: Sequence[Replica] = ()) -> bool:
        return any(r not in exclude for r in self._replicas)

    def acquire(self, replica: Replica, rows: int) -> None:
        replica.inflight_calls += 1
        replica.inflight_rows += rows
        replica.calls += 1

    def release(self, replica: Replica, rows: int) -> None:
        replica.inflight_calls -= 1
        replica.inflight_rows -= rows
        if replica.removed and replica.inflight_calls == 0:
            replica.pool.close()
        self._notify()

    def mark_success(self, replica: Replica) -> None:
        if replica.state != "healthy" and not replica.removed:
            replica.state = "healthy"
            log_event(log, "replica_healthy", url=replica.url, via="call")
            self._notify()

    def mark_failure(self, replica: Replica, error: str) -> None:
        """Eject ``replica`` for the cool-down; the prober brings it back once ``/readyz`` answers."""
        replica.failures += 1
        replica.last_error = error
        until = self._clock() + self.eject_cooldown_s
        if replica.state != "ejected":
            log_event(log, "replica_ejected", logging.WARNING, url=replica.url, error=error)
        replica.state = "ejected"
        replica.ejected_until = max(replica.ejected_until, until)

    def suspect(self, replica: Replica, error: str) -> None:
        """A call to ``replica`` timed out: slow or dead? Ask ``/healthz`` before ejecting it.

        Under CPU overload every replica times out now and then; ejecting live ones would only
        pile their load onto the others. A replica that answers ``/healthz`` stays in service,
        marked slow for the cool-down (retries avoid slow replicas); one that does not is ejected.
        """
        replica.failures += 1
        replica.last_error = error
        replica.slow_until = self._clock() + self.eject_cooldown_s
        task = asyncio.get_running_loop().create_task(self._check_alive(replica, error))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)
        task.add_done_callback(log_task_failure)

    async def _check_alive(self, replica: Replica, error: str) -> None:
        try:
            response = await self._http.get(replica.url + "/healthz", timeout=HEALTHZ_TIMEOUT_S)
            alive = response.status_code == 200
        except httpx.HTTPError:
            alive = False
        if alive:
            log_event(log, "replica_slow", logging.WARNING, url=replica.url, error=error)
        elif not replica.removed:
            self.mark_failure(replica, f"{error}; /healthz did not answer")

    def is_slow(self, replica: Replica) -> bool:
        return replica.slow_until > self._clock()

    def all_slow(self, exclude: Sequence[Replica] = ()) -> bool:
        """Whether every other replica timed out recently: a retry would only add load."""
        return all(self.is_slow(r) or r.state == "ejected" for r in self._replicas if r not in exclude)

    @property
    def healthy_count(self) -> int:
        return sum(1 for r in self._replicas if r.state == "healthy")

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    # health probing and discovery (background tasks owned by the app's lifespan)
    async def probe(self, replica: Replica, headers: dict[str, str] | None = None) -> bool:
        try:
            response = await self._http.get(replica.url + "/readyz", headers=headers, timeout=1.0)
            ok = response.status_code == 200
            error = None if ok else f"/readyz answered {response.status_code}"
        except httpx.HTTPError as exc:
            ok, error = False, f"/readyz failed: {exc!r}"
        if replica.removed:
            return ok
        if ok:
            replica.state = "healthy"
            replica.last_error = None
            log_event(log, "replica_healthy", url=replica.url, via="probe")
            self._notify()
        else:
            replica.last_error = error
            if replica.state == "ejected":
                replica.ejected_until = self._clock() + self.eject_cooldown_s
        return ok

    async def probe_due(self) -> None:
        """Probe every pending replica and every ejected one whose cool-down has passed."""
        now = self._clock()
        due = [
            r
            for r in self._replicas
            if r.state == "pending" or (r.state == "ejected" and now >= r.ejected_until)
        ]
        if due:
            await asyncio.gather(*(self.probe(r) for r in due))

    async def run_prober(self, interval_s: float) -> None:
        while True:
            try:
                await self.probe_due()
            except Exception as exc:  # keep probing whatever happens to one round
                log_event(log, "probe_round_failed", logging.ERROR, error=repr(exc))
            await asyncio.sleep(interval_s)

    async def refresh_dns(self, target: str, resolver: Resolver, scheme: str = "http") -> bool:
        """Resolve ``NAME:PORT`` once and apply the result; ``False`` (set unchanged) on failure."""
        name, port = split_host_port(target)
        try:
            addresses = await resolver(name, port)
        except (OSError, UnicodeError) as exc:
            log_event(log, "dns_resolution_failed", logging.WARNING, name=target, error=repr(exc))
            return False
        if not addresses:
            log_event(log, "dns_resolution_empty", logging.WARNING, name=target)
            return False
        self.set_urls(url_for(address, port, scheme) for address in addresses)
        return True

    async def run_dns(self, target: str, resolver: Resolver, refresh_s: float) -> None:
        while True:
            await asyncio.sleep(refresh_s)
            await self.refresh_dns(target, resolver)

    async def close(self) -> None:
        for task in self._checks:
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
        for replica in self._replicas:
            replica.pool.close()
