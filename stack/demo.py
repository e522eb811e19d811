"""The demo workload: a simulated pod pool routed by our predictions, over real HTTP.

For each arriving request the demo asks ``POST /predict/bulk/strict`` for one row per pod,
routes to the pod with the lowest predicted TTFT (random among ties; a random pod with
probability ``epsilon``, so the samples keep covering pods the model dislikes) and feeds
every completion back through ``POST /add_training_data_bulk``. The simulator keeps its own
clock: prediction calls cost no simulated time; ``speed`` sets the pace (simulated seconds per
wall second, 2 by default, so a person can follow the panel; 0 means as fast as the calls allow)
and the demo ends after ``duration_s`` simulated seconds. It shows a live view and returns a
summary dict.

Requests still running when the arrivals stop finish in a cluster that empties out: their TPOT
is that of a nearly idle pod, unlike anything a loaded scheduler sees, so they feed the
training server like every completion but are left out of the accuracy figures.

Run it against any running stack: ``python -m stack.demo --prediction-url URL --training-url URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import httpx
import numpy as np
import orjson

from scheduler_client.feeder import FeederConfig, SampleFeeder
from shared.logging import configure_logging, log_event
from stack.dashboard import DemoSnapshot, LiveView
from stack.demo_report import DemoRun, build_summary, format_summary
from stack.demo_stats import LatencyWindow, Outcome, RollingAccuracy
from stack.simulator import Cluster, PodConfig, SimRequest, Workload, WorkloadConfig, round_robin, simulate

log = logging.getLogger(__name__)

_WATCHDOG_EVERY_S = 0.5
# The demo's feedback never gives a sample up while its services come and go (a 429/503 keeps the
# batch and waits for Retry-After); only a refusal (422, other 4xx) drops entries.
DEMO_FEEDER = FeederConfig(
    max_buffered=100_000, backoff_max_s=8.0, max_retry_after_s=30.0, max_attempts=10**9
)


@dataclass(frozen=True)
class DemoConfig:
    prediction_url: str
    training_url: str  # where samples go: the coalescer relays them to the training server
    training_server_url: str | None = None  # for the summary: what the training server made of them
    duration_s: float = 120.0  # simulated
    pods: int = 8
    rate_rps: float = 60.0
    speed: float = 2.0  # simulated seconds per wall second; 0 = unthrottled
    seed: int = 0
    epsilon: float = 0.05
    window: int = 500
    refresh_s: float = 1.0
    log_every_s: float = 5.0  # when the output is not a terminal
    call_timeout_s: float = 5.0
    final_flush_timeout_s: float = 30.0
    tty: bool | None = None

    def workload(self) -> Workload:
        return Workload(
            WorkloadConfig(
                rate_rps=self.rate_rps, num_requests=None, duration_s=self.duration_s, seed=self.seed
            )
        )

    def cluster(self) -> Cluster:
        return Cluster([PodConfig() for _ in range(self.pods)], seed=self.seed)


def run_demo(
    cfg: DemoConfig, out: TextIO | None = None, watchdog: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Run the demo to the end and return its summary; ``watchdog`` may raise to abort it."""
    return asyncio.run(_Demo(cfg, out or sys.stdout, watchdog).run())


