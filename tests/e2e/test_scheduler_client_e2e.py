"""scheduler_client against the real services: routing a simulated workload, feeding samples,
falling back when the prediction server dies and recovering when it comes back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from scheduler_client import (
    ClientConfig,
    FallbackPolicy,
    LatencyClient,
    Mode,
    Router,
    RoutingRequest,
    SloHeadroom,
)
from stack.simulator import Cluster, Workload, WorkloadConfig
from tests.procs import RunningService, eventually, start_service

pytestmark = pytest.mark.e2e


@dataclass
class Services:
    training: RunningService
    prediction: RunningService
    coalescer: RunningService
    data_dir: Path
    log_dir: Path


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    base = tmp_path_factory.mktemp("scheduler-client-e2e")
    logs, data = base / "logs", base / "training"
    training = start_service("training_server", ["--data-dir", str(data)], log_dir=logs)
    started = [training]
    try:
        prediction = start_service(
            "prediction_server", ["--store", str(data / "models")], log_dir=logs, ready_path="/readyz"
        )
        started.append(prediction)
        coalescer = start_service(
            "coalescer",
            ["--prediction-urls", prediction.url, "--training-url", training.url],
            log_dir=logs,
            ready_path="/readyz",
        )
        started.append(coalescer)
        yield Services(training, prediction, coalescer, data, logs)
    finally:
        for service in reversed(started):
            service.stop()


async def _route(router: Router, requests: int, seed: int = 3) -> tuple[int, int, int]:
    """Route a simulated workload; returns (decisions with predictions, without, completions fed)."""
    cluster = Cluster(4, seed=seed)
    workload = Workload(WorkloadConfig(rate_rps=40, num_requests=requests, seed=seed))
    predicted = fallback = fed = 0
    request = RoutingRequest(ttft_slo_ms=500, tpot_slo_ms=50)
    feed = router.client.feeder is not None
    for req in workload:
        for done in cluster.advance_to(req.arrival_s):
            if feed:
                router.completed(done.features, done.ttft_ms, done.tpot_ms)
                fed += 1
        rows = cluster.candidate_rows(req)
        decision = await router.route(request, rows)
        assert decision.pod is not None
        predicted += decision.used_predictions
        fallback += not decision.used_predictions
        cluster.route(req, decision.pod)
    for done in cluster.drain():
        if feed:
            router.completed(done.features, done.ttft_ms, done.tpot_ms)
            fed += 1
    return predicted, fallback, fed


def _accepted(training: RunningService) -> int:
    return int(httpx.get(training.url + "/status", timeout=5).json()["intake"]["accepted_samples"])


async def test_routes_through_the_coalescer_and_feeds_every_sample(services: Services) -> None:
    before = _accepted(services.training)
    url = services.coalescer.url
    async with LatencyClient(url, url, ClientConfig(predict_timeout_s=2.0)) as client:
        predicted, fallback, fed = await _route(Router(client, SloHeadroom("spread")), 300)
        assert (predicted, fallback, fed) == (300, 0, 300)
        assert client.mode is Mode.PREDICTED and client.last_model_version
        assert await client.flush_samples(10.0)
        assert client.feeder is not None and client.feeder.counters.sent == 300
    assert _accepted(services.training) == before + 300  # the relay's 202 means the training server has them


async def test_falls_back_when_predictions_die_and_recovers_when_they_return(services: Services) -> None:
    replica = start_service(
        "prediction_server",
        ["--store", str(services.data_dir / "models")],
        log_dir=services.log_dir,
        ready_path="/readyz",
    )
    config = ClientConfig(predict_timeout_s=1.0, fallback=FallbackPolicy(probe_interval_s=0.2))
    try:
        async with LatencyClient(replica.url, config=config) as client:
            router = Router(client, SloHeadroom("spread"))
            assert (await _route(router, 50))[:2] == (50, 0)
            replica.kill()
            predicted, fallback, _ = await _route(router, 50, seed=4)
            assert predicted == 0 and fallback == 50  # no decision waits: the first failure flips the mode
            assert client.mode is Mode.FALLBACK and client.switch.switches_to_fallback == 1
            assert client.counters.predict_errors >= 1 and client.last_error
            replica = start_service(
                "prediction_server",
                ["--store", str(services.data_dir / "models")],
                log_dir=services.log_dir,
                port=replica.port,
                ready_path="/readyz",
            )

            async def switched_back() -> bool:
                await router.route(RoutingRequest(), [_idle_row()])  # traffic carries the probes
                return client.mode is not Mode.FALLBACK

            await eventually(switched_back, "predictions again", timeout_s=10, poll_s=0.05)
            assert client.mode is Mode.PREDICTED and client.switch.switches_to_predicted == 1
            predicted, fallback, _ = await _route(router, 50, seed=5)
            assert (predicted, fallback) == (50, 0)
    finally:
        replica.stop()


def _idle_row() -> dict[str, float | int]:
    return {
        "kv_cache_percentage": 0.0,
        "input_token_length": 100,
        "num_request_waiting": 0,
        "num_request_running": 0,
        "num_tokens_generated": 1,
        "prefix_cache_score": 0.0,
    }
