"""The placement-cost term, with models trained by the real services, against the simulator.

A model is trained through a real training server on simulated traffic and served by a real
prediction server. Then one routing decision on a constructed two-pod state: pod 0 runs 20
decoding requests and nothing else, pod 1 runs 2 and has long prompts queued. The new request
(a long prompt with a TTFT objective only) gets its first token sooner on pod 0, so own-latency
headroom picks pod 0; the simulator, run both ways, says its prefill on pod 0 costs the requests already there
far more TPOT than on pod 1. ``PlacementCost`` must see that through its extra rows (in the same
single bulk call) and pick pod 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from bench.routing_compare import _retrain, _route_and_feed
from bench.routing_setup import HEURISTICS, scenarios
from scheduler_client import (
    ClientConfig,
    LatencyClient,
    PlacementCost,
    RoutingRequest,
    SloHeadroom,
    decide,
    default_policy,
)
from stack.simulator import Cluster
from tests.harm_scene import LONG_PROMPT, harm_scene
from tests.procs import RunningService, start_service

pytestmark = pytest.mark.e2e

REQUEST = LONG_PROMPT
ROUTING = RoutingRequest(ttft_slo_ms=1000.0)  # a TTFT objective only: its own TPOT does not matter


@dataclass
class Services:
    training: RunningService
    prediction: RunningService


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    base = tmp_path_factory.mktemp("placement-e2e")
    data, logs = base / "training", base / "logs"
    training = start_service(
        "training_server",
        ["--data-dir", str(data), "--retrain-interval-s", "1e9", "--min-new-samples", "100000000"],
        log_dir=logs,
    )
    with training:
        prediction = start_service(
            "prediction_server", ["--store", str(data / "models")], log_dir=logs, ready_path="/readyz"
        )
        with prediction:
            # Chat traffic at medium to overload, routed by two heuristics: varied pod states.
            chat = [s for s in scenarios(31, 2500) if s.name.startswith("chat")]
            runs = [(s, HEURISTICS[name](0)) for s in chat for name in ("least-queue", "random")]
            asyncio.run(_route_and_feed(prediction.url, training.url, runs))
            _retrain(training, prediction)
            yield Services(training, prediction)


def _state(place_on: int | None) -> tuple[Cluster, list[float]]:
    """The two-pod state at REQUEST's arrival; with ``place_on`` set, REQUEST goes there, and the
    returned TPOTs are those of every other request once everything has finished."""
    cluster = harm_scene()
    if place_on is None:
        return cluster, []
    cluster.route(REQUEST, place_on)
    done = cluster.drain()
    return cluster, [c.tpot_ms for c in done if c.request.request_id != REQUEST.request_id]


def test_placement_cost_sends_a_long_prefill_away_from_the_pod_it_would_harm(trained: Services) -> None:
    # What the simulator says: the prefill costs pod 0's requests more TPOT in total than pod 1's.
    harm = []
    for pod in (0, 1):
        _, others = _state(pod)
        _, alone = _state(1 - pod)  # the same requests, the new one placed on the other pod
        harm.append(sum(others) - sum(alone))
    assert harm[0] > 0 > harm[1], harm  # placing it on pod 0 hurts the others; on pod 1 it is better

    cluster, _ = _state(None)
    rows = cluster.candidate_rows(REQUEST)

    async def decisions() -> tuple[int | None, int | None, float, float, int | None]:
        async with LatencyClient(trained.prediction.url, config=ClientConfig(predict_timeout_s=10.0)) as c:
            own, own_pred = await decide(c, SloHeadroom("spread"), ROUTING, rows)
            calls = c.counters.predict_calls
            policy = PlacementCost(harm_weight=1.0)
            placed, _ = await decide(c, policy, ROUTING, rows)
            assert own_pred is not None
            assert c.counters.predict_calls == calls + 1  # one bulk call with the extra rows
            extra = await c.predict(policy.extra_rows(ROUTING, rows))
            assert extra is not None
            harms = policy.harms(ROUTING, rows, own_pred, extra)
            calls = c.counters.predict_calls
            recommended, _ = await decide(c, default_policy(), ROUTING, rows)  # the physics harm
            assert c.counters.predict_calls == calls + 1
            return own.pod, placed.pod, harms[0], harms[1], recommended.pod

    own_pod, placed_pod, harm0, harm1, recommended_pod = asyncio.run(decisions())
    assert harm0 > harm1, (harm0, harm1)  # the models see what the simulator says
    assert own_pod == 0, "own headroom alone prefers the busy pod (it serves this request sooner)"
    assert placed_pod == 1
    assert recommended_pod == 1, "default_policy's physics harm term sees it from the rows alone"


def test_the_service_answers_the_extra_rows_like_any_rows(trained: Services) -> None:
    cluster, _ = _state(None)
    rows = cluster.candidate_rows(REQUEST)
    body = {"requests": [*rows, *PlacementCost().extra_rows(ROUTING, rows)]}
    response = httpx.post(trained.prediction.url + "/predict/bulk/strict", json=body, timeout=10)
    assert response.status_code == 200 and len(response.json()["predictions"]) == 4