class _Demo:
    def __init__(self, cfg: DemoConfig, out: TextIO, watchdog: Callable[[], None] | None) -> None:
        self.cfg = cfg
        self.view = LiveView(out, tty=cfg.tty, log_every_s=cfg.log_every_s)
        self.watchdog = watchdog
        self.rng = random.Random(cfg.seed)
        self.cluster = cfg.cluster()
        self.ttft = RollingAccuracy(cfg.window)
        self.tpot = RollingAccuracy(cfg.window)
        self.latency = LatencyWindow()
        self.all_latencies_ms: list[float] = []
        self.outcomes: list[Outcome] = []
        self.pending: dict[int, tuple[float, float, str | None]] = {}
        self.requests = 0
        self.rows = 0
        self.prediction_errors = 0
        self.last_error: str | None = None
        self.versions: dict[str, float] = {}  # version -> wall seconds when first seen
        self.model_version: str | None = None
        self.quantile = 0.9
        self.started = time.monotonic()
        self.sim_end_s = 0.0
        self._next_watch = 0.0
        self.sender: SampleFeeder | None = None
        self.training_status: dict[str, Any] | None = None

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
        async with httpx.AsyncClient(timeout=cfg.call_timeout_s, limits=limits) as client:
            self.sender = SampleFeeder(cfg.training_url, client, DEMO_FEEDER)
            await self.sender.start()
            view_task = asyncio.create_task(self._refresh(), name="demo-view")
            self.started = time.monotonic()
            try:
                for req in cfg.workload():
                    self._watch()
                    if cfg.speed > 0:
                        delay = self.started + req.arrival_s / cfg.speed - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    self._complete(self.cluster.advance_to(req.arrival_s))
                    rows = self.cluster.candidate_rows(req)
                    self.cluster.route(req, await self._choose(client, req, rows))
                    self.requests += 1
                self.sim_end_s = self.cluster.now_s
                self._complete(self.cluster.drain(), scored=False)
                await self._flush()
                if cfg.training_server_url:
                    self.training_status = await self._training_status(client, cfg.training_server_url)
            finally:
                view_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await view_task
                await self.sender.aclose(0.0)  # a no-op after _flush; else stops the sender
        wall_s = time.monotonic() - self.started
        self.view.update(self._snapshot(done=True))
        summary = build_summary(self._results(wall_s))
        self.view.out.write(format_summary(summary) + "\n")
        self.view.out.flush()
        log_event(
            log, "demo_finished", **{k: v for k, v in summary.items() if not isinstance(v, dict | list)}
        )
        return summary

    def _results(self, wall_s: float) -> DemoRun:
        cfg = self.cfg
        sender = self.sender
        assert sender is not None
        # The counterfactual: the same arrivals on the same pods, routed round-robin.
        baseline = simulate(cfg.workload(), cfg.cluster(), round_robin())
        return DemoRun(
            duration_s=cfg.duration_s,
            pods=cfg.pods,
            rate_rps=cfg.rate_rps,
            window=cfg.window,
            wall_s=wall_s,
            sim_s=self.sim_end_s,
            requests=self.requests,
            rows=self.rows,
            prediction_errors=self.prediction_errors,
            last_error=self.last_error,
            call_latencies_ms=self.all_latencies_ms,
            versions=self.versions,
            final_version=self.model_version,
            quantile=self.quantile,
            outcomes=self.outcomes,
            samples=sample_counts(sender),
            round_robin_ttft_ms=[c.ttft_ms for c in baseline],
            round_robin_tpot_ms=[c.tpot_ms for c in baseline],
            training_server=self.training_status,
        )

    async def _flush(self) -> None:
        """Send what is still buffered, watching the services meanwhile."""
        assert self.sender is not None
        closing = asyncio.create_task(self.sender.aclose(self.cfg.final_flush_timeout_s))
        try:
            while not closing.done():
                await asyncio.wait({closing}, timeout=_WATCHDOG_EVERY_S)
                self._watch()
        finally:
            closing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closing

    async def _training_status(self, client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
        """The training server's view once the relay has delivered our samples (or after 10 s)."""
        assert self.sender is not None
        deadline = time.monotonic() + 10.0
        try:
            while True:
                status = (await client.get(url.rstrip("/") + "/status")).json()
                accepted = status.get("intake", {}).get("accepted_samples", 0)
                delivered = accepted >= self.sender.counters.sent
                if delivered or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
                self._watch()
            versions = (await client.get(url.rstrip("/") + "/models")).json().get("versions", [])
        except (httpx.HTTPError, ValueError) as exc:
            log_event(log, "training_status_failed", logging.WARNING, error=repr(exc))
            return None
        return {
            "current_version": status.get("current_version"),
            "versions_in_store": versions,
            "accepted_samples": status.get("intake", {}).get("accepted_samples"),
            "window_samples": status.get("window", {}).get("samples"),
            "retrains": status.get("training", {}).get("runs"),
            "held_out_metrics": status.get("current_metrics"),
        }

    def _watch(self) -> None:
        now = time.monotonic()
        if self.watchdog is not None and now >= self._next_watch:
            self._next_watch = now + _WATCHDOG_EVERY_S
            self.watchdog()

    async def _choose(self, client: httpx.AsyncClient, req: SimRequest, rows: list[dict[str, Any]]) -> int:
        t0 = time.perf_counter()
        try:
            resp = await client.post(
                self.cfg.prediction_url.rstrip("/") + "/predict/bulk/strict",
                content=orjson.dumps({"requests": rows}),
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            return self._fallback(rows, f"{type(exc).__name__}: {exc}")
        elapsed_ms = (time.perf_counter() - t0) * 1e3
        self.latency.add(elapsed_ms)
        self.all_latencies_ms.append(elapsed_ms)
        if resp.status_code != 200:
            return self._fallback(rows, f"HTTP {resp.status_code}: {resp.text[:200]}")
        predictions = orjson.loads(resp.content)["predictions"]
        ttfts = [float(p["ttft_ms"]) for p in predictions]
        if self.rng.random() < self.cfg.epsilon:
            pod = self.rng.randrange(len(rows))
        else:
            best = min(ttfts)
            pod = self.rng.choice([i for i, t in enumerate(ttfts) if t <= best])
        chosen = predictions[pod]
        version = chosen.get("model_version")
        if version is not None:
            version = str(version)
            self.versions.setdefault(version, time.monotonic() - self.started)
        self.model_version = version
        self.quantile = float(chosen.get("quantile") or self.quantile)
        self.pending[req.request_id] = (ttfts[pod], float(chosen["tpot_ms"]), version)
        self.rows += len(rows)
        return pod

    def _fallback(self, rows: list[dict[str, Any]], error: str) -> int:
        """Without predictions, route like a queue-depth scheduler would."""
        self.prediction_errors += 1
        if self.last_error != error:
            log_event(log, "prediction_call_failed", logging.WARNING, error=error)
        self.last_error = error
        loads = [r["num_request_waiting"] + r["num_request_running"] for r in rows]
        return int(np.argmin(loads))

    def _complete(self, completions: list[Any], scored: bool = True) -> None:
        """Send each completion as a training sample; score its prediction unless ``scored`` is off."""
        assert self.sender is not None
        for c in completions:
            entry = dict(c.features)
            entry["actual_ttft_ms"] = c.ttft_ms
            entry["actual_tpot_ms"] = c.tpot_ms
            self.sender.add(entry)
            predicted = self.pending.pop(c.request.request_id, None)
            if predicted is None or not scored:
                self.outcomes.append(Outcome(c.pod, c.ttft_ms, c.tpot_ms, None, None, None))
                continue
            p_ttft, p_tpot, version = predicted
            self.ttft.add(p_ttft, c.ttft_ms)
            self.tpot.add(p_tpot, c.tpot_ms)
            self.outcomes.append(Outcome(c.pod, c.ttft_ms, c.tpot_ms, p_ttft, p_tpot, version))

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.refresh_s)
            self.view.update(self._snapshot())

    def _snapshot(self, done: bool = False) -> DemoSnapshot:
        assert self.sender is not None
        samples = sample_counts(self.sender)
        return DemoSnapshot(
            wall_s=time.monotonic() - self.started,
            sim_s=min(self.cluster.now_s, self.cfg.duration_s),
            duration_s=self.cfg.duration_s,
            requests=self.requests,
            rows=self.rows,
            prediction_errors=self.prediction_errors,
            call_p50_ms=self.latency.percentile(50),
            call_p99_ms=self.latency.percentile(99),
            model_version=self.model_version,
            versions_seen=len(self.versions),
            quantile=self.quantile,
            ttft=self.ttft.recent(),
            tpot=self.tpot.recent(),
            samples_sent=samples["sent"],
            samples_accepted=samples["accepted"],
            samples_queued=samples["unsent"],
            samples_throttled=samples["throttled"],
            samples_rejected=samples["rejected"],
            done=done,
        )


def sample_counts(feeder: SampleFeeder) -> dict[str, int]:
    """The demo's view of its feedback: entries answered (``sent``), acknowledged, refused, ..."""
    c = feeder.counters
    return {
        "sent": c.sent + c.rejected_invalid + c.dropped_after_retries,
        "accepted": c.sent,
        "rejected": c.rejected_invalid,
        "throttled": c.throttled,
        "failed_calls": c.retries,
        "dropped": c.dropped_buffer_full + c.dropped_after_retries,
        "unsent": feeder.buffered + c.dropped_on_close,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stack.demo",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--prediction-url", required=True, help="coalescer (or prediction server) URL")
    parser.add_argument("--training-url", help="where samples go (default: the prediction URL, a coalescer)")
    parser.add_argument("--training-server-url", help="training server, to report what it learnt (optional)")
    parser.add_argument("--duration-s", type=float, default=DemoConfig.duration_s, help="simulated seconds")
    parser.add_argument("--pods", type=int, default=DemoConfig.pods, help="simulated pods")
    parser.add_argument(
        "--rate-rps", type=float, default=DemoConfig.rate_rps, help="mean arrival rate (bursty)"
    )
    parser.add_argument(
        "--speed", type=float, default=DemoConfig.speed, help="simulated seconds per wall second (0: no cap)"
    )
    parser.add_argument("--fast", action="store_true", help="as fast as predictions allow (--speed 0)")
    parser.add_argument("--seed", type=int, default=DemoConfig.seed, help="seed of the workload and pods")
    parser.add_argument(
        "--epsilon", type=float, default=DemoConfig.epsilon, help="share routed to a random pod"
    )
    parser.add_argument(
        "--window", type=int, default=DemoConfig.window, help="completions in the rolling window"
    )
    parser.add_argument("--summary-json", help="also write the summary to this file")
    args = parser.parse_args(argv)
    configure_logging("stack.demo", "warning")
    cfg = DemoConfig(
        prediction_url=args.prediction_url,
        training_url=args.training_url or args.prediction_url,
        training_server_url=args.training_server_url,
        duration_s=args.duration_s,
        pods=args.pods,
        rate_rps=args.rate_rps,
        speed=0.0 if args.fast else args.speed,
        seed=args.seed,
        epsilon=args.epsilon,
        window=args.window,
    )
    try:
        summary = run_demo(cfg)
    except KeyboardInterrupt:
        return 130
    if args.summary_json:
        with open(args.summary_json, "wb") as f:
            f.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
