"""The online routing benchmark's loop: arrival hook, SLO classes, and a model learnt while routing."""

from __future__ import annotations

import asyncio

from bench.routing_online import SLO, run_one, scenario
from bench.routing_sim import run_policy
from scheduler_client import CompositeHeuristic
from stack.simulator import Completion


def test_run_policy_calls_the_arrival_hook_in_time_order_and_applies_the_slo_classes() -> None:
    sim = scenario(seed=3, requests=300, rps=20.0, pods=3)
    seen: list[float] = []
    done: list[Completion] = []
    result = asyncio.run(
        run_policy(
            sim,
            CompositeHeuristic(seed=3),
            on_arrival=seen.append,
            on_completion=done.append,
            slo_classes=SLO,
        )
    )
    assert len(seen) == result.arrivals == 300
    assert seen == sorted(seen) and seen == [r.arrival_s for r in sim.requests()]
    assert len(done) == result.completed == 300
    assert {(c.request.ttft_slo_ms, c.request.tpot_slo_ms) for c in done} == {(2000.0, 100.0)}


def test_the_recommended_policy_routes_on_versions_trained_while_it_routes() -> None:
    cfg = {"requests": 1500, "warm": 500, "rps": 20.0, "pods": 3, "pickup_s": 1.0, "train_s": 0.3}
    out = run_one(("recommended", 5, cfg, {}))
    assert out["arrivals"] == 1500
    assert out["retrains"] >= 2 and out["published"] >= 1
    # Later decisions used a version trained on this run's samples, or a calibration version of one
    # (a recalibrated prior stays "-prior"; calibration versions follow a retrain within a second).
    assert any(v.endswith(("-trained", "-calibrated")) for v in out["versions"]), out["versions"]
    assert sum(out["versions"].values()) == 1500  # every decision had predictions
