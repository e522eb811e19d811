"""Simulator speed: simulated requests per wall-second, round-robin over 8 pods.

Run from the repository root: ``python -m bench.sim_speed [--requests N --pods P --rate RPS]``.
Prints the median of 3 runs, and the same for generating the workload alone (the baseline the
simulation cost sits on top of).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from stack.simulator import Cluster, Workload, WorkloadConfig, round_robin, simulate


def _median_rate(fn: Callable[[], object], n: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--rate", type=float, default=48.0, help="mean arrival rate, requests/s")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    workload = Workload(WorkloadConfig(rate_rps=args.rate, num_requests=args.requests, seed=0))
    done: list[int] = []

    def run_sim() -> None:
        done.append(len(simulate(workload, Cluster(args.pods, seed=0), round_robin())))

    gen_rate = _median_rate(lambda: sum(1 for _ in workload), args.requests, args.repeats)
    sim_rate = _median_rate(run_sim, args.requests, args.repeats)
    assert all(n == args.requests for n in done)
    print(f"workload: {args.requests} requests, {args.rate:g} rps mean, {args.pods} pods, round-robin")
    print(f"generate only : {gen_rate:10,.0f} requests/wall-s (median of {args.repeats})")
    print(f"simulate      : {sim_rate:10,.0f} requests/wall-s (median of {args.repeats})")
    print(f"sim / generate: {sim_rate / gen_rate:.3f}")


if __name__ == "__main__":
    main()
