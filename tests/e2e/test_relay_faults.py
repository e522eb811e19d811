"""The sample relay under faults, with real processes: a real training server (journal on), a real
coalescer in front of it, senders over real HTTP, and real signals (SIGSTOP/SIGCONT, kill -9).

Every test counts samples in the training server's window: what was acknowledged (202) must be
there exactly once, whatever happened in between.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.procs import RunningService, eventually, free_port, get_json, start_service, wait_until

TRAINING_ARGS = [
    "--min-new-samples",
    "100000000",
    "--retrain-interval-s",
    "3600",
    "--stratum-cap",
    "1000000",
]


@dataclass
class Relay:
    training: RunningService
    coalescer: RunningService
    data_dir: Path
    log_dir: Path

    def restart_training(self) -> None:
        self.training = start_training(self.data_dir, self.log_dir, port=self.training.port)

    def window(self, timeout_s: float = 30.0) -> int:
        """Samples in the training server's window once its intake has drained."""
        status = wait_until(
            lambda: (
                s
                if (s := get_json(self.training.url + "/status"))["intake"]["pending_samples"] == 0
                else None
            ),
            "the training server's intake to drain",
            timeout_s,
        )
        return int(status["window"]["samples"])

    def coalescer_metric(self, name: str) -> float:
        for line in httpx.get(self.coalescer.url + "/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


def start_training(data_dir: Path, log_dir: Path, port: int | None = None) -> RunningService:
    return start_service(
        "training_server",
        ["--data-dir", str(data_dir), *TRAINING_ARGS],
        log_dir=log_dir,
        port=port,
        ready_path="/readyz",
    )


@pytest.fixture
def relay(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Relay]:
    extra: list[str] = getattr(request, "param", [])
    log_dir = tmp_path / "logs"
    training = start_training(tmp_path / "training", log_dir)
    coalescer = start_service(
        "coalescer",
        [
            "--prediction-urls",
            f"http://127.0.0.1:{free_port()}",  # no replica: only the relay is exercised
            "--training-url",
            training.url,
            *extra,
        ],
        log_dir=log_dir,
    )
    setup = Relay(training, coalescer, tmp_path / "training", log_dir)
    try:
        yield setup
    finally:
        coalescer.stop()
        setup.training.stop()


def entries(rng: random.Random, n: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "kv_cache_percentage": round(rng.random(), 3),
            "input_token_length": rng.randint(1, 8000),
            "num_request_waiting": rng.randint(0, 20),
            "num_request_running": rng.randint(0, 64),
            "num_tokens_generated": 1,
            "prefix_cache_score": round(rng.random(), 3),
            "actual_ttft_ms": rng.uniform(10, 900),
            "actual_tpot_ms": rng.uniform(5, 60),
            **extra,
        }
        for _ in range(n)
    ]


async def deliver(
    client: httpx.AsyncClient, body: dict[str, Any], *, own_key: bool = True, give_up_s: float = 120.0
) -> int:
    """Post one batch until it is acknowledged (202), as a careful sender does; returns the attempts.

    With ``own_key`` every attempt carries the same Idempotency-Key, so a resend after an
    ambiguous failure (504, a dropped connection) cannot deliver the batch twice.
    """
    headers = {"idempotency-key": uuid.uuid4().hex} if own_key else {}
    deadline = time.monotonic() + give_up_s
    attempts = 0
    while True:
        attempts += 1
        try:
            response = await client.post("/add_training_data_bulk", json=body, headers=headers)
        except httpx.HTTPError:
            response = None
        if response is not None and response.status_code == 202:
            return attempts
        assert response is None or response.status_code in (429, 500, 502, 503, 504), response.text
        assert time.monotonic() < deadline, "a batch was never acknowledged"
        wait_s = float(response.headers.get("retry-after", "0.2")) if response is not None else 0.2
        await asyncio.sleep(min(wait_s, 1.0))


async def test_an_oversized_entry_is_refused_413_and_no_other_sample_is_lost(relay: Relay) -> None:
    rng = random.Random(1)
    async with httpx.AsyncClient(base_url=relay.coalescer.url, timeout=30.0) as client:

        async def good_sender() -> int:
            sent = 0
            for _ in range(10):
                await deliver(client, {"entries": entries(rng, 500)})
                sent += 500
            return sent

        async def bad_sender() -> list[int]:
            huge_field = {"entries": entries(rng, 999) + entries(rng, 1, blob="x" * 8_500_000)}
            big_entry = {"entries": entries(rng, 999) + entries(rng, 1, blob="y" * 1_500_000)}
            return [
                (await client.post("/add_training_data_bulk", json=body)).status_code
                for body in (huge_field, big_entry)
            ]

        results = await asyncio.gather(good_sender(), good_sender(), bad_sender(), good_sender())
    assert results[2] == [413, 413]  # refused at the coalescer, before anything was acknowledged
    assert relay.window() == 15_000  # every other sender's samples arrived, once
    assert relay.coalescer_metric('coalescer_relay_requests_total{outcome="too_large"}') == 2


