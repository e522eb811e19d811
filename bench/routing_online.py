"""Routing with a model learnt online from nothing, in the shape of issue #10's own measurement.

Run from the repository root::

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_online            # 3 seeds, ~2 min on 2 cores
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_online --variant 'harm 0.02={"harm_weight": 0.02}'

``bench.routing_compare`` routes with one frozen model trained on a warm-up, on 8 pods of the
simulator's default speed and three SLO classes. Issue #10 measured something else: fresh servers
that learn while they route, 6 pods running a larger model (TPOT near its SLO under load), one SLO
for every request (2 s TTFT, 100 ms TPOT), half the requests sharing prefixes, a bursty trace. This
benchmark is that shape on our simulator:

- 6 pods, each ``PodConfig(slowdown=2.5)``; the workload of ``routing_sim.workload_config`` with
  ``shared_prefix_prob=0.5``, burstiness 0.6, scaled to ``--rps``;
- the training server's own pieces in process (``inprocess_training``: the prior first, the
  stratified window, the trainer and the live scorer), fed every completion at the next simulated
  second and retrained on the service's default schedule (``TrainingSettings``: retrain once enough
  new samples arrived or the interval passed; a retrain occupies the trainer for as long as it took
  in wall time, one wall second per simulated second; a new version serves ``--pickup-s`` later);
- a predicted-latency policy predicts with whichever version serves at that moment, in process (the
  prediction server's code, as ``routing_local``); the heuristics need no model.

Attainment counts every arrival; the first ``--warm`` requests are also left out in a second
column (the model is the prior at the start). Retrains take simulated time as long as they take
wall time, so on a busy host the served model is staler: run it on an otherwise idle host, and not
beside another benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
import time
import types
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.inprocess_training import InProcessTraining, ServiceSchedule
from bench.routing_jobs import policy_for
from bench.routing_setup import HEURISTICS, RECOMMENDED
from bench.routing_sim import Scenario, run_policy, workload_config
from bench.sim_calibration_replay import EPOCH, SimClock
from scheduler_client import Prediction
from shared.features import build_features
from shared.schemas import parse_rows, parse_training_entries
from stack.simulator import Completion, PodConfig

SLO = (("one", 1.0, 2000.0, 100.0),)


class OnlineModel:
    """A training server learning from completions while a policy routes (see the module docstring)."""

    def __init__(self, directory: Path, pickup_s: float, train_s: float | None = None) -> None:
        self.training = InProcessTraining(directory, 0.9)
        self.schedule = ServiceSchedule(self.training, speed=1.0, pickup_s=pickup_s, train_s=train_s)
        self.predictor = self.training.predictor()
        self.buffer: list[dict[str, Any]] = []
        self.next_flush_s = 1.0

    async def predict_for_routing(self, rows: Sequence[dict[str, Any]]) -> list[Prediction]:
        ttft, tpot = self.predictor.predict(build_features(parse_rows(list(rows))))
        version = self.predictor.manifest.version
        return [Prediction(a, b, version) for a, b in zip(ttft.tolist(), tpot.tolist(), strict=True)]

    def completed(self, c: Completion) -> None:
        self.buffer.append({**c.features, "actual_ttft_ms": c.ttft_ms, "actual_tpot_ms": c.tpot_ms})

    def advance_to(self, t_s: float) -> None:
        while self.next_flush_s <= t_s:
            self._flush(self.next_flush_s)
            self.next_flush_s += 1.0

    def _flush(self, t_s: float) -> None:
        version = self.schedule.switch(t_s)
        if version is not None:
            self.predictor = self.training.predictor(version)
        new = len(self.buffer)
        if self.buffer:
            columns, _ = parse_training_entries(self.buffer, now_s=EPOCH + t_s)
            self.training.ingest(columns, np.full(new, EPOCH + t_s))
            self.buffer.clear()
        self.schedule.after_flush(t_s, new, EPOCH + t_s)


def scenario(seed: int, requests: int, rps: float, pods: int) -> Scenario:
    workload = dataclasses.replace(
        workload_config(100.0, burstiness=0.6, seed=seed, num_requests=requests), shared_prefix_prob=0.5
    )
    pool = tuple(PodConfig(slowdown=2.5) for _ in range(pods))
    return Scenario("online", workload, pods=pool, cluster_seed=seed, offered_rps=rps)


def run_one(job: tuple[str, int, dict[str, Any], dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """One (policy, seed) run; returns its figures as plain data."""
    import training_server.live_scoring as live_scoring

    name, seed, cfg, variants = job
    # A variant is the recommended policy with its own default_policy keywords.
    policy = policy_for(name if name in HEURISTICS else RECOMMENDED, seed, variants.get(name, {}))
    clock = SimClock(speed=1.0)  # one wall second per simulated second
    # The live scorer's publish interval is in its clock's seconds: make them simulated ones.
    live_scoring.time = types.SimpleNamespace(time=clock.time, monotonic=clock.monotonic)  # type: ignore[attr-defined]
    done: list[Completion] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="routing-online-") as tmp:
        model = OnlineModel(Path(tmp), cfg["pickup_s"], cfg["train_s"]) if policy.uses_predictions else None

        def arrival(t_s: float) -> None:
            clock.now_s = t_s
            if model is not None:
                model.advance_to(t_s)

        def completion(c: Completion) -> None:
            done.append(c)
            if model is not None:
                model.completed(c)

        sim = scenario(seed, cfg["requests"], cfg["rps"], cfg["pods"])
        result = asyncio.run(
            run_policy(sim, policy, model, on_completion=completion, on_arrival=arrival, slo_classes=SLO)
        )
    met_late = sum(
        1
        for c in done
        if c.request.request_id >= cfg["warm"]
        and c.ttft_ms <= (c.request.ttft_slo_ms or np.inf)
        and c.tpot_ms <= (c.request.tpot_slo_ms or np.inf)
    )
    return {
        "policy": name,
        "seed": seed,
        "arrivals": result.arrivals,
        "met": result.met_slo,
        "rejected": result.rejected,
        "met_late": met_late,
        "late": result.arrivals - cfg["warm"],
        "ttft_ms": result.ttft_ms,
        "tpot_ms": result.tpot_ms,
        "ttft_missed": sum(1 for c in done if c.ttft_ms > (c.request.ttft_slo_ms or np.inf)),
        "tpot_missed": sum(1 for c in done if c.tpot_ms > (c.request.tpot_slo_ms or np.inf)),
        "versions": result.model_versions,
        "retrains": model.schedule.runs["total"] if model else 0,
        "published": model.schedule.runs["published"] if model else 0,
        "wall_s": time.perf_counter() - started,
    }


def table(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    """Pooled over seeds, one row per policy (percentiles: the mean of each seed's)."""
    lines = [
        "| policy | SLO attainment | after the first requests | per seed | shed | TTFT p50 / p90 / p99 (ms) "
        "| TPOT p50 / p90 / p99 (ms) | missed TTFT / TPOT | retrains |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        rs = [r for r in runs if r["policy"] == name]
        arrivals = sum(r["arrivals"] for r in rs)

        def pct(key: str, rs: list[dict[str, Any]] = rs) -> str:
            return " / ".join(f"{np.mean([r[key][q] for r in rs]):.0f}" for q in ("p50", "p90", "p99"))

        per_seed = " / ".join(f"{100 * r['met'] / r['arrivals']:.1f}" for r in rs)
        lines.append(
            f"| {name} | {100 * sum(r['met'] for r in rs) / arrivals:.1f}% "
            f"| {100 * sum(r['met_late'] for r in rs) / sum(r['late'] for r in rs):.1f}% "
            f"| {per_seed} | {100 * sum(r['rejected'] for r in rs) / arrivals:.1f}% | {pct('ttft_ms')} "
            f"| {pct('tpot_ms')} | {100 * sum(r['ttft_missed'] for r in rs) / arrivals:.1f}% / "
            f"{100 * sum(r['tpot_missed'] for r in rs) / arrivals:.1f}% "
            f"| {np.mean([r['retrains'] for r in rs]):.0f} |"
        )
    return "\n".join(lines)


def _variant(text: str) -> tuple[str, dict[str, Any]]:
    name, sep, settings = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("expected NAME={default_policy keywords as JSON}")
    return name, json.loads(settings)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="7,8,9", help="comma-separated")
    parser.add_argument("--requests", type=int, default=8_000)
    parser.add_argument("--warm", type=int, default=2_000, help="requests left out of the second column")
    parser.add_argument("--rps", type=float, default=24.0, help="mean arrival rate (6 pods: near saturation)")
    parser.add_argument("--pods", type=int, default=6)
    parser.add_argument("--pickup-s", type=float, default=1.0, help="simulated s until a version serves")
    parser.add_argument(
        "--train-s", type=float, help="s every retrain takes (default: as measured; fixed: runs repeat)"
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--variant", type=_variant, action="append", default=[], help="NAME=JSON, repeatable")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args(argv)
    variants = dict(args.variant)
    names = [*HEURISTICS, RECOMMENDED, *variants]
    cfg = {"requests": args.requests, "warm": args.warm, "rps": args.rps, "pods": args.pods}
    cfg["pickup_s"], cfg["train_s"] = args.pickup_s, args.train_s
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    jobs = [(name, seed, cfg, variants) for name in names for seed in seeds]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.processes) as pool:
        runs = list(pool.map(run_one, jobs))
    print(
        f"{args.pods} pods (slowdown 2.5), {args.rps:g} req/s, {args.requests} requests per run, seeds "
        f"{', '.join(map(str, seeds))}; one SLO {SLO[0][2]:g} ms TTFT / {SLO[0][3]:g} ms TPOT; "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print(table(runs, names))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs}))


if __name__ == "__main__":
    sys.exit(main())
