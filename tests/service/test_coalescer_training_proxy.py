"""``coalescer.training_proxy`` against a real uvicorn upstream: brief caching, one fetch for many
concurrent readers, the byte bound, stale answers during an outage and the 503 with nothing cached."""

from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from coalescer.training_proxy import TrainingProxy, TrainingServerUnavailable
from tests.procs import serve_in_loop


def upstream() -> tuple[Starlette, dict[str, int]]:
    calls: dict[str, int] = {}

    async def blob(request: Request) -> Response:
        size = int(request.path_params["size"])
        calls[request.url.path] = calls.get(request.url.path, 0) + 1
        await asyncio.sleep(0.05)  # long enough for concurrent readers to pile up on one fetch
        return Response(b"x" * size, media_type="application/json", headers={"ETag": '"e"'})

    async def fail(request: Request) -> Response:
        return Response(b"boom", status_code=500)

    return Starlette(routes=[Route("/blob/{size}", blob), Route("/fail", fail)]), calls


async def test_answers_are_cached_briefly_and_fetched_once_for_concurrent_readers() -> None:
    app, calls = upstream()
    async with serve_in_loop(app) as url:
        proxy = TrainingProxy(url, ttl_s=0.3, max_bytes=10_000, timeout_s=2.0)
        try:
            answers = await asyncio.gather(*(proxy.get("/blob/100") for _ in range(20)))
            assert calls["/blob/100"] == 1
            assert {how for _, how in answers} == {"miss", "hit"}
            assert answers[0][0].headers["etag"] == '"e"' and len(answers[0][0].body) == 100
            assert (await proxy.get("/blob/100"))[1] == "hit"
            await asyncio.sleep(0.35)
            assert (await proxy.get("/blob/100"))[1] == "miss" and calls["/blob/100"] == 2
        finally:
            await proxy.close()


async def test_the_cache_stays_within_its_byte_bound() -> None:
    app, _ = upstream()
    async with serve_in_loop(app) as url:
        proxy = TrainingProxy(url, ttl_s=60, max_bytes=5_000, timeout_s=2.0)
        try:
            for size in (2_000, 2_001, 2_002, 2_003):
                await proxy.get(f"/blob/{size}")
                assert proxy.cached_bytes <= 5_000
            big, how = await proxy.get("/blob/6000")  # larger than the bound: served, not kept
            assert how == "miss" and len(big.body) == 6000 and proxy.cached_bytes <= 5_000
            assert (await proxy.get("/blob/6000"))[1] == "miss"
            assert (await proxy.get("/blob/2003"))[1] == "hit"  # the newest small one is kept
            assert (await proxy.get("/fail"))[0].status_code == 500  # passed on, never cached
            assert (await proxy.get("/fail"))[1] == "miss"
        finally:
            await proxy.close()


async def test_outage_serves_the_stale_answer_and_503_when_nothing_is_cached() -> None:
    app, _ = upstream()
    async with serve_in_loop(app) as url:
        proxy = TrainingProxy(url, ttl_s=0.01, max_bytes=10_000, timeout_s=1.0)
        await proxy.get("/blob/10")
    try:  # the upstream has stopped
        await asyncio.sleep(0.02)
        answer, how = await proxy.get("/blob/10")
        assert how == "stale" and answer.body == b"x" * 10
        with pytest.raises(TrainingServerUnavailable, match="unreachable and nothing is cached"):
            await proxy.get("/blob/11")
    finally:
        await proxy.close()
