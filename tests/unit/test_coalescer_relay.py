"""The sample relay's AIMD rate, retry order and accounting, with a fake clock and a scripted transport.

The clock only moves when the relay sleeps, so every assertion about *when* something was sent
is exact: no wall-clock timing here.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import orjson
import pytest

from coalescer.metrics import create_metrics
from coalescer.relay import RETRY_BACKOFF_MIN_S, AimdRate, SampleRelay
from shared.errors import IngestSaturated


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
    """Answers each bulk call with the next scripted status (then 202), recording what arrived when."""

    def __init__(self, clock: FakeClock, script: list[Any]) -> None:
        self.clock = clock
        self.script = list(script)
        self.calls: list[tuple[float, int, Any]] = []
        self.accepted: list[int] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        entries = orjson.loads(request.content)["entries"]
        outcome = self.script.pop(0) if self.script else 202
        self.calls.append((self.clock.now, len(entries), outcome))
        if outcome == "timeout":
            raise httpx.ReadTimeout("scripted", request=request)
        if outcome == "refused":
            raise httpx.ConnectError("scripted", request=request)
        if outcome == 202:
            self.accepted.extend(e["input_token_length"] for e in entries)
        headers = {"Retry-After": "2"} if outcome == 429 else {}
        return httpx.Response(outcome, json={"detail": "x"}, headers=headers)


def entries(start: int, n: int) -> list[dict[str, Any]]:
    return [
        {
            "kv_cache_percentage": 0.1,
            "input_token_length": start + i,
            "num_request_waiting": 0,
            "num_request_running": 0,
            "num_tokens_generated": 1,
            "prefix_cache_score": 0.0,
            "actual_ttft_ms": 10.0,
            "actual_tpot_ms": 1.0,
        }
        for i in range(n)
    ]


def make_relay(
    script: list[Any], *, rate: AimdRate | None = None, capacity: int = 10_000, batch: int = 100
) -> tuple[SampleRelay, ScriptedTrainer, FakeClock]:
    clock = FakeClock()
    trainer = ScriptedTrainer(clock, script)
    http = httpx.AsyncClient(transport=httpx.MockTransport(trainer.handle))
    relay = SampleRelay(
        "http://trainer",
        http,
        create_metrics(),
        rate or AimdRate(min_rate=1.0, max_rate=10.0, initial=5.0, step=1.0, factor=0.8),
        capacity=capacity,
        batch_samples=batch,
        timeout_s=1.0,
        clock=clock,
        sleep=clock.sleep,
    )
    return relay, trainer, clock


async def run_until(relay: SampleRelay, done: Any, max_steps: int = 10_000) -> None:
    task = asyncio.create_task(relay.run())
    try:
        for _ in range(max_steps):
            if done():
                return
            await asyncio.sleep(0)
        raise AssertionError("relay did not finish")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_aimd_adds_on_success_multiplies_on_congestion_and_stays_in_bounds() -> None:
    rate = AimdRate(min_rate=1.0, max_rate=4.0, initial=2.0, step=1.0, factor=0.8)
    rate.increase()
    assert rate.rate == 3.0
    rate.increase()
    rate.increase()
    assert rate.rate == 4.0  # clamped at the maximum
    rate.decrease()
    assert rate.rate == pytest.approx(3.2)
    for _ in range(20):
        rate.decrease()
    assert rate.rate == 1.0  # clamped at the minimum
    assert rate.interval_s == 1.0
    assert AimdRate(min_rate=1.0, max_rate=4.0, initial=50.0, step=1.0, factor=0.8).rate == 4.0


async def test_rate_follows_the_training_servers_answers() -> None:
    relay, trainer, _ = make_relay([202, 202, 429, 503, "timeout", 202])
    relay.accept(entries(0, 600))
    await run_until(relay, lambda: len(trainer.accepted) == 600)
    # 5 +1 +1 = 7, then x0.8 three times (429, 503, timeout), then +1 per accepted batch (4 more).
    assert relay.rate.rate == pytest.approx(7 * 0.8**3 + 4)
    assert [c[2] for c in trainer.calls] == [202, 202, 429, 503, "timeout", 202, 202, 202, 202]


async def test_new_batches_are_paced_by_the_rate() -> None:
    relay, trainer, _ = make_relay(
        [], rate=AimdRate(min_rate=1.0, max_rate=2.0, initial=2.0, step=0.0001, factor=0.8)
    )
    relay.accept(entries(0, 300))
    await run_until(relay, lambda: len(trainer.accepted) == 300)
    starts = [c[0] for c in trainer.calls]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap == pytest.approx(0.5, abs=1e-3) for gap in gaps)  # 2 batches per second


async def test_a_failed_batch_is_retried_first_and_not_held_back_by_the_rate() -> None:
    slow = AimdRate(min_rate=0.1, max_rate=0.2, initial=0.2, step=0.01, factor=0.8)  # 5 s between batches
    relay, trainer, _ = make_relay([503, "refused"], rate=slow)
    relay.accept(entries(0, 250))
    await run_until(relay, lambda: len(trainer.accepted) == 250)
    (t0, n0, _), (t1, n1, _), (t2, n2, _), (t3, *_rest) = trainer.calls[:4]
    assert n0 == n1 == n2 == 100  # the same first batch, three times
    assert t1 - t0 == pytest.approx(RETRY_BACKOFF_MIN_S)  # a short backoff, not the 5 s rate interval
    assert t2 - t1 == pytest.approx(2 * RETRY_BACKOFF_MIN_S)
    assert t3 - t2 >= 1 / 0.2 * 0.8  # the next *new* batch waits for the rate again
    assert trainer.accepted == list(range(250))  # in order, each exactly once


async def test_retry_after_of_a_429_is_honoured() -> None:
    relay, trainer, _ = make_relay([429])
    relay.accept(entries(0, 10))
    await run_until(relay, lambda: len(trainer.accepted) == 10)
    assert trainer.calls[1][0] - trainer.calls[0][0] == pytest.approx(2.0)


async def test_nothing_is_lost_while_the_training_server_is_down() -> None:
    relay, trainer, _ = make_relay(["refused"] * 30 + [503] * 5)
    for b in range(5):
        relay.accept(entries(100 * b, 100))
    assert relay.buffered == 500
    await run_until(relay, lambda: len(trainer.accepted) == 500)
    assert trainer.accepted == list(range(500))
    assert relay.relayed == 500 and relay.dropped == 0 and relay.buffered == 0
    assert relay.rate.rate >= relay.rate.min_rate


async def test_a_full_buffer_refuses_everything_of_a_call() -> None:
    relay, _, _ = make_relay([], capacity=150)
    relay.accept(entries(0, 100))
    with pytest.raises(IngestSaturated) as info:
        relay.accept(entries(100, 51))
    assert info.value.status_code == 429
    assert "Retry-After" in info.value.headers
    assert relay.buffered == 100
    relay.accept(entries(100, 50))
    assert relay.buffered == 150


async def test_samples_the_training_server_refuses_are_dropped_and_counted() -> None:
    relay, trainer, _ = make_relay([422])
    relay.accept(entries(0, 150))
    await run_until(relay, lambda: relay.buffered == 0)
    assert relay.dropped == 100 and relay.relayed == 50
    assert trainer.accepted == list(range(100, 150))


def test_missing_timestamps_are_stamped_on_arrival() -> None:
    relay, _, _ = make_relay([])
    batch = entries(0, 3)
    batch[0]["timestamp"] = "0001-01-01T00:00:00Z"
    batch[1]["timestamp"] = "2026-01-02T03:04:05Z"
    relay.accept(batch)
    assert batch[0]["timestamp"].endswith("Z") and not batch[0]["timestamp"].startswith("0001")
    assert batch[1]["timestamp"] == "2026-01-02T03:04:05Z"
    assert batch[2]["timestamp"] == batch[0]["timestamp"]


async def test_drain_sends_what_is_left_and_counts_the_rest_as_dropped() -> None:
    relay, trainer, _ = make_relay([])
    relay.accept(entries(0, 250))
    await relay.drain(10.0)
    assert len(trainer.accepted) == 250 and relay.dropped == 0
    relay2, trainer2, _ = make_relay(["refused"] * 1000)
    relay2.accept(entries(0, 250))
    await relay2.drain(1.0)
    assert relay2.dropped == 250 and relay2.buffered == 0 and trainer2.accepted == []
