"""How much of the simulator's TPOT the routing-time features cannot see: arrivals during decode.

Run from the repository root: ``python -m bench.tpot_arrivals [--pods P --rate RPS --duration-s S
--seeds 0 1 2]``. Simulates the demo's workload (``stack.demo.DemoConfig``'s defaults: bursty
arrivals, 8 pods) with round-robin routing, no services. A request's TPOT is its mean decode step,
and each step also prefills the requests that arrive meanwhile; routing-time features describe
the pod when the request arrives, not what arrives after it. For each band of running requests
(a routing-time feature), it prints TPOT's p90 for the requests whose decode saw the calmest and
the busiest third of cluster arrival rates, and the correlation of that rate with TPOT.
"""

from __future__ import annotations

import argparse

import numpy as np

from stack.demo import DemoConfig
from stack.simulator import round_robin, simulate

RUNNING_BANDS = ((0, 4), (4, 8), (8, 16), (16, 32), (32, 10**9))
MIN_BAND = 50  # fewest requests a band needs to be printed


def arrival_rates(seed: int, pods: int, rate_rps: float, duration_s: float) -> dict[str, np.ndarray]:
    """Per completed request with a TPOT: its TPOT (ms), running requests at routing, and the
    cluster's arrival rate (requests/s) while it decoded."""
    cfg = DemoConfig(
        prediction_url="", training_url="", pods=pods, rate_rps=rate_rps, duration_s=duration_s, seed=seed
    )
    completions = simulate(cfg.workload(), cfg.cluster(), round_robin())
    arrivals = np.sort([c.request.arrival_s for c in completions])
    decoded = [c for c in completions if c.tpot_ms > 0]
    start = np.array([c.routed_at_s + c.ttft_ms / 1e3 for c in decoded])
    end = np.array([c.finished_s for c in decoded])
    arrived = np.searchsorted(arrivals, end) - np.searchsorted(arrivals, start)
    return {
        "tpot_ms": np.array([c.tpot_ms for c in decoded]),
        "running": np.array([c.features["num_request_running"] for c in decoded], dtype=float),
        "rate": arrived / np.maximum(end - start, 1e-3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=DemoConfig.pods)
    parser.add_argument("--rate", type=float, default=DemoConfig.rate_rps)
    parser.add_argument("--duration-s", type=float, default=DemoConfig.duration_s)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    for seed in args.seeds:
        r = arrival_rates(seed, args.pods, args.rate, args.duration_s)
        print(f"seed {seed}: {len(r['tpot_ms'])} requests with a TPOT")
        for lo, hi in RUNNING_BANDS:
            band = (r["running"] >= lo) & (r["running"] < hi)
            if band.sum() < MIN_BAND:
                continue
            tpot, rate = r["tpot_ms"][band], r["rate"][band]
            calm = tpot[rate <= np.percentile(rate, 100 / 3)]
            busy = tpot[rate >= np.percentile(rate, 200 / 3)]
            label = f"{lo}+" if hi == 10**9 else f"{lo}-{hi - 1}"
            p90 = [np.percentile(t, 90) for t in (tpot, calm, busy)]
            print(
                f"  running {label:>6} (n={int(band.sum())}): TPOT p90 {p90[0]:.1f} ms;"
                f" calmest third {p90[1]:.1f} ms, busiest third {p90[2]:.1f} ms;"
                f" corr(arrival rate, TPOT) {np.corrcoef(rate, tpot)[0, 1]:.2f}"
            )


if __name__ == "__main__":
    main()
