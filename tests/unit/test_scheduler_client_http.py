"""LatencyClient and SampleFeeder against a real HTTP server on a loopback port.

The server is a tiny FastAPI app run by uvicorn in a thread (its own event loop), which a
test can tell to fail, sleep, answer 429 with ``Retry-After`` and so on. Validation of
training entries is the real shared one, so 422 bodies look like the services'.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response

from scheduler_client import (
    ClientConfig,
    FallbackPolicy,
    FeederConfig,
    InvalidRowsError,
    LatencyClient,
    LowestLatency,
    Mode,
    Router,
    RoutingRequest,
    training_entry,
)
from shared.errors import InvalidInput
from shared.schemas import parse_training_entries
from tests.procs import eventually, wait_until


@dataclass
class Script:
    """What the fake service does; tests mutate it, the server thread reads it."""

    predict: str = "ok"  # ok | sleep | 503 | 500 | 422 | short
    sleep_s: float = 0.0
    train_answers: deque[tuple[int, dict[str, str]]] = field(default_factory=deque)  # then 202
    predict_calls: int = 0
    train_calls: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)

    def delivered(self) -> list[dict[str, Any]]:
        return [e for _, batch in self.train_calls for e in batch]


def _app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.post("/predict/bulk/strict")
    async def predict(request: Request) -> Response:
        script.predict_calls += 1
        rows = orjson.loads(await request.body())["requests"]
        if script.predict == "sleep":
            await asyncio.sleep(script.sleep_s)
        elif script.predict in ("503", "500"):
            return Response(b'{"detail": "Models not ready"}', int(script.predict))
        elif script.predict == "422":
            return Response(b'{"detail": [{"loc": ["body", "requests", 0, "kv_cache_percentage"]}]}', 422)
        if script.predict == "short":
            rows = rows[:-1]
        predictions = [
            {"ttft_ms": float(r["input_token_length"]), "tpot_ms": 10.0 + i, "model_version": "v7"}
            for i, r in enumerate(rows)
        ]
        return Response(orjson.dumps({"predictions": predictions}), media_type="application/json")

    @app.post("/add_training_data_bulk")
    async def train(request: Request) -> Response:
        entries = orjson.loads(await request.body())["entries"]
        if script.train_answers:
            status, headers = script.train_answers.popleft()
            script.train_calls.append((time.monotonic(), []))
            return Response(b"{}", status, headers)
        try:
            parse_training_entries(entries, now_s=time.time())
        except InvalidInput as exc:
            body = {"detail": exc.errors, "total_errors": exc.total_errors}
            return Response(orjson.dumps(body), 422)
        script.train_calls.append((time.monotonic(), entries))
        return Response(b'{"message": "Accepted"}', 202)

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(_app(script), log_level="warning", lifespan="off")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: uv.started, "uvicorn to start", timeout_s=10, poll_s=0.01)
    yield f"http://127.0.0.1:{port}", script
    uv.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture
def fake(server: tuple[str, Script]) -> Iterator[tuple[str, Script]]:
    url, script = server
    script.predict, script.sleep_s, script.predict_calls = "ok", 0.0, 0
    script.train_answers.clear()
    script.train_calls.clear()
    yield url, script


def row(tokens: int = 100, running: int = 0) -> dict[str, Any]:
    return {
        "kv_cache_percentage": 0.1,
        "input_token_length": tokens,
        "num_request_waiting": 0,
        "num_request_running": running,
        "num_tokens_generated": 1,
        "prefix_cache_score": 0.0,
    }


ROWS = [row(300), row(100), row(200)]
FAST = ClientConfig(predict_timeout_s=0.2, fallback=FallbackPolicy(probe_interval_s=0.2))


@pytest.fixture
async def client(fake: tuple[str, Script]) -> AsyncIterator[LatencyClient]:
    async with LatencyClient(fake[0], fake[0], FAST) as c:
        yield c


# -- predictions and fallback ---------------------------------------------------------------------


async def test_predictions_come_back_in_row_order(client: LatencyClient) -> None:
    predictions = await client.predict(ROWS)
    assert predictions is not None
    assert [p.ttft_ms for p in predictions] == [300, 100, 200]
    assert [p.tpot_ms for p in predictions] == [10, 11, 12]
    assert client.mode is Mode.PREDICTED and client.last_model_version == "v7"
    assert client.counters.predict_ok == 1


@pytest.mark.parametrize("failure", ["503", "500", "short"])
async def test_errors_and_malformed_answers_switch_to_fallback(
    client: LatencyClient, fake: tuple[str, Script], failure: str
) -> None:
    fake[1].predict = failure
    assert await client.predict(ROWS) is None
    assert client.mode is Mode.FALLBACK and client.counters.predict_errors == 1
    assert client.switch.switches_to_fallback == 1
    assert client.last_error is not None
    assert ("malformed" if failure == "short" else failure) in client.last_error


async def test_a_late_answer_is_a_timeout_within_the_deadline(
    client: LatencyClient, fake: tuple[str, Script]
) -> None:
    fake[1].predict, fake[1].sleep_s = "sleep", 1.0
    started = time.monotonic()
    assert await client.predict(ROWS) is None
    assert time.monotonic() - started < 0.2 + 0.15
    assert client.counters.predict_timeouts == 1 and client.mode is Mode.FALLBACK
    assert client.last_error is not None and "timeout" in client.last_error


async def test_unreachable_service_falls_back() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        async with LatencyClient(dead, config=FAST) as c:
            assert await c.predict(ROWS) is None
            assert c.mode is Mode.FALLBACK and c.counters.predict_errors == 1


async def test_invalid_rows_raise_and_do_not_switch_mode(
    client: LatencyClient, fake: tuple[str, Script]
) -> None:
    fake[1].predict = "422"
    with pytest.raises(InvalidRowsError) as info:
        await client.predict(ROWS)
    assert info.value.detail[0]["loc"][-1] == "kv_cache_percentage"
    assert client.mode is Mode.PREDICTED and client.counters.predict_invalid == 1


async def test_fallback_does_not_wait_probes_and_recovers(
    client: LatencyClient, fake: tuple[str, Script]
) -> None:
    script = fake[1]
    script.predict, script.sleep_s = "sleep", 1.0
    assert await client.predict_for_routing(ROWS) is None  # late: falls back
    calls = script.predict_calls
    started = time.monotonic()
    for _ in range(20):  # in fallback: answered at once, no call before the probe interval
        assert await client.predict_for_routing(ROWS) is None
    assert time.monotonic() - started < 0.05 and script.predict_calls == calls
    script.predict = "ok"
    await asyncio.sleep(0.25)  # pacing, not observing: the probe interval passes
    assert await client.predict_for_routing(ROWS) is None  # this one starts the probe ...
    await eventually(lambda: client.mode is Mode.PREDICTED, "the probe to succeed", timeout_s=1)  # ...
    assert client.mode is Mode.PREDICTED
    assert await client.predict_for_routing(ROWS) is not None
    assert client.counters.probes == 1 and client.switch.switches_to_predicted == 1
    assert client.counters.routed_with_fallback == 22 and client.counters.routed_with_predictions == 1


async def test_router_reports_fallback_decisions(client: LatencyClient, fake: tuple[str, Script]) -> None:
    router = Router(client, LowestLatency())
    rows = [row(300, running=5), row(100, running=0)]
    decision = await router.route(RoutingRequest(), rows)
    assert decision.pod == 1 and decision.used_predictions  # ttft echoes the prompt length
    fake[1].predict = "503"
    decision = await router.route(RoutingRequest(), rows)
    assert decision.pod == 1 and not decision.used_predictions and router.mode is Mode.FALLBACK


# -- samples ----------------------------------------------------------------------------------------


def entry(i: int) -> dict[str, Any]:
    return training_entry(row(tokens=i + 1), actual_ttft_ms=50.0, actual_tpot_ms=10.0)


async def test_samples_are_sent_in_bulk_batches_of_at_most_1000(
    client: LatencyClient, fake: tuple[str, Script]
) -> None:
    assert client.feeder is not None
    client.feeder.add_many([entry(i) for i in range(2500)])
    assert await client.flush_samples(5.0)
    assert [len(batch) for _, batch in fake[1].train_calls] == [1000, 1000, 500]
    assert [e["input_token_length"] for e in fake[1].delivered()] == list(range(1, 2501))
    assert client.feeder.counters.sent == 2500 and client.feeder.counters.batches_sent == 3


async def test_429_retry_after_is_honoured_before_resending(
    client: LatencyClient, fake: tuple[str, Script]
) -> None:
    assert client.feeder is not None
    fake[1].train_answers.extend([(429, {"Retry-After": "0.3"}), (429, {"Retry-After": "0.2"})])
    client.add_sample(row(), 40.0, 8.0)
    assert await client.flush_samples(5.0)
    (t1, _), (t2, _), (t3, batch) = fake[1].train_calls
    assert t2 - t1 >= 0.29 and t3 - t2 >= 0.19 and len(batch) == 1
    assert batch[0]["actual_ttft_ms"] == 40.0 and batch[0]["actual_tpot_ms"] == 8.0
    counters = client.feeder.counters
    assert counters.throttled == 2 and counters.sent == 1 and counters.dropped_after_retries == 0


async def test_503_backs_off_exponentially_then_gives_up(fake: tuple[str, Script]) -> None:
    url, script = fake
    cfg = FeederConfig(backoff_initial_s=0.05, backoff_max_s=0.1, max_attempts=4)
    script.train_answers.extend([(503, {})] * 4 + [(503, {})])  # 4 failures drop batch 1; then one retry
    async with LatencyClient(url, url, ClientConfig(feeder=cfg)) as c:
        assert c.feeder is not None
        c.add_sample(row(), 40.0, 8.0)
        assert await c.flush_samples(5.0)
        gaps = [b - a for (a, _), (b, _) in zip(script.train_calls, script.train_calls[1:], strict=False)]
        assert len(gaps) == 3 and gaps[0] >= 0.045 and gaps[1] >= 0.095 and gaps[2] >= 0.095
        assert c.feeder.counters.dropped_after_retries == 1 and c.feeder.counters.retries == 3
        c.add_sample(row(), 41.0, 8.0)  # the next batch: one 503, then 202
        assert await c.flush_samples(5.0)
        assert c.feeder.counters.sent == 1 and script.delivered()[0]["actual_ttft_ms"] == 41.0


async def test_a_full_buffer_drops_the_oldest_samples_and_counts_them(fake: tuple[str, Script]) -> None:
    url, script = fake
    c = LatencyClient(url, url, ClientConfig(feeder=FeederConfig(max_buffered=100)))
    assert c.feeder is not None
    c.feeder.add_many([entry(i) for i in range(150)])  # the sender is not running yet
    assert c.feeder.counters.dropped_buffer_full == 50 and c.feeder.buffered == 100
    await c.start()
    assert await c.flush_samples(5.0)
    await c.aclose()
    assert [e["input_token_length"] for e in script.delivered()] == list(range(51, 151))


async def test_invalid_entries_are_dropped_and_the_rest_resent(
    client: LatencyClient, fake: tuple[str, Script]
) -> None:
    assert client.feeder is not None
    entries = [entry(i) for i in range(10)]
    entries[3]["kv_cache_percentage"] = 1.5
    entries[7]["actual_ttft_ms"] = -1.0
    client.feeder.add_many(entries)
    assert await client.flush_samples(5.0)
    assert [e["input_token_length"] for e in fake[1].delivered()] == [1, 2, 3, 5, 6, 7, 9, 10]
    assert client.feeder.counters.rejected_invalid == 2 and client.feeder.counters.sent == 8


async def test_close_gives_up_on_an_unreachable_receiver_within_its_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        c = LatencyClient(dead, dead, ClientConfig(feeder=FeederConfig(backoff_initial_s=0.05)))
        await c.start()
        c.add_sample(row(), 40.0, 8.0)
        started = time.monotonic()
        await c.aclose(flush_timeout_s=0.3)
        assert time.monotonic() - started < 1.0
        assert c.feeder is not None and c.feeder.counters.dropped_on_close == 1
