"""The demo's sample feedback against the real coalescer relay: when the training server is away
the coalescer acknowledges nothing (503 with Retry-After once its wait budget is spent), the
demo's sender honours Retry-After and keeps its entries, and once the training server is back
every sample arrives exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import httpx
import pytest

from scheduler_client.feeder import SampleFeeder
from stack.demo import DEMO_FEEDER, sample_counts
from stack.simulator import Cluster, Workload, WorkloadConfig, round_robin, simulate
from tests.procs import eventually, free_port, get_json, start_service, wait_until

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

        async def feed() -> dict[str, int]:
            nonlocal training
            async with httpx.AsyncClient(timeout=5.0) as client:
                sender = SampleFeeder(
                    coalescer.url, client, dataclasses.replace(DEMO_FEEDER, flush_interval_s=0.1)
                )
                await sender.start()
                for entry in entries:
                    sender.add(entry)
                await eventually(lambda: sender.paused_until_s > 0, "a push-back", timeout_s=15)
                # 503 with Retry-After: the sender waits as told and keeps the batch
                assert sender.paused_until_s > 0, "the relay must push back while nobody takes the samples"
                assert sender.counters.sent == 0  # nothing acknowledged without the training server
                # The training server comes (back) up: the relay drains and the sender resumes.
                training = await asyncio.to_thread(
                    start_service,
                    "training_server",
                    ["--data-dir", str(tmp_path / "training")],
                    log_dir=tmp_path,
                    port=training_port,
                )
                await sender.aclose(45)
                return sample_counts(sender)

        sender = asyncio.run(feed())
        assert sender["accepted"] == sender["sent"] == len(entries)
        assert sender["rejected"] == sender["dropped"] == sender["unsent"] == 0
        assert training is not None
        status_url = training.url + "/status"
        wait_until(
            lambda: get_json(status_url)["intake"]["accepted_samples"] >= len(entries),
            "the training server to count every sample",
            timeout_s=20,
        )
        received = get_json(status_url)["intake"]["accepted_samples"]
        assert received == len(entries), coalescer.logs()[-3000:]
    finally:
        coalescer.stop()
        if training is not None:
            training.stop()
