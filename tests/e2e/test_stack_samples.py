"""The demo's sample feedback against the real coalescer relay: when the training server is away
the coalescer acknowledges nothing (503 with Retry-After once its wait budget is spent), the
demo's sender honours Retry-After and keeps its entries, and once the training server is back
every sample arrives exactly once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from stack.samples import SampleSender
from stack.simulator import Cluster, Workload, WorkloadConfig, round_robin, simulate
from tests.procs import free_port, start_service

pytestmark = pytest.mark.e2e


def test_sender_rides_out_an_absent_training_server_and_delivers_everything(tmp_path: Path) -> None:
    completions = simulate(
        Workload(WorkloadConfig(rate_rps=40, num_requests=4000, seed=3)), Cluster(4), round_robin()
    )
    entries = [{**c.features, "actual_ttft_ms": c.ttft_ms, "actual_tpot_ms": c.tpot_ms} for c in completions]
    training_port = free_port()
    coalescer = start_service(
        "coalescer",
        [
            "--prediction-urls", f"http://127.0.0.1:{free_port()}",  # no replica needed for samples
            "--training-url", f"http://127.0.0.1:{training_port}",
            "--relay-wait-budget-s", "1",
        ],
        log_dir=tmp_path,
    )  # fmt: skip
    training = None
    try:

        async def feed() -> SampleSender:
            nonlocal training
            async with httpx.AsyncClient(timeout=5.0) as client:
                sender = SampleSender(client, coalescer.url, flush_interval_s=0.1)
                task = asyncio.create_task(sender.run())
                for entry in entries:
                    sender.add(entry)
                deadline = time.monotonic() + 15
                while sender.throttled == 0 and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert sender.throttled > 0, "the relay must push back while nobody takes the samples"
                assert sender.accepted == 0  # nothing acknowledged without the training server
                # The training server comes (back) up: the relay drains and the sender resumes.
                training = await asyncio.to_thread(
                    start_service,
                    "training_server",
                    ["--data-dir", str(tmp_path / "training")],
                    log_dir=tmp_path,
                    port=training_port,
                )
                await sender.close(task, timeout_s=45)
                return sender

        sender = asyncio.run(feed())
        assert sender.accepted == sender.sent == len(entries)
        assert sender.rejected == sender.dropped == sender.queued == 0
        assert training is not None
        deadline = time.monotonic() + 20
        received = 0
        while time.monotonic() < deadline:
            received = httpx.get(training.url + "/status").json()["intake"]["accepted_samples"]
            if received >= len(entries):
                break
            time.sleep(0.2)
        assert received == len(entries), coalescer.logs()[-3000:]
    finally:
        coalescer.stop()
        if training is not None:
            training.stop()
