"""Slow-loris clients against the three real services: a client trickling its headers or its body
a byte at a time is cut off after a bound (``shared.slow_clients``), and a normal client is not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from shared.slow_clients import HEADER_TIMEOUT_S
from tests.procs import RunningService, start_service

SLACK_S = 3.0


async def trickle(url: str, head: bytes, drip: bytes, give_up_s: float) -> float:
    """Send ``head`` then ``drip`` one byte every 0.2 s; seconds until the server closed the connection."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    started = time.monotonic()
    try:
        writer.write(head)
        await writer.drain()
        i = 0
        while time.monotonic() - started < give_up_s:
            writer.write(drip[i % len(drip) : i % len(drip) + 1])
            i += 1
            try:
                await writer.drain()
                data = await asyncio.wait_for(reader.read(1024), timeout=0.2)
            except TimeoutError:
                continue
            except ConnectionError:
                return time.monotonic() - started
            if data == b"" or b"408" in data or b"400" in data:  # closed (an error answer counts too)
                return time.monotonic() - started
        return float("inf")
    finally:
        writer.close()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningService]]:
    base = tmp_path_factory.mktemp("slow-clients")
    logs = base / "logs"
    training = start_service("training_server", ["--data-dir", str(base / "training")], log_dir=logs)
    prediction = start_service(
        "prediction_server", ["--store", str(base / "training" / "models")], log_dir=logs
    )
    coalescer = start_service(
        "coalescer",
        [
            "--prediction-urls", prediction.url,
            "--training-url", training.url,
            "--header-timeout-s", "1",
            "--body-timeout-s", "1",
        ],
        log_dir=logs,
    )  # fmt: skip
    try:
        yield [training, prediction, coalescer]
    finally:
        for service in (coalescer, prediction, training):
            service.stop()


async def test_every_service_cuts_off_a_client_trickling_its_headers(services: list[RunningService]) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    times = await asyncio.gather(
        *(trickle(s.url, head, b"X-Slow: aaaaaaaaaa\r\n", HEADER_TIMEOUT_S * 3) for s in services)
    )
    training_s, prediction_s, coalescer_s = times
    assert coalescer_s < 1 + SLACK_S  # its configured bound
    assert training_s < HEADER_TIMEOUT_S + SLACK_S and prediction_s < HEADER_TIMEOUT_S + SLACK_S
    assert "slow_client_cut_off" in services[0].logs()


async def test_a_client_trickling_its_body_is_cut_off_and_nothing_is_relayed(
    services: list[RunningService],
) -> None:
    coalescer = services[2]
    head = (
        b"POST /add_training_data_bulk HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n"
    )
    elapsed = await trickle(coalescer.url, head, b'{"entries": [', 20.0)
    assert elapsed < 1 + SLACK_S
    relay = httpx.get(coalescer.url + "/status").json()["relay"]
    assert relay["inflight_bytes"] == 0 and relay["inflight_requests"] == 0  # its reservation is freed


async def test_a_normal_client_is_not_cut_off(services: list[RunningService]) -> None:
    async with httpx.AsyncClient(timeout=10.0) as client:
        for service in services:
            assert (await client.get(service.url + "/healthz")).status_code == 200
        # A kept-alive connection idle for longer than the header bound still works afterwards.
        await asyncio.sleep(1.5)
        assert (await client.get(services[2].url + "/healthz")).status_code == 200
