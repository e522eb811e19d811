"""What the placement-cost rows add to a routing decision's latency, at 8 candidate pods.

Run from the repository root::

    .venv/bin/python -m bench.routing_overhead [--decisions 3000]

Starts a real training server and prediction server on loopback, trains a model on simulated
samples (heuristic routing of one chat workload), then times whole routing decisions
(``scheduler_client.decide``: build the rows, one bulk HTTP call, the policy's choice) on the
same simulated pod states, alternating, decision by decision, between

- today's call: ``SloHeadroom("spread")``, 8 rows per call;
- the recommended ``default_policy()``: 8 candidate rows + 8 "with this request" rows.

Prints p50/p90/p99 of each and of the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.routing_compare import _retrain, _route_and_feed
from bench.routing_setup import HEURISTICS, scenarios
from bench.routing_sim import with_slos
from scheduler_client import ClientConfig, LatencyClient, Policy, SloHeadroom, decide, default_policy
from stack.simulator import Cluster
from tests.procs import start_service


async def _time(prediction_url: str, decisions: int, seed: int) -> dict[str, list[float]]:
    (scenario,) = [s for s in scenarios(seed, decisions) if s.name == "chat / high"]
    cluster = Cluster(8, seed=seed)
    policies: dict[str, Policy] = {
        "today (8 rows)": SloHeadroom("spread"),
        "recommended (16 rows)": default_policy(),
    }
    times: dict[str, list[float]] = {name: [] for name in policies}
    async with LatencyClient(prediction_url, config=ClientConfig(predict_timeout_s=5.0)) as client:
        for i, (req, routing) in enumerate(with_slos(scenario.requests(), seed)):
            cluster.advance_to(req.arrival_s)
            rows = cluster.candidate_rows(req)
            order = list(policies.items()) if i % 2 else list(reversed(policies.items()))
            pod = 0
            for name, policy in order:
                started = time.perf_counter()
                decision, predictions = await decide(client, policy, routing, rows)
                times[name].append((time.perf_counter() - started) * 1e3)
                if predictions is None:
                    raise RuntimeError(f"prediction failed: {client.last_error}")
                pod = decision.pod if decision.pod is not None else pod
            cluster.route(req, pod)  # the recommended policy's choice (it runs last or first alternately)
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
                times = asyncio.run(_time(prediction.url, args.decisions, args.seed))
    names = list(times)
    diff = np.array(times[names[1]]) - np.array(times[names[0]])
    for name, values in [*times.items(), ("difference (per decision)", diff.tolist())]:
        p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
        print(f"{name:>28}: p50 {p50:6.2f} ms  p90 {p90:6.2f} ms  p99 {p99:6.2f} ms  (n={len(values)})")
    p99s = [float(np.percentile(times[n], 99)) for n in names]
    print(f"p99 added by the placement rows: {p99s[1] - p99s[0]:+.2f} ms")


if __name__ == "__main__":
    main()
