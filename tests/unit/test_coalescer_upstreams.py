"""Replica selection, health bookkeeping and discovery (static list, DNS with an injected resolver)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from coalescer.upstreams import ReplicaPool, resolve_all, url_for
from tests.procs import serve_in_loop


def make_pool(*urls: str, max_inflight: int = 2) -> ReplicaPool:
    pool = ReplicaPool(max_inflight=max_inflight, eject_cooldown_s=5.0, http=httpx.AsyncClient())
    pool.set_urls(urls)
    for replica in pool.replicas:
        replica.state = "healthy"
    return pool


def test_least_outstanding_rows_wins_and_the_cap_is_respected() -> None:
    pool = make_pool("http://a:1", "http://b:1", "http://c:1")
    a, b, c = pool.replicas
    pool.acquire(a, 100)
    pool.acquire(b, 10)
    assert pool.pick(2) is c
    pool.acquire(c, 50)
    assert pool.pick(2) is b
    assert pool.pick(1) is None  # everyone has a call in flight: nobody is idle
    pool.acquire(b, 10)
    assert pool.pick(2) is c  # b is at the cap of 2 calls
    pool.release(a, 100)
    assert pool.pick(1) is a


def test_idle_ties_rotate_so_light_traffic_spreads() -> None:
    pool = make_pool("http://a:1", "http://b:1")
    picks = [pool.pick(1) for _ in range(4)]
    assert [p.url for p in picks if p] == ["http://a:1", "http://b:1", "http://a:1", "http://b:1"]


def test_ejected_replicas_get_no_traffic_unless_nothing_is_healthy() -> None:
    pool = make_pool("http://a:1", "http://b:1")
    a, b = pool.replicas
    pool.mark_failure(a, "boom")
    assert a.state == "ejected" and a.failures == 1 and a.last_error == "boom"
    assert {pool.pick(2) for _ in range(3)} == {b}
    assert pool.pick(2, exclude=[b]) is a  # fail open: no healthy candidate left
    pool.mark_failure(b, "boom")
    assert pool.pick(2) in (a, b)
    pool.mark_success(a)
    assert a.state == "healthy" and pool.healthy_count == 1


def test_static_list_changes_add_and_retire_replicas() -> None:
    pool = make_pool("http://a:1", "http://b:1")
    a, b = pool.replicas
    pool.acquire(b, 5)
    pool.set_urls(["http://a:1", "http://c:1"])
    assert [r.url for r in pool.replicas] == ["http://a:1", "http://c:1"]
    assert pool.replicas[0] is a  # kept, with its state
    assert pool.replicas[1].state == "pending"  # new replicas are probed before they count as healthy
    assert b.removed
    pool.release(b, 5)  # a call still in flight on a retired replica completes normally
    assert b.inflight_calls == 0


async def test_dns_discovery_adds_and_removes_replicas_with_the_records() -> None:
    answers = {"svc": ["10.0.0.1", "10.0.0.2"]}

    async def resolver(name: str, port: int) -> list[str]:
        if name not in answers:
            raise OSError("NXDOMAIN")
        return answers[name]

    pool = ReplicaPool(max_inflight=2, eject_cooldown_s=5.0, http=httpx.AsyncClient())
    assert await pool.refresh_dns("svc:8001", resolver)
    assert [r.url for r in pool.replicas] == ["http://10.0.0.1:8001", "http://10.0.0.2:8001"]
    answers["svc"] = ["10.0.0.2", "10.0.0.3", "fd00::7"]
    assert await pool.refresh_dns("svc:8001", resolver)
    assert [r.url for r in pool.replicas] == [
        "http://10.0.0.2:8001",
        "http://10.0.0.3:8001",
        "http://[fd00::7]:8001",
    ]
    del answers["svc"]
    assert not await pool.refresh_dns("svc:8001", resolver)  # a failed lookup keeps the current set
    assert len(pool.replicas) == 3
    answers["svc"] = []
    assert not await pool.refresh_dns("svc:8001", resolver)
    assert len(pool.replicas) == 3


async def test_the_real_resolver_finds_every_localhost_address() -> None:
    addresses = await resolve_all("localhost", 8001)
    assert "127.0.0.1" in addresses or "::1" in addresses
    assert addresses == sorted(set(addresses))
    assert url_for("::1", 8001) == "http://[::1]:8001"
    assert url_for("127.0.0.1", 8001) == "http://127.0.0.1:8001"


@pytest.mark.parametrize("bad", ["svc", "svc:", ":80", "svc:http", "svc:70000"])
async def test_dns_targets_must_be_name_and_port(bad: str) -> None:
    from coalescer.config import split_host_port

    with pytest.raises(ValueError):
        split_host_port(bad)


async def test_closing_the_pool_stops_the_healthz_checks_it_started() -> None:
    """A /healthz check of a timed-out replica is a background task: the pool keeps it and
    ``close()`` cancels it, so none is left running (or garbage-collected mid-flight)."""

    async def hang(_: object) -> Response:
        await asyncio.sleep(3600)
        return Response()

    async with serve_in_loop(Starlette(routes=[Route("/healthz", hang)])) as url:
        pool = make_pool(url)
        before = asyncio.all_tasks()
        pool.suspect(pool.replicas[0], "timed out")
        checks = asyncio.all_tasks() - before
        assert len(checks) == 1
        await pool.close()
        assert all(task.done() for task in checks)
