"""The coalescer app in process, on a real port, in front of fault-injectable fake replicas.

Each test runs the coalescer (its real lifespan, batcher and hot-path client) and one or two fake
replicas under uvicorn in the test's event loop, and calls it over HTTP. Timing assertions use
generous bounds; a "busy" replica is one whose gate holds its calls until the test releases them,
and the tests wait for the state they need (a call in flight, callers queued) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import httpx
import pytest

from tests.fake_upstream import row, rows
from tests.procs import coalescer_in_loop, eventually

STRICT = "/predict/bulk/strict"


stack = coalescer_in_loop  # ``replicas`` fake replicas and a coalescer in front of them


async def coalescer_status(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await client.get("/status")).json()["coalescer"]


def ttfts(response: httpx.Response) -> list[float]:
    assert response.status_code == 200, response.text
    return [p["ttft_ms"] for p in response.json()["predictions"]]


async def test_results_map_back_to_callers_with_shuffled_upstream_completion() -> None:
    async with stack(replicas=2, max_inflight_per_replica=4, batch_window_us=2000, deadline_ms=5000.0) as (
        client,
        knobs,
    ):
        for k in knobs:
            k.jitter_ms = 15.0  # concurrent batches complete in random order
        rng = random.Random(7)
        callers = []
        start = 0
        for _ in range(150):
            n = rng.randint(1, 12)
            callers.append(rows(n, start))
            start += 1000
        responses = await asyncio.gather(*(client.post(STRICT, json={"requests": r}) for r in callers))
        for sent, response in zip(callers, responses, strict=True):
            assert ttfts(response) == [r["input_token_length"] + 0.5 for r in sent]
            body = response.json()
            assert body["total_requests"] == body["successful_predictions"] == len(sent)
            assert body["failed_predictions"] == 0
            assert all(p["model_version"] == "fake-1" for p in body["predictions"])
        upstream_calls = sum(k.calls for k in knobs)
        assert upstream_calls < len(callers)  # they were batched
        assert sum(k.rows for k in knobs) == sum(len(r) for r in callers)


async def test_idle_call_is_not_delayed_by_a_long_window() -> None:
    async with stack(batch_window_us=200_000) as (client, _):
        elapsed = []
        for i in range(10):
            started = time.perf_counter()
            predicted = ttfts(await client.post(STRICT, json={"requests": rows(3, i)}))
            elapsed.append(time.perf_counter() - started)
            assert predicted == [i + 0.5, i + 1.5, i + 2.5]
        # Had the window applied, every call would take at least 200 ms.
        assert sorted(elapsed)[5] < 0.1
        assert sorted(elapsed)[8] < 0.15


async def test_busy_replica_makes_callers_share_one_batch_after_the_window() -> None:
    async with stack(
        batch_window_us=100_000, eager_inflight_per_replica=1, max_inflight_per_replica=2, deadline_ms=5000.0
    ) as (
        client,
        (k,),
    ):
        k.gate = asyncio.Event()  # the replica holds every call until released: busy for sure
        first = asyncio.create_task(client.post(STRICT, json={"requests": rows(1, 0)}))
        await eventually(lambda: k.in_flight == 1, "the first call to occupy the replica")
        others = [
            asyncio.create_task(client.post(STRICT, json={"requests": rows(1, 10 * i)})) for i in range(1, 5)
        ]
        await eventually(lambda: k.calls == 2, "the late callers' batch to reach the replica")
        k.gate.set()
        responses = await asyncio.gather(first, *others)
        assert [ttfts(r) for r in responses] == [[0.5], [10.5], [20.5], [30.5], [40.5]]
        assert k.batch_sizes == [1, 4]  # the four late callers left together when the window expired


async def test_a_caller_is_never_split_unless_it_alone_exceeds_the_row_cap() -> None:
    async with stack(
        max_batch_rows=25, max_inflight_per_replica=1, batch_window_us=5000, deadline_ms=5000.0
    ) as (client, (k,)):
        k.delay_ms = 10.0
        callers = [rows(10, 100 * i) for i in range(30)]
        big = rows(60, 50_000)
        responses = await asyncio.gather(
            *(client.post(STRICT, json={"requests": r}) for r in callers),
            client.post(STRICT, json={"requests": big}),
        )
        for sent, response in zip([*callers, big], responses, strict=True):
            assert ttfts(response) == [r["input_token_length"] + 0.5 for r in sent]
        assert max(k.batch_sizes) <= 25
        # 10-row callers travel whole (multiples of 10); the 60-row caller went as 25 + 25 + 10.
        assert sorted(s for s in k.batch_sizes if s % 10) == [25, 25]
        assert sum(k.batch_sizes) == 30 * 10 + 60


async def test_bad_callers_get_their_own_422_and_never_poison_a_batch() -> None:
    # (a generous deadline: this test is about isolation, and its 45 callers share the loop with it)
    async with stack(batch_window_us=5000, max_inflight_per_replica=1, deadline_ms=1000.0) as (client, (k,)):
        k.delay_ms = 5.0
        bad_bodies = [
            {"requests": [row(1), row(2, kv_cache_percentage=1.5)]},
            {"requests": [{**row(1), "input_token_length": 2.5}]},
            {"requests": [row(1), {"kv_cache_percentage": 0.1}]},
            {"requests": []},
            {"requests": [row(1, pod_type="gpu")]},
        ]
        good = [rows(4, 100 * i) for i in range(40)]
        responses = await asyncio.gather(
            *(client.post(STRICT, json=b) for b in bad_bodies),
            *(client.post(STRICT, json={"requests": g}) for g in good),
        )
        bad_responses, good_responses = responses[: len(bad_bodies)], responses[len(bad_bodies) :]
        assert all(r.status_code == 422 for r in bad_responses)
        locs = [r.json()["detail"][0]["loc"] for r in bad_responses]
        assert locs[0] == ["body", "requests", 1, "kv_cache_percentage"]
        assert locs[1] == ["body", "requests", 0, "input_token_length"]
        assert locs[2][:3] == ["body", "requests", 1]
        assert locs[3] == ["body", "requests"]
        assert locs[4] == ["body", "requests", 0, "pod_type"]
        for sent, response in zip(good, good_responses, strict=True):
            assert ttfts(response) == [r["input_token_length"] + 0.5 for r in sent]
        assert k.rows == 40 * 4  # no row of a bad caller reached the replica


async def test_deadline_expiry_is_a_504_and_the_header_can_only_shorten_it() -> None:
    async with stack(deadline_ms=400.0) as (client, (k,)):
        k.delay_ms = 2000.0
        started = time.perf_counter()
        short = await client.post(STRICT, json={"requests": rows(2)}, headers={"X-Deadline-Ms": "60"})
        short_s = time.perf_counter() - started
        assert short.status_code == 504
        assert "deadline" in short.json()["detail"]
        assert 0.05 <= short_s < 0.3
        started = time.perf_counter()
        longer = await client.post(STRICT, json={"requests": rows(2)}, headers={"X-Deadline-Ms": "60000"})
        longer_s = time.perf_counter() - started
        assert longer.status_code == 504
        assert 0.35 <= longer_s < 1.0  # capped at the 400 ms default
        # The call's own timeout and the caller's deadline timer fire together: always a 504.
        for _ in range(10):
            racing = await client.post(STRICT, json={"requests": rows(1)}, headers={"X-Deadline-Ms": "30"})
            assert racing.status_code == 504, racing.text
        bad = await client.post(STRICT, json={"requests": rows(2)}, headers={"X-Deadline-Ms": "soon"})
        assert bad.status_code == 422
        assert bad.json()["detail"][0]["loc"] == ["header", "x-deadline-ms"]


async def test_overload_is_an_immediate_503_that_never_reaches_a_replica() -> None:
    async with stack(max_inflight_per_replica=1, max_queued_rows=20, deadline_ms=5000.0) as (client, (k,)):
        k.gate = asyncio.Event()  # busy until the floods are answered
        first = asyncio.create_task(client.post(STRICT, json={"requests": rows(10, 0)}))
        await eventually(lambda: k.in_flight == 1, "the first call to occupy the replica")
        queued = [
            asyncio.create_task(client.post(STRICT, json={"requests": rows(10, 100 * i)})) for i in (1, 2)
        ]

        async def queue_full() -> bool:
            return (await coalescer_status(client))["queued_rows"] == 20

        await eventually(queue_full, "two callers queued behind the busy replica")

        async def timed() -> tuple[httpx.Response, float]:
            started = time.perf_counter()
            response = await client.post(STRICT, json={"requests": rows(10, 7000)})
            return response, time.perf_counter() - started

        rejected = await asyncio.gather(*(timed() for _ in range(20)))
        for response, elapsed_s in rejected:
            assert response.status_code == 503
            assert response.json()["detail"].startswith("overloaded")
            assert int(response.headers["retry-after"]) >= 1
            # Answered without waiting for the busy replica; a generous bound for a shared box.
            assert elapsed_s < 0.5
        k.gate.set()
        for task in [first, *queued]:
            assert (await task).status_code == 200
        assert k.rows == 30  # only the admitted callers' rows
        metrics = (await client.get("/metrics")).text
        assert 'coalescer_rejections_total{reason="overloaded"} 20.0' in metrics


async def test_a_failing_replica_is_retried_elsewhere_and_ejected() -> None:
    async with stack(replicas=2, eject_cooldown_s=30.0) as (client, (bad, good)):
        bad.fail = "500"
        for i in range(20):
            assert ttfts(await client.post(STRICT, json={"requests": rows(2, 10 * i)})) == [
                10 * i + 0.5,
                10 * i + 1.5,
            ]
        assert bad.calls == 1  # one failure, then ejected for the cool-down
        assert good.rows == 40
        status = (await client.get("/status")).json()
        states = {r["url"]: r["state"] for r in status["coalescer"]["replicas"]}
        assert sorted(states.values()) == ["ejected", "healthy"]
        metrics = (await client.get("/metrics")).text
        assert "coalescer_retries_total 1.0" in metrics
        assert 'coalescer_upstream_failures_total{kind="status"} 1.0' in metrics


@pytest.mark.parametrize("fail", ["close", "short"])
async def test_broken_connections_and_short_answers_are_retried(fail: str) -> None:
    async with stack(replicas=2, eject_cooldown_s=30.0) as (client, (bad, good)):
        bad.fail = fail
        responses = await asyncio.gather(
            *(client.post(STRICT, json={"requests": rows(3, 10 * i)}) for i in range(10))
        )
        for i, response in enumerate(responses):
            assert ttfts(response) == [10 * i + 0.5, 10 * i + 1.5, 10 * i + 2.5]
        assert good.rows == 30


async def test_ejected_replica_is_probed_back_after_the_cool_down() -> None:
    async with stack(replicas=2, eject_cooldown_s=0.3, probe_interval_s=0.05) as (client, (flaky, _)):
        flaky.fail, flaky.fail_next = "500", 1
        for i in range(4):
            assert (await client.post(STRICT, json={"requests": rows(1, i)})).status_code == 200

        async def states() -> list[str]:
            return [r["state"] for r in (await coalescer_status(client))["replicas"]]

        async def both_healthy() -> bool:
            return await states() == ["healthy", "healthy"]

        await eventually(both_healthy, "the ejected replica probed back after its 0.3 s cool-down")
        calls_before = flaky.calls
        for i in range(10):
            assert (await client.post(STRICT, json={"requests": rows(1, i)})).status_code == 200
        assert flaky.calls > calls_before  # it takes traffic again


async def test_when_every_replica_fails_callers_get_a_fast_error() -> None:
    async with stack(replicas=2, deadline_ms=2000.0) as (client, knobs):
        for k in knobs:
            k.fail = "500"
        started = time.perf_counter()
        response = await client.post(STRICT, json={"requests": rows(1)})
        assert response.status_code == 502
        assert time.perf_counter() - started < 1.0
        for k in knobs:
            k.fail = "503"
        response = await client.post(STRICT, json={"requests": rows(1)})
        assert response.status_code == 503
        assert response.json() == {"detail": "Models not ready"}


async def test_a_hung_replica_leaves_time_for_the_retry() -> None:
    async with stack(replicas=2, deadline_ms=600.0) as (client, (hung, good)):
        hung.fail = "hang"
        started = time.perf_counter()
        responses = await asyncio.gather(
            *(client.post(STRICT, json={"requests": rows(1, i)}) for i in range(6))
        )
        assert [ttfts(r) for r in responses] == [[i + 0.5] for i in range(6)]
        assert time.perf_counter() - started < 0.6
        assert good.rows == 6  # whatever went to the hung replica was answered by the other


async def test_disconnected_caller_is_dropped_before_dispatch() -> None:
    async with stack(max_inflight_per_replica=1, deadline_ms=3000.0) as (client, (k,)):
        k.gate = asyncio.Event()
        first = asyncio.create_task(client.post(STRICT, json={"requests": rows(1, 0)}))
        await eventually(lambda: k.in_flight == 1, "the first call to occupy the replica")
        # A second caller queues behind the busy slot, then hangs up.
        base = str(client.base_url)
        async with httpx.AsyncClient(base_url=base) as other:
            gone = asyncio.create_task(other.post(STRICT, json={"requests": rows(5, 100)}))

            async def queued() -> bool:
                return (await coalescer_status(client))["queued_rows"] == 5

            await eventually(queued, "the second caller queued")
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone

        async def dropped() -> bool:
            metrics = (await client.get("/metrics")).text
            return 'coalescer_dropped_callers_total{reason="disconnected"} 1.0' in metrics

        await eventually(dropped, "the hung-up caller dropped from the queue")
        k.gate.set()  # the slot frees: a caller still queued would be dispatched now
        assert (await first).status_code == 200
        status = await coalescer_status(client)
        assert status["queued_rows"] == status["inflight_calls"] == 0
        assert k.rows == 1  # the hung-up caller's 5 rows never left


async def test_a_queue_too_slow_for_the_callers_deadline_refuses_at_once() -> None:
    async with stack(max_inflight_per_replica=1, deadline_ms=400.0) as (client, (k,)):
        k.gate = asyncio.Event()  # the first call holds the replica until released, then answers at once
        busy = asyncio.create_task(client.post(STRICT, json={"requests": rows(1, 0)}))
        await eventually(lambda: k.in_flight == 1, "the first call to occupy the replica")
        k.delay_ms = 1000.0  # what comes next takes longer than any deadline here
        waiting = asyncio.create_task(client.post(STRICT, json={"requests": rows(1, 10)}))

        async def one_queued() -> bool:
            return (await coalescer_status(client))["queued_rows"] == 1

        await eventually(one_queued, "the second caller queued")
        # Pacing, not observing: the waiting caller ages past half of a newcomer's 400 ms.
        await asyncio.sleep(0.25)
        started = time.perf_counter()
        refused = await client.post(STRICT, json={"requests": rows(1, 20)})
        assert refused.status_code == 503
        assert "would wait about" in refused.json()["detail"]
        assert time.perf_counter() - started < 0.1
        k.gate.set()
        assert (await busy).status_code == 200
        assert (await waiting).status_code == 504  # it ran out of time, as predicted
        assert k.batch_sizes == [1, 1]  # the refused caller never reached the replica
        states = [r["state"] for r in (await client.get("/status")).json()["coalescer"]["replicas"]]
        assert states == ["healthy"]  # a call cut short by its caller's deadline does not eject


async def test_a_slow_replica_that_answers_healthz_is_not_ejected_and_slow_ones_get_no_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with stack(replicas=2, deadline_ms=300.0, eject_cooldown_s=30.0) as (client, (a, b)):
        a.delay_ms = b.delay_ms = 400.0  # CPU overload: every replica is slow, none is dead
        responses = await asyncio.gather(
            *(client.post(STRICT, json={"requests": rows(1, i)}) for i in range(6))
        )
        assert {r.status_code for r in responses} <= {502, 504}  # none answered in time

        # Each timed-out replica is asked /healthz; both answer and are logged as slow, not ejected.
        def slow() -> set[str]:
            return {r.__dict__["fields"]["url"] for r in caplog.records if r.msg == "replica_slow"}

        await eventually(lambda: len(slow()) == 2, "both /healthz checks answered")
        status = (await client.get("/status")).json()["coalescer"]
        assert [r["state"] for r in status["replicas"]] == ["healthy", "healthy"]  # slow, alive: kept
        metrics = (await client.get("/metrics")).text
        # Once one timed out on each, a retry could only add load: at most the first wave retried.
        assert a.calls + b.calls <= 6 + 2, (a.calls, b.calls)
        assert "coalescer_retries_total" in metrics
        a.delay_ms = b.delay_ms = 0.0
        assert (await client.post(STRICT, json={"requests": rows(1, 0)})).status_code == 200
