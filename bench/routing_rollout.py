"""A clairvoyant reference for routing alone: each placement simulated on an exact copy of the pod.

Run from the repository root::

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_rollout            # ~25 min on 2 cores
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_rollout --seeds 7 --ttft-cost 1

How much can a router gain by choosing a pod, one request at a time? ``Rollout`` knows what no
scheduler can: for every candidate pod it copies the pod's simulator state (queues, KV, prefix
cache, the seeded step jitter), places the request on the copy and runs it until every request
there has finished, with no further arrivals. So it knows exactly which of the pod's requests
(the new one included) would then meet both their SLOs, and picks the pod where placing the
request adds the most of them to the attainment:

    score_p = (requests on p meeting their SLOs with this one placed there)
              - (requests on p meeting their SLOs without it)
              - ttft_cost_per_s x (this request's TTFT on p, in seconds)

(ties: the shorter TTFT). It is the exact version of what a predicted-latency policy estimates,
its own chance and the harm to the others (``scheduler_client.placement``), with the same TTFT term
that keeps its TTFT tail in check. It is not an upper bound: it ignores the requests still to
come (what it places now also delays them, and a prefix it caches now serves them), and a router
that anticipated them could do better. It needs no model, so its figures are deterministic and
comparable with the heuristics' rows of ``docs/benchmarks-routing.md`` (same scenarios and seeds).

The "without" count of a pod is the count from its last rollout, less those that have since
completed: with no new arrival a pod runs exactly the trajectory its copy ran (the simulator is
deterministic and ``advance_to`` in steps or at once gives the same completions;
``tests/unit/test_routing_rollout.py``).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from bench.routing_jobs import result_from_json, run_job
from bench.routing_report import pooled
from bench.routing_setup import HARD_LOADS, scenario_named, scenarios
from bench.routing_sim import RunResult, Scenario, meets_slos, summarize, with_slos
from stack.simulator import Cluster, Completion, SimRequest


class Rollout:
    """The clairvoyant one-step router over ``cluster`` (see the module docstring)."""

    def __init__(self, cluster: Cluster, ttft_cost_per_s: float = 0.0) -> None:
        if ttft_cost_per_s < 0:
            raise ValueError("ttft_cost_per_s must be >= 0")
        self.cluster = cluster
        self.ttft_cost_per_s = ttft_cost_per_s
        # Per pod: the requests there that meet their SLOs on the pod's current trajectory.
        self._meeting = [self._trajectory(index)[0] for index in range(len(cluster.pods))]

    def _trajectory(
        self, index: int, req: SimRequest | None = None, row: dict[str, Any] | None = None
    ) -> tuple[set[int], Completion | None]:
        """Pod ``index`` run on a copy to its end (with ``req`` placed there): who meets their SLOs,
        and ``req``'s completion."""
        trial = copy.deepcopy(self.cluster.pods[index])
        if req is not None:
            trial.enqueue(req, self.cluster.now_s, row or {})
        out: list[Completion] = []
        trial.advance_to(math.inf, out)
        meeting = {c.request.request_id for c in out if meets_slos(c)}
        own = [c for c in out if req is not None and c.request.request_id == req.request_id]
        return meeting, (own[0] if own else None)

    def completed(self, completions: Sequence[Completion]) -> None:
        for c in completions:
            self._meeting[c.pod].discard(c.request.request_id)

    def choose(self, req: SimRequest, rows: Sequence[dict[str, Any]]) -> int:
        best: tuple[tuple[float, float], int, set[int]] | None = None
        for index in range(len(self.cluster.pods)):
            meeting, own = self._trajectory(index, req, rows[index])
            assert own is not None
            gain = len(meeting) - len(self._meeting[index])
            key = (gain - self.ttft_cost_per_s * own.ttft_ms / 1000.0, -own.ttft_ms)
            if best is None or key > best[0]:
                best = (key, index, meeting)
        assert best is not None
        _, chosen, meeting = best
        self._meeting[chosen] = meeting
        return chosen


def run_rollout(scenario: Scenario, ttft_cost_per_s: float) -> RunResult:
    """``scenario`` routed by ``Rollout`` (in arrival order, as ``routing_sim.run_policy``)."""
    arrivals = scenario.requests()
    cluster = scenario.cluster()
    router = Rollout(cluster, ttft_cost_per_s)
    done: list[Completion] = []
    for req, _ in with_slos(arrivals, scenario.workload.seed):
        completions = cluster.advance_to(req.arrival_s)
        router.completed(completions)
        done.extend(completions)
        cluster.route(req, router.choose(req, cluster.candidate_rows(req)))
    done.extend(cluster.drain())
    return summarize(scenario.name, policy_name(ttft_cost_per_s), arrivals, done, 0)


def policy_name(ttft_cost_per_s: float) -> str:
    return f"rollout, TTFT cost {ttft_cost_per_s:g}/s"


def _job(job: tuple[int, int, str, float]) -> tuple[int, RunResult, float]:
    seed, requests, name, ttft_cost = job
    started = time.perf_counter()
    return seed, run_rollout(scenario_named(name, seed, requests), ttft_cost), time.perf_counter() - started


def table(per_seed: Sequence[tuple[int, RunResult]], costs: Sequence[float]) -> str:
    """Markdown, pooled over the seeds: per load, composite's attainment (%) and each rollout's
    difference to it (points), with the TTFT p99 in brackets (ms, mean over the seeds)."""
    rows = {(r.scenario, r.policy): r for r in pooled(per_seed)}
    loads = list(dict.fromkeys(r.scenario for _, r in per_seed))
    head = "| load | composite, % | " + " | ".join(policy_name(c) for c in costs) + " |"
    out = [head, "|---|" + "---:|" * (len(costs) + 1)]
    for load in loads:
        base = rows[(load, "composite")]
        cells = [f"{base.attainment * 100:.1f} ({base.ttft_ms['p99']:.0f})"]
        for cost in costs:
            r = rows[(load, policy_name(cost))]
            cells.append(f"{(r.attainment - base.attainment) * 100:+.1f} ({r.ttft_ms['p99']:.0f})")
        out.append(f"| {load} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="7,8,9", help="the routing benchmark's evaluation seeds")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--ttft-cost", default="0,1", help="comma-separated TTFT costs per second")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    costs = [float(c) for c in args.ttft_cost.split(",")]
    loads = [s.name for s in scenarios(seeds[0], args.requests) if s.name.endswith(HARD_LOADS)]
    # composite as the routing benchmark runs it (no model: run_job needs no store for a heuristic)
    per_seed = [
        (seed, result_from_json(run_job("", seed, args.requests, load, "composite", "{}")))
        for seed in seeds
        for load in loads
    ]
    jobs = [(seed, args.requests, load, cost) for load in loads for cost in costs for seed in seeds]
    with ProcessPoolExecutor(args.processes) as pool:
        for seed, result, elapsed_s in pool.map(_job, jobs):
            print(
                f"seed {seed} {result.scenario} {result.policy}: {result.attainment:.2%}, "
                f"TTFT p99 {result.ttft_ms['p99']:.0f} ms ({elapsed_s:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            per_seed.append((seed, result))
    print(table(per_seed, costs))


if __name__ == "__main__":
    main()