@pytest.mark.parametrize("relay", [["--relay-timeout-s", "1", "--relay-wait-budget-s", "20"]], indirect=True)
async def test_a_relay_timeout_during_a_training_server_stall_delivers_every_sample_once(
    relay: Relay,
) -> None:
    rng = random.Random(2)
    async with httpx.AsyncClient(base_url=relay.coalescer.url, timeout=60.0) as client:
        for _ in range(3):
            await deliver(client, {"entries": entries(rng, 1000)}, own_key=False)
        os.kill(relay.training.proc.pid, signal.SIGSTOP)
        try:
            stalled = [
                asyncio.create_task(deliver(client, {"entries": entries(rng, 1000)}, own_key=False))
                for _ in range(3)
            ]

            async def resent() -> bool:
                return await asyncio.to_thread(relay.coalescer_metric, "coalescer_relay_retries_total") >= 3

            # Each stalled call times out on the stopped server and is resent by the coalescer.
            await eventually(resent, "the coalescer's resends", timeout_s=30, poll_s=0.2)
            assert not any(t.done() for t in stalled)  # nobody is acknowledged during the stall
        finally:
            os.kill(relay.training.proc.pid, signal.SIGCONT)
        attempts = await asyncio.gather(*stalled)
    assert attempts == [1, 1, 1]  # the coalescer resent them itself, within the senders' budget
    assert relay.coalescer_metric("coalescer_relay_retries_total") >= 3
    assert relay.window() == 6000  # nothing twice, nothing lost


@pytest.mark.parametrize("relay", [["--relay-timeout-s", "2", "--relay-wait-budget-s", "20"]], indirect=True)
async def test_kill_9_of_the_training_server_during_ingestion_loses_and_duplicates_nothing(
    relay: Relay,
) -> None:
    rng = random.Random(3)
    acknowledged = 0
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=relay.coalescer.url, timeout=60.0) as client:

        async def sender() -> None:
            nonlocal acknowledged
            while not stop.is_set():
                n = rng.randint(50, 1000)
                await deliver(client, {"entries": entries(rng, n)})
                acknowledged += n

        senders = [asyncio.create_task(sender()) for _ in range(4)]
        try:
            for _ in range(3):
                await asyncio.sleep(rng.uniform(0.5, 2.0))  # a random moment of the ingestion
                relay.training.kill()
                await asyncio.to_thread(relay.restart_training)
            after_restart = acknowledged
            await eventually(lambda: acknowledged > after_restart, "ingestion after the last restart", 30)
        finally:
            stop.set()
            await asyncio.gather(*senders)
    assert acknowledged > 0
    assert relay.window() == acknowledged  # 0 acknowledged samples lost, none duplicated


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


BOUND_MIB = 16


@pytest.mark.parametrize(
    "relay",
    [["--relay-max-inflight-bytes", str(BOUND_MIB << 20), "--relay-wait-budget-s", "10"]],
    indirect=True,
)
async def test_the_relays_memory_stays_under_its_byte_bound_with_the_training_server_down(
    relay: Relay,
) -> None:
    rng = random.Random(4)
    relay.training.stop()
    pid = relay.coalescer.proc.pid
    # Twelve requests of about 6 MB each: large entries (500 kB unknown fields), every one valid.
    bodies = [{"entries": entries(rng, 12, blob="z" * 500_000)} for _ in range(12)]
    baseline_kib = _rss_kib(pid, "VmRSS")
    async with httpx.AsyncClient(base_url=relay.coalescer.url, timeout=60.0) as client:
        tasks = [asyncio.create_task(client.post("/add_training_data_bulk", json=b)) for b in bodies]
        await asyncio.sleep(3.0)  # the admitted ones wait for the training server, holding memory
        peak_kib = _rss_kib(pid, "VmHWM")
        inflight = relay.coalescer_metric("coalescer_relay_inflight_bytes")
        statuses = sorted(r.status_code for r in await asyncio.gather(*tasks))
    assert inflight <= BOUND_MIB << 20
    assert statuses.count(429) >= 8, statuses  # refused before their bodies were read
    assert set(statuses) <= {429, 503}  # never a 202: nobody has these samples
    growth_mib = (peak_kib - baseline_kib) / 1024
    print(f"relay memory: statuses {statuses}, peak RSS growth {growth_mib:.1f} MiB (bound {BOUND_MIB} MiB)")
    # The bound plus a fixed allowance for parsing one body at a time; 12 bodies would be 72 MB.
    assert growth_mib < BOUND_MIB + 24, f"RSS grew {growth_mib:.0f} MiB"
