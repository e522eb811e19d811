"""What the placement-cost rows add to a routing decision's latency, at 8 candidate pods.

Run from the repository root::

    .venv/bin/python -m bench.routing_overhead [--decisions 3000]

Starts a real training server and prediction server on loopback, trains a model on simulated
samples (heuristic routing of one chat workload), then times whole routing decisions
(``scheduler_client.decide``: build the rows, one bulk HTTP call, the policy's choice) on the
same simulated pod states, alternating, decision by decision, between

- today's call: ``SloHeadroom("spread")``, 8 rows per call;
- the recommended ``default_policy()`` (expected-attainment objective, physics harm, cache and
  TTFT terms: all computed from the rows and their predictions, so 8 rows);
- ``default_policy(harm="tpot", harm_weight=1)``: the model-based harm, 8 candidate rows + 8
  "with this request" rows;
- ``default_policy(admission=True)``: the recommended policy behind its admission test (the harm
  test: the same 8 rows, a chance and a harm per candidate).

Prints p50/p90/p99 of each and of the difference, in wall time over HTTP, and in CPU time
(``time.thread_time``) of the same decisions computed in process by the prediction server's
code (validation, features, forests) plus the policy: on a busy shared machine the wall
times are dominated by waiting for a core, the CPU times are what the extra rows cost.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.routing_compare import _retrain, _route_and_feed
from bench.routing_local import StorePredictions
from bench.routing_setup import HEURISTICS, scenario_named, scenarios
from bench.routing_sim import with_slos
from scheduler_client import (
    ClientConfig,
    LatencyClient,
    Policy,
    RoutingRequest,
    SloHeadroom,
    decide,
    default_policy,
)
from tests.procs import start_service


def _cpu_ms(
    source: StorePredictions, policy: Policy, routing: RoutingRequest, rows: list[dict[str, Any]]
) -> float:
    """CPU time of one decision computed in process: all rows predicted in one call, then the choice."""
    started = time.thread_time()
    extra = policy.extra_rows(routing, rows)
    predictions = source.predict_now([*rows, *extra])
    n = len(rows)
    policy.choose(routing, rows, predictions[:n], predictions[n:] if extra else None)
    return (time.thread_time() - started) * 1e3


async def _time(prediction_url: str, store: Path, decisions: int, seed: int) -> dict[str, list[float]]:
    scenario = scenario_named("chat / high", seed, decisions)
    cluster = scenario.cluster()
    policies: dict[str, Policy] = {
        "today (8 rows)": SloHeadroom("spread"),
        "recommended (8 rows)": default_policy(),
        "placement cost (16 rows)": default_policy(harm="tpot", harm_weight=1.0),
        "recommended + admission (8 rows)": default_policy(admission=True),
    }
    times: dict[str, list[float]] = {name: [] for name in policies}
    times.update({f"{name}, CPU in process": [] for name in policies})
    source = StorePredictions(store)
    async with LatencyClient(prediction_url, config=ClientConfig(predict_timeout_s=5.0)) as client:
        for i, (req, routing) in enumerate(with_slos(scenario.requests(), seed)):
            cluster.advance_to(req.arrival_s)
            rows = cluster.candidate_rows(req)
            items = list(policies.items())
            order = items[i % len(items) :] + items[: i % len(items)]  # rotate who goes first
            pod = 0
            for name, policy in order:
                started = time.perf_counter()
                decision, predictions = await decide(client, policy, routing, rows)
                times[name].append((time.perf_counter() - started) * 1e3)
                if predictions is None:
                    raise RuntimeError(f"prediction failed: {client.last_error}")
                pod = decision.pod if decision.pod is not None else pod
                times[f"{name}, CPU in process"].append(_cpu_ms(source, policy, routing, rows))
            cluster.route(req, pod)  # the last policy's choice
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--warmup-requests", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="routing-overhead-") as tmp:
        data, logs = Path(tmp) / "training", Path(tmp) / "logs"
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
                runs = [
                    (s, HEURISTICS["composite"](0))
                    for s in scenarios(args.seed + 1, args.warmup_requests)[:4]
                ]
                asyncio.run(_route_and_feed(prediction.url, training.url, runs))
                _retrain(training, prediction)
                times = asyncio.run(_time(prediction.url, data / "models", args.decisions, args.seed))
    names = list(times)
    wall, cpu = names[: len(names) // 2], names[len(names) // 2 :]
    for group, label in ((wall, "wall, HTTP"), (cpu, "CPU, in process")):
        base = group[0]
        for name in group:
            values = times[name]
            p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
            print(f"{name:>42}: p50 {p50:7.3f} ms  p90 {p90:7.3f} ms  p99 {p99:7.3f} ms  (n={len(values)})")
        for name in group[1:]:
            diff = np.array(times[name]) - np.array(times[base])
            d50, d99 = np.percentile(diff, [50, 99]).tolist()
            added = float(np.percentile(times[name], 99) - np.percentile(times[base], 99))
            print(
                f"{label}: {name} vs {base}: p99 added {added:+.3f} ms "
                f"(paired p50 {d50:+.3f}, p99 {d99:+.3f})"
            )


if __name__ == "__main__":
    main()
