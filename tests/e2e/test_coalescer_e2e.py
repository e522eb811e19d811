"""The coalescer as users run it: real processes on loopback (training server, prediction replicas,
coalescers), called over HTTP.

One training server and two prediction replicas (serving the training server's model store) are
shared by the module; each test starts the coalescer(s) it needs with the settings it is about.
Load comes from asyncio + httpx in the test process; bounds are generous because the box is small
and shared, and the behaviour under test (batching, failover, shedding) does not depend on speed.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from coalescer.http1 import Http1Pool
from tests.e2e.predicting import random_row
from tests.procs import RunningService, eventually, start_service

pytestmark = pytest.mark.e2e

STRICT = "/predict/bulk/strict"


@dataclass
class Fleet:
    training: RunningService
    replicas: list[RunningService]
    data_dir: Path
    log_dir: Path

    def coalescer(self, *args: str, urls: Sequence[RunningService] | None = None) -> RunningService:
        targets = self.replicas if urls is None else urls
        return start_service(
            "coalescer",
            [
                "--prediction-urls",
                ",".join(r.url for r in targets),
                "--training-url",
                self.training.url,
                *args,
            ],
            log_dir=self.log_dir,
            ready_path="/readyz",
        )

    def replica(self) -> RunningService:
        return start_service(
            "prediction_server",
            ["--store", str(self.data_dir / "models")],
            log_dir=self.log_dir,
            ready_path="/readyz",
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = tmp_path_factory.mktemp("coalescer-e2e")
    logs = base / "logs"
    training = start_service(
        "training_server",
        [
            "--data-dir",
            str(base / "training"),
            "--min-new-samples",
            "1000000",
            "--retrain-interval-s",
            "3600",
        ],
        log_dir=logs,
        ready_path="/readyz",
    )
    fleet = Fleet(training, [], base / "training", logs)
    with ThreadPoolExecutor(2) as pool:
        fleet.replicas = list(pool.map(lambda _: fleet.replica(), range(2)))
    yield fleet
    for service in [*fleet.replicas, fleet.training]:
        service.stop()


def upstream_calls(replicas: Sequence[RunningService]) -> int:
    total = 0.0
    for replica in replicas:
        for line in httpx.get(replica.url + "/metrics").text.splitlines():
            if line.startswith('prediction_requests_total{endpoint="predict_bulk_strict",status="200"}'):
                total += float(line.split()[-1])
    return int(total)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_concurrent_callers_are_batched_and_get_their_own_answers(fleet: Fleet) -> None:
    # A generous default deadline (the header can only shorten it): this test is about batching and
    # answer mapping, and a busy CI box must not turn a slow first batch into a 504.
    coalescer = fleet.coalescer("--deadline-ms", "5000")
    try:
        rng = random.Random(1)
        callers = [[random_row(rng) for _ in range(rng.randint(1, 20))] for _ in range(400)]
        bad = [
            {"requests": [random_row(rng), {**random_row(rng), "kv_cache_percentage": 3}]} for _ in range(20)
        ]
        before = upstream_calls(fleet.replicas)
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=coalescer.url, timeout=10.0, limits=limits) as client:
            gate = asyncio.Semaphore(64)

            async def call(body: dict[str, Any]) -> httpx.Response:
                async with gate:
                    return await client.post(STRICT, json=body, headers={"X-Deadline-Ms": "5000"})

            bodies = [{"requests": c} for c in callers] + bad
            order = list(range(len(bodies)))
            rng.shuffle(order)
            answers = await asyncio.gather(*(call(bodies[i]) for i in order))
        responses = {i: answers[k] for k, i in enumerate(order)}
        made = upstream_calls(fleet.replicas) - before
        assert made < len(callers), f"{made} upstream calls for {len(callers)} callers: nothing was batched"
        # Each caller got the replica's answer for its own rows, in its own order.
        async with httpx.AsyncClient(timeout=10.0) as direct:
            for i in rng.sample(range(len(callers)), 40):
                expected = (
                    await direct.post(fleet.replicas[0].url + STRICT, json={"requests": callers[i]})
                ).json()
                got = responses[i].json()
                assert [p["ttft_ms"] for p in got["predictions"]] == [
                    p["ttft_ms"] for p in expected["predictions"]
                ]
                assert [p["tpot_ms"] for p in got["predictions"]] == [
                    p["tpot_ms"] for p in expected["predictions"]
                ]
        for i, caller in enumerate(callers):
            assert responses[i].status_code == 200
            assert len(responses[i].json()["predictions"]) == len(caller)
        for i in range(len(callers), len(bodies)):
            assert responses[i].status_code == 422
            assert responses[i].json()["detail"][0]["loc"] == ["body", "requests", 1, "kv_cache_percentage"]
        metrics = httpx.get(coalescer.url + "/metrics").text
        assert 'coalescer_rejections_total{reason="invalid_input"} 20.0' in metrics
    finally:
        coalescer.stop()


async def test_an_idle_call_does_not_wait_for_a_long_window(fleet: Fleet) -> None:
    coalescer = fleet.coalescer("--batch-window-us", "200000", urls=fleet.replicas[:1])
    try:
        rng = random.Random(2)
        elapsed = []
        async with httpx.AsyncClient(base_url=coalescer.url, timeout=10.0) as client:
            for _ in range(30):
                started = time.perf_counter()
                response = await client.post(STRICT, json={"requests": [random_row(rng) for _ in range(8)]})
                elapsed.append(time.perf_counter() - started)
                assert response.status_code == 200
        # Had the window applied, every call would take at least 200 ms.
        assert statistics.median(elapsed) < 0.1
        assert sorted(elapsed)[int(0.9 * len(elapsed))] < 0.15
    finally:
        coalescer.stop()


async def test_a_replica_killed_under_load_costs_callers_nothing_but_expired_deadlines(fleet: Fleet) -> None:
    doomed = fleet.replica()
    coalescer = fleet.coalescer("--eject-cooldown-s", "60", urls=[fleet.replicas[1], doomed])
    try:
        statuses: list[int] = []
        rng = random.Random(3)
        async with httpx.AsyncClient(base_url=coalescer.url, timeout=10.0) as client:
            stop_at = time.monotonic() + 3.0

            async def caller() -> None:
                while time.monotonic() < stop_at:
                    response = await client.post(
                        STRICT, json={"requests": [random_row(rng) for _ in range(10)]}
                    )
                    statuses.append(response.status_code)

            async def killer() -> None:
                await asyncio.sleep(1.0)
                await asyncio.to_thread(doomed.kill)

            await asyncio.gather(killer(), *(caller() for _ in range(24)))
        counts = {code: statuses.count(code) for code in set(statuses)}
        assert set(counts) <= {200, 504}, counts
        assert counts.get(200, 0) > 0.95 * len(statuses), counts
        replicas = httpx.get(coalescer.url + "/status").json()["coalescer"]["replicas"]
        state = {r["url"]: r["state"] for r in replicas}
        assert state[doomed.url] == "ejected"
        assert state[fleet.replicas[1].url] == "healthy"
    finally:
        coalescer.stop()
        doomed.kill()


async def test_overload_is_shed_fast_with_bounded_memory(fleet: Fleet) -> None:
    # One slot on one replica, one caller per batch, two callers may wait: 48 callers overload it.
    coalescer = fleet.coalescer(
        *("--max-inflight-per-replica", "1", "--max-batch-rows", "100", "--max-queued-rows", "200"),
        urls=fleet.replicas[:1],
    )
    try:
        rng = random.Random(4)
        body = orjson.dumps({"requests": [random_row(rng) for _ in range(100)]})
        results: list[tuple[int, float]] = []
        rss: list[float] = []
        pool = Http1Pool(coalescer.url, max_idle=64)  # a lean client, so the load really arrives
        stop_at = time.monotonic() + 4.0

        async def caller() -> None:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                response = await pool.request("POST", STRICT, body, timeout_s=10.0)
                results.append((response.status, time.perf_counter() - started))

        async def sample_rss() -> None:
            while time.monotonic() < stop_at:
                rss.append(rss_mb(coalescer.proc.pid))
                await asyncio.sleep(0.25)

        await asyncio.gather(sample_rss(), *(caller() for _ in range(48)))
        pool.close()
        rejected = [t for code, t in results if code == 503]
        accepted = [t for code, t in results if code == 200]
        assert {code for code, _ in results} <= {200, 503, 504}
        assert len(rejected) > len(accepted) > 0, (len(rejected), len(accepted))
        assert statistics.median(rejected) < 0.05, statistics.median(rejected)
        assert statistics.median(accepted) < 0.25  # within the default 250 ms deadline
        settled = rss[len(rss) // 4 :]
        assert max(settled) - min(settled) < 40, rss  # flat: waiting work is bounded
        metrics = httpx.get(coalescer.url + "/metrics").text
        assert f'coalescer_rejections_total{{reason="overloaded"}} {float(len(rejected))}' in metrics
    finally:
        coalescer.stop()


async def test_samples_wait_out_a_training_server_restart_and_are_never_acknowledged_before(
    fleet: Fleet,
) -> None:
    coalescer = fleet.coalescer("--relay-wait-budget-s", "60", "--relay-timeout-s", "1")
    rng = random.Random(5)

    def entries(n: int) -> list[dict[str, Any]]:
        return [
            {**random_row(rng), "actual_ttft_ms": rng.uniform(10, 900), "actual_tpot_ms": rng.uniform(5, 60)}
            for _ in range(n)
        ]

    def accepted_by_training() -> int:
        return int(httpx.get(fleet.training.url + "/status").json()["intake"]["accepted_samples"])

    try:
        async with httpx.AsyncClient(base_url=coalescer.url, timeout=90.0) as client:
            for _ in range(3):
                response = await client.post("/add_training_data_bulk", json={"entries": entries(200)})
                assert (response.status_code, response.json()) == (
                    202,
                    {"message": "Accepted 200 training samples."},
                )
            assert accepted_by_training() >= 600  # synchronous: there before the 202
            fleet.training.stop()
            # A sender's request waits for the training server (within its budget) ...
            pending = asyncio.create_task(
                client.post("/add_training_data_bulk", json={"entries": entries(250)})
            )

            async def relay_failed() -> bool:
                text = (await client.get("/metrics")).text
                return 'coalescer_relay_batches_total{outcome="network"}' in text

            # The relay tried the stopped training server and keeps trying (its budget is 90 s) ...
            await eventually(relay_failed, "a relay attempt that found nobody", timeout_s=20, poll_s=0.05)
            assert not pending.done()  # ... and is not acknowledged while nobody has the samples
            fleet.training = start_service(
                "training_server",
                [
                    "--data-dir",
                    str(fleet.data_dir),
                    "--min-new-samples",
                    "1000000",
                    "--retrain-interval-s",
                    "3600",
                ],
                log_dir=fleet.log_dir,
                port=fleet.training.port,
                ready_path="/readyz",
            )
            response = await pending
            assert response.status_code == 202
        assert accepted_by_training() == 250  # the restarted server got exactly the waiting ones
        relay = httpx.get(coalescer.url + "/status").json()["relay"]
        assert relay["accepted_samples"] == 850 and relay["inflight_bytes"] == 0
    finally:
        coalescer.stop()


async def test_dns_discovery_finds_every_address_of_the_name(fleet: Fleet) -> None:
    port = fleet.replicas[0].port
    coalescer = start_service(
        "coalescer",
        ["--prediction-dns", f"localhost:{port}", "--dns-refresh-s", "0.5"],
        log_dir=fleet.log_dir,
        ready_path="/readyz",
    )
    try:
        rng = random.Random(6)
        async with httpx.AsyncClient(base_url=coalescer.url, timeout=10.0) as client:
            for _ in range(10):
                assert (await client.post(STRICT, json={"requests": [random_row(rng)]})).status_code == 200
            replicas = (await client.get("/status")).json()["coalescer"]["replicas"]
        urls = {r["url"] for r in replicas}
        assert f"http://127.0.0.1:{port}" in urls
        assert urls <= {f"http://127.0.0.1:{port}", f"http://[::1]:{port}"}
        healthy = [r["url"] for r in replicas if r["state"] == "healthy"]
        assert healthy == [f"http://127.0.0.1:{port}"]
    finally:
        coalescer.stop()


def test_static_list_and_settings_from_the_environment(fleet: Fleet) -> None:
    env = {
        "COALESCER_PREDICTION_URLS": ",".join(r.url for r in fleet.replicas),
        "COALESCER_BATCH_WINDOW_US": "500",
    }
    coalescer = start_service("coalescer", [], log_dir=fleet.log_dir, env=env, ready_path="/readyz")
    try:
        status = httpx.get(coalescer.url + "/status").json()
        assert status["is_ready"] is True
        assert [r["url"] for r in status["coalescer"]["replicas"]] == [r.url for r in fleet.replicas]
        assert status["coalescer"]["batch_window_us"] == 500
    finally:
        coalescer.stop()
