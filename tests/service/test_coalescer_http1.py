"""The hot-path HTTP/1.1 client against a real uvicorn server: keep-alive reuse, timeouts,
refused connections, and a keep-alive connection the server closed while it sat idle.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from coalescer.http1 import Http1Pool, UpstreamConnectError, UpstreamTimeout
from tests.procs import eventually, free_port


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/slow":
        await asyncio.sleep(0.3)
    payload = b'{"echo":' + (body or b"null") + b"}"
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


@contextlib.asynccontextmanager
async def server(keep_alive_s: float = 5.0) -> AsyncIterator[str]:
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        lifespan="off",
        timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=1,
    )
    instance = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(instance.serve())
    await eventually(lambda: instance.started, "uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        instance.should_exit = True
        await task


async def test_requests_reuse_one_keep_alive_connection() -> None:
    async with server() as url:
        pool = Http1Pool(url)
        for i in range(5):
            response = await pool.request("POST", "/x", b"%d" % i, timeout_s=2.0)
            assert (response.status, response.body) == (201, b'{"echo":%d}' % i)
        assert len(pool._idle) == 1
        big = b"[" + b",".join(b"1" for _ in range(200_000)) + b"]"
        response = await pool.request("POST", "/x", big, timeout_s=5.0)
        assert response.body == b'{"echo":' + big + b"}"  # a body in many chunks
        pool.close()


async def test_a_timeout_closes_the_connection_and_raises() -> None:
    async with server() as url:
        pool = Http1Pool(url)
        with pytest.raises(UpstreamTimeout):
            await pool.request("POST", "/slow", b"1", timeout_s=0.05)
        assert pool._idle == []  # its answer may still come: never reuse it
        assert (await pool.request("POST", "/x", b"2", timeout_s=2.0)).status == 201
        pool.close()


async def test_a_refused_connection_raises_a_connect_error() -> None:
    pool = Http1Pool(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UpstreamConnectError):
        await pool.request("POST", "/x", b"1", timeout_s=1.0)


async def test_an_idle_connection_the_server_closed_is_replaced_silently() -> None:
    async with server(keep_alive_s=0.2) as url:
        pool = Http1Pool(url)
        assert (await pool.request("POST", "/x", b"1", timeout_s=2.0)).status == 201
        await asyncio.sleep(0.5)  # the server closes the idle keep-alive connection
        assert (await pool.request("POST", "/x", b"2", timeout_s=2.0)).body == b'{"echo":2}'
        pool.close()
