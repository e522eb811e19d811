"""Does routing by predicted latency beat today's heuristics? One command, real services.

Run from the repository root::

    .venv/bin/python -m bench.routing_compare            # writes docs/benchmarks-routing.md + routing.png
    .venv/bin/python -m bench.routing_compare --quick    # a small smoke run, prints only

What it does:

1. Starts a real training server and prediction server on loopback ports (``tests.procs``),
   with automatic retraining off, so the benchmark decides when models change.
2. Warm-up, on workloads with *different seeds* than the evaluation: routes them with the
   heuristics and feeds every completed request to the training server (through
   ``LatencyClient``'s sample feeder), retrains; then routes them again with the
   predicted-latency policies on that model (so the model also sees the pod states those
   policies create), feeds, retrains. Each retrain is ``POST /retrain?wait=true``; the training
   server publishes a candidate only if it is not worse on held-out recent samples.
3. Freezes the model: stops the training server. The prediction server keeps serving the
   current version from the store; every prediction's ``model_version`` is checked.
4. Evaluates every policy on every load with the same workload seed and pod pool, and writes
   the tables and the plot.

Predictions are asked with a generous per-call timeout (simulated time does not advance while
a call is in flight, so the call's wall latency cannot change the outcome); any fallback
decision is still counted and reported.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench.routing_docs import write_report
from bench.routing_report import markdown_table, plot, summary_table
from bench.routing_setup import (
    DESCRIPTIONS,
    HEURISTICS,
    MIXES,
    NOISE_SEEDS,
    PREDICTED,
    PolicyFactory,
    scenarios,
)
from bench.routing_sim import RunResult, Scenario, run_policy
from scheduler_client import ClientConfig, CompositeHeuristic, FeederConfig, LatencyClient, Policy
from tests.procs import RunningService, start_service

REPO = Path(__file__).resolve().parent.parent


async def _route_and_feed(
    prediction_url: str, training_url: str, runs: Sequence[tuple[Scenario, Policy]]
) -> list[RunResult]:
    cfg = ClientConfig(predict_timeout_s=5.0, feeder=FeederConfig(max_buffered=1_000_000))
    async with LatencyClient(prediction_url, training_url, cfg) as client:
        results = []
        for scenario, policy in runs:
            results.append(await run_policy(scenario, policy, client, feed=client))
        if not await client.flush_samples(120.0):
            raise RuntimeError("samples were not delivered within 120 s")
        assert client.feeder is not None
        counters = client.feeder.counters
        print(
            f"  fed {counters.sent} samples (dropped {counters.dropped_buffer_full}, "
            f"rejected {counters.rejected_invalid}, throttled {counters.throttled})"
        )
    return results


def _retrain(training: RunningService, prediction: RunningService) -> str:
    """Retrain now and wait until the prediction server serves the current version; return it."""
    with httpx.Client(timeout=600.0) as http:
        deadline = time.monotonic() + 60
        while http.get(training.url + "/status").json()["intake"]["pending_samples"]:
            if time.monotonic() > deadline:
                raise RuntimeError("training intake did not drain")
            time.sleep(0.2)
        outcome = http.post(training.url + "/retrain", params={"wait": "true"}).json()
        status = http.get(training.url + "/status").json()
        version = status["current_version"]
        print(f"  retrain: {outcome['outcome']} ({outcome.get('detail')}); current version {version}")
        deadline = time.monotonic() + 30
        while http.get(prediction.url + "/status").json().get("model_version") != version:
            if time.monotonic() > deadline:
                raise RuntimeError(f"prediction server did not switch to {version}")
            time.sleep(0.2)
    return str(version)


async def _evaluate(
    prediction_url: str, evals: Sequence[Scenario], seed: int, concurrency: int
) -> list[RunResult]:
    """Heuristics first (pure CPU, no service), then the predicted policies, ``concurrency`` at a time.

    A predicted run that needed a fallback decision is not evidence about predictions: it is
    run again once, and the benchmark stops if it happens again.
    """
    results = []
    for scenario in evals:
        for name, factory in HEURISTICS.items():
            results.append(_named(await run_policy(scenario, factory(seed)), name))
            _report(results[-1], 0.0)
    gate = asyncio.Semaphore(concurrency)

    async def one(scenario: Scenario, name: str, factory: PolicyFactory) -> RunResult:
        async with gate:
            for _attempt in range(2):
                started = time.perf_counter()
                async with LatencyClient(prediction_url, config=ClientConfig(predict_timeout_s=5.0)) as c:
                    result = _named(await run_policy(scenario, factory(seed), c), name)
                _report(result, time.perf_counter() - started)
                if not result.fallback_decisions:
                    return result
                print(f"  {result.fallback_decisions} fallback decisions ({c.last_error}); running it again")
            raise RuntimeError(f"{name} @ {scenario.name}: predictions kept failing ({c.last_error})")

    jobs = [one(s, n, f) for s in evals for n, f in PREDICTED.items()]
    return results + list(await asyncio.gather(*jobs))


def _named(result: RunResult, name: str) -> RunResult:
    result.policy = name
    return result


def _report(result: RunResult, elapsed_s: float) -> None:
    print(
        f"  {result.scenario:>38} {result.policy:<26} attainment {100 * result.attainment:5.1f}%  "
        f"({elapsed_s:.0f} s)",
        flush=True,
    )


def noise_floor(evals: Sequence[Scenario], seed: int) -> dict[str, float]:
    """Per scenario: the spread (max - min, points) of composite's attainment over tie-break seeds.

    Only the random tie-breaks change between these runs, so it is a lower bound on how much a
    difference between two policies can owe to chance.
    """

    async def spread(scenario: Scenario) -> float:
        values = [
            (await run_policy(scenario, CompositeHeuristic(seed=seed + k))).attainment
            for k in range(NOISE_SEEDS)
        ]
        return 100 * (max(values) - min(values))

    async def all_spreads() -> dict[str, float]:
        return {s.name: await spread(s) for s in evals}

    return asyncio.run(all_spreads())


def main(argv: Sequence[str] | None = None) -> None:
    # A plain SIGTERM would skip the ``with`` blocks that stop the services.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12_000, help="requests per evaluation run")
    parser.add_argument("--warmup-requests", type=int, default=10_000, help="requests per warm-up run")
    parser.add_argument("--seed", type=int, default=7, help="evaluation workload/pool seed")
    parser.add_argument("--warmup-seed", type=int, default=1001)
    parser.add_argument("--workers", type=int, default=2, help="prediction server worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="evaluation runs in flight")
    parser.add_argument("--quick", action="store_true", help="small smoke run; prints, writes nothing")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks-routing.md")
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "routing.png")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.warmup_requests = 2000, 2000
    started = time.perf_counter()
    evals = scenarios(args.seed, args.requests)
    warmups = scenarios(args.warmup_seed, args.warmup_requests)
    with tempfile.TemporaryDirectory(prefix="routing-bench-") as tmp:
        data, logs = Path(tmp) / "training", Path(tmp) / "logs"
        training = start_service(
            "training_server",
            ["--data-dir", str(data), "--retrain-interval-s", "1e9", "--min-new-samples", "100000000"],
            log_dir=logs,
        )
        try:
            prediction = start_service(
                "prediction_server",
                ["--store", str(data / "models"), "--workers", str(args.workers)],
                log_dir=logs,
                ready_path="/readyz",
            )
        except BaseException:
            training.stop()
            raise
        with training, prediction:
            print("warm-up 1: heuristics route the warm-up workloads; samples go to the training server")
            heuristics = list(HEURISTICS.values())
            runs = [(s, heuristics[i % len(heuristics)](args.warmup_seed)) for i, s in enumerate(warmups)]
            asyncio.run(_route_and_feed(prediction.url, training.url, runs))
            _retrain(training, prediction)
            print("warm-up 2: predicted-latency policies route them again on that model")
            predicted = list(PREDICTED.values())
            runs = [(s, predicted[i % len(predicted)](args.warmup_seed)) for i, s in enumerate(warmups)]
            asyncio.run(_route_and_feed(prediction.url, training.url, runs))
            version = _retrain(training, prediction)
            model_status = httpx.get(training.url + "/status", timeout=10).json()
            training.stop()
            print(f"model frozen at {version}; evaluating")
            results = asyncio.run(_evaluate(prediction.url, evals, args.seed, args.concurrency))
    for r in results:
        if r.model_versions and set(r.model_versions) != {version}:
            raise RuntimeError(f"{r.policy}@{r.scenario} saw versions {r.model_versions}, not only {version}")
    offered = {s.name: s.offered_rps or 0.0 for s in evals}
    noise = noise_floor(evals, args.seed)
    summary = summary_table(results, set(HEURISTICS), offered, noise)
    print(summary)
    if args.quick:
        return
    plot(results, set(HEURISTICS), args.plot)
    write_report(
        args.out,
        args.plot,
        summary=summary,
        table=markdown_table(results, set(HEURISTICS)),
        model_status=model_status,
        version=version,
        mixes=MIXES,
        policies=DESCRIPTIONS,
        results=results,
        heuristics=set(HEURISTICS),
        argv=list(argv if argv is not None else sys.argv[1:]),
        elapsed_s=time.perf_counter() - started,
        requests=args.requests,
        warmup_requests=args.warmup_requests,
    )
    print(f"wrote {args.out} and {args.plot} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
