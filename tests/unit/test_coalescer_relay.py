"""The sample relay's AIMD admission rate and its resends, with a fake clock and a scripted trainer.

The clock only moves when the relay sleeps (or a test moves it), so every assertion about *when*
is exact. The end-to-end behaviour (real training server, SIGSTOP, kill -9) is in
tests/e2e/test_relay_faults.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from coalescer.metrics import create_metrics
from coalescer.relay import IDEMPOTENCY_HEADER, RETRY_BACKOFF_MIN_S, AimdRate, SampleRelay
from shared.errors import DeadlineExceeded, IngestSaturated, UpstreamUnavailable


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class ScriptedTrainer:
    """Answers each bulk call with the next scripted outcome (then 202), recording keys and timeouts."""

    def __init__(self, clock: FakeClock, script: list[Any]) -> None:
        self.clock = clock
        self.script = list(script)
        self.calls: list[tuple[str, Any]] = []
        self.accepted_keys: set[str] = set()
        self.samples = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        key = request.headers[IDEMPOTENCY_HEADER]
        outcome = self.script.pop(0) if self.script else 202
        self.calls.append((key, outcome))
        if outcome == "timeout":
            self.clock.now += float(request.extensions["timeout"]["read"])
            raise httpx.ReadTimeout("scripted", request=request)
        if outcome == "refused":
            raise httpx.ConnectError("scripted", request=request)
        if outcome == 202 and key not in self.accepted_keys:
            self.accepted_keys.add(key)
            self.samples += len(orjson.loads(request.content)["entries"])
        headers = {"Retry-After": "2"} if outcome == 429 else {}
        return httpx.Response(outcome, json={"detail": "x"}, headers=headers)


def body(n: int) -> bytes:
    entry = {
        "kv_cache_percentage": 0.1,
        "input_token_length": 5,
        "num_request_waiting": 0,
        "num_request_running": 0,
        "num_tokens_generated": 1,
        "prefix_cache_score": 0.0,
        "actual_ttft_ms": 10.0,
        "actual_tpot_ms": 1.0,
    }
    return orjson.dumps({"entries": [entry] * n})


def make_relay(
    script: list[Any], *, rate: AimdRate | None = None, max_inflight_bytes: int = 1 << 20
) -> tuple[SampleRelay, ScriptedTrainer, FakeClock]:
    clock = FakeClock()
    trainer = ScriptedTrainer(clock, script)
    http = httpx.AsyncClient(transport=httpx.MockTransport(trainer.handle))
    relay = SampleRelay(
        "http://trainer",
        http,
        create_metrics(),
        rate or AimdRate(min_rate=1.0, max_rate=10.0, initial=5.0, step=1.0, factor=0.8, clock=clock),
        max_inflight_bytes=max_inflight_bytes,
        timeout_s=1.0,
        wait_budget_s=5.0,
        clock=clock,
        sleep=clock.sleep,
    )
    return relay, trainer, clock


async def send(relay: SampleRelay, raw: bytes, key: str | None = None) -> int:
    async def read(limit: int) -> bytes:
        return raw

    return (await relay.handle(len(raw), read, key)).status


def test_aimd_adds_on_success_multiplies_on_congestion_and_stays_in_bounds() -> None:
    rate = AimdRate(min_rate=1.0, max_rate=10.0, initial=9.5, step=1.0, factor=0.5)
    rate.increase()
    assert rate.rate == 10.0
    for _ in range(10):
        rate.decrease()
    assert rate.rate == 1.0


def test_the_token_bucket_admits_the_rate_and_says_when_the_next_token_comes() -> None:
    clock = FakeClock()
    rate = AimdRate(min_rate=1.0, max_rate=4.0, initial=4.0, step=1.0, factor=0.5, clock=clock)
    assert [rate.take() for _ in range(4)] == [0.0] * 4  # one second of burst
    assert rate.take() == pytest.approx(0.25)
    clock.now += 0.25
    assert rate.take() == 0.0


async def test_the_answer_is_the_training_servers_and_the_rate_follows_it() -> None:
    relay, trainer, _ = make_relay([202, 429, 503, 422])
    assert [await send(relay, body(3)) for _ in range(4)] == [202, 429, 503, 422]
    assert trainer.samples == 3
    assert relay.rate.rate == pytest.approx(6.0 * 0.8 * 0.8)


async def test_a_timed_out_call_is_resent_with_the_same_key_at_once_and_lands_once() -> None:
    slow = AimdRate(min_rate=0.1, max_rate=0.1, initial=0.1, step=1.0, factor=0.8)
    relay, trainer, clock = make_relay(["timeout", "refused", 202], rate=slow)
    assert await send(relay, body(10)) == 202
    keys = {key for key, _ in trainer.calls}
    assert len(trainer.calls) == 3 and len(keys) == 1  # one key for every resend
    assert trainer.samples == 10
    assert clock.sleeps == [RETRY_BACKOFF_MIN_S, RETRY_BACKOFF_MIN_S * 2]  # not the 10 s rate interval


async def test_a_senders_own_key_is_forwarded() -> None:
    relay, trainer, _ = make_relay([])
    assert await send(relay, body(1), key="batch-42") == 202
    assert trainer.calls == [("batch-42", 202)]


async def test_when_the_budget_runs_out_the_sender_gets_an_error_never_a_202() -> None:
    relay, trainer, _ = make_relay(["timeout"] * 20)
    with pytest.raises(DeadlineExceeded):
        await send(relay, body(2))
    relay, trainer, _ = make_relay(["refused"] * 200)
    with pytest.raises(UpstreamUnavailable):
        await send(relay, body(2))
    assert trainer.samples == 0


async def test_bytes_in_flight_are_bounded_before_the_body_is_read() -> None:
    relay, _, _ = make_relay([], max_inflight_bytes=1000)
    gate = asyncio.Event()

    async def slow_read(limit: int) -> bytes:
        await gate.wait()
        return body(2)

    first = asyncio.create_task(relay.handle(900, slow_read, None))
    await asyncio.sleep(0)
    assert relay.inflight_bytes == 900
    with pytest.raises(IngestSaturated):
        await send(relay, body(2))  # 900 + this would exceed 1000: refused without reading
    gate.set()
    assert (await first).status == 202
    assert relay.inflight_bytes == 0 and relay.inflight_requests == 0
