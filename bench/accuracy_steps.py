"""Simulator scenarios with step changes for the accuracy evidence.

Each scenario is a steady warm-up followed by sudden changes, built from the simulator's public
pieces: the request stream is consecutive ``Workload`` segments (each its own seeded
``WorkloadConfig``, arrivals shifted to the segment's start), and a change of the pods is an
event that replaces each pod's ``PodConfig`` at that simulated instant (``slowdown`` applies
from the pod's next step on). Nothing is known to the servers: they only see the rows and the
samples, as in production.

- ``overload``: 20 requests/s over 4 pods, then 60 requests/s, unbursty (queues build on every pod) for
  60 s, then back to 20.
- ``prompts``: prompts of median 700 tokens, then of median 2,000 tokens (queues appear).
- ``slow-pool``: every pod becomes 3x slower (a degraded pool) at the same request rate.

Asked for by name only (``--scenarios``), not part of #9's evidence:

- ``overload-twice``: the overload, 90 s back at 20 requests/s, then the same overload again, as a
  production trace has several episodes (the window keeps the first one's samples in their strata).
- ``episodes``: a production-like day in miniature on 6 pods instead of 4: bursty traffic at 30
  requests/s with four overload episodes of different heights and lengths (75, 90, 70 and 85
  requests/s for 45, 30, 60 and 20 s), the third and fourth with 15 % long prompts (median 6,000
  tokens) mixed in from the second calm spell on. Different pods, rates, lengths and mix from the
  three step scenarios the defaults were judged on, so it checks them on a workload they were not
  tuned to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.accuracy_replay import Event, Feedback, ReplayConfig, chooser, completion_samples, simulate_first
from stack.simulator import Cluster, Completion, PodConfig, SimRequest, Workload, WorkloadConfig

PODS = 4
BASE_RPS = 20.0


# A history (``--history``) ends this many simulated s before the replay it comes before starts.
HISTORY_GAP_S = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    segments: tuple[tuple[float, dict[str, Any]], ...]  # (duration s, WorkloadConfig overrides)
    slowdowns: tuple[tuple[float, float], ...] = ()  # (simulated s, slowdown factor of every pod)
    pods: int = PODS

    @property
    def duration_s(self) -> float:
        return sum(d for d, _ in self.segments)

    def steps(self) -> list[tuple[str, float, float]]:
        """(name, time, end of the segment after it) of every change, in time order."""
        changes: list[tuple[str, float]] = []
        t = 0.0
        for i, (d, overrides) in enumerate(self.segments):
            if i:
                changes.append((_describe(overrides), t))
            t += d
        changes += [
            (f"pods {f:g}x slower" if f != 1 else "pods back to speed", at) for at, f in self.slowdowns
        ]
        changes.sort(key=lambda c: c[1])
        ends = [c[1] for c in changes[1:]] + [self.duration_s]
        return [(name, at, end) for (name, at), end in zip(changes, ends, strict=True)]

    def phase(self, t_s: float) -> str:
        """The stage label at simulated time ``t_s``: "0 steady" before the first change, then
        "k: <change>" after the k-th change."""
        steps = self.steps()
        index = sum(1 for _, at, _ in steps if t_s >= at)
        return "0: steady" if index == 0 else f"{index}: {steps[index - 1][0]}"

    def requests(self, seed: int) -> Iterator[SimRequest]:
        offset = 0.0
        emitted = 0
        for i, (duration, overrides) in enumerate(self.segments):
            cfg = WorkloadConfig(
                **{"rate_rps": BASE_RPS, **overrides},
                num_requests=None,
                duration_s=duration,
                seed=seed * 1000 + i,
            )
            for req in Workload(cfg):
                yield dataclasses.replace(req, request_id=emitted, arrival_s=req.arrival_s + offset)
                emitted += 1
            offset += duration

    def cluster(self, seed: int) -> Cluster:
        return Cluster([PodConfig() for _ in range(self.pods)], seed=seed)

    def replay_config(
        self, seed: int, feedback: Feedback, send_predictions: bool, speed: float
    ) -> ReplayConfig:
        """How ``bench.accuracy_replay`` replays this scenario's ``seed``: its pods and duration, fed
        back under ``feedback`` at ``speed`` simulated s per wall s."""
        return ReplayConfig(
            pods=self.pods,
            duration_s=self.duration_s,
            seed=seed,
            speed=speed,
            feedback=feedback,
            send_predictions=send_predictions,
        )

    def events(self) -> list[Event]:
        return [(at, _slow(factor)) for at, factor in self.slowdowns]

    def simulate(self, seed: int) -> list[Completion]:
        """Every request of ``seed``, routed at random as the evidence routes it, run to completion;
        in arrival order."""
        done = simulate_first(
            self.requests(seed),
            self.cluster(seed),
            chooser("random", seed),
            sorted(self.events(), key=lambda e: e[0]),
        )
        return [c for c, _ in done]

    def recorded(
        self, seed: int, before_s: float, speed: float = 1.0
    ) -> tuple[list[dict[str, Any]], np.ndarray]:
        """``seed``'s replay as a recorded trace holds it, as the history of a replay that starts at
        ``before_s`` (epoch s): each completed request's training entry (both targets, no prediction),
        in completion order, and its completion time on a clock that runs ``speed`` times slower than
        simulated time (a replay's pace), the last one ``HISTORY_GAP_S`` simulated s before ``before_s``."""
        done = sorted(self.simulate(seed), key=lambda c: c.finished_s)
        entries = [entry for c in done for entry in completion_samples(c, (), ReplayConfig())]
        finished_s = np.array([c.finished_s for c in done])
        return entries, before_s - (HISTORY_GAP_S + finished_s[-1] - finished_s) / speed


def _slow(factor: float) -> Any:
    def apply(cluster: Cluster) -> None:
        for pod in cluster.pods:
            pod.cfg = dataclasses.replace(pod.cfg, slowdown=factor)

    return apply


def _describe(overrides: dict[str, Any]) -> str:
    if "prompt_median_tokens" in overrides:
        return f"prompts median {overrides['prompt_median_tokens']:g} tokens"
    rate = f"{overrides.get('rate_rps', BASE_RPS):g} req/s"
    share = overrides.get("long_prompt_share")
    return rate if share is None else f"{rate}, {share:.0%} long prompts"


def scenarios(warmup_s: float = 180.0, after_s: float = 150.0, *, extra: bool = False) -> list[Scenario]:
    """The three scenarios: ``warmup_s`` of steady traffic, then the change(s), then ``after_s``;
    with ``extra``, also those asked for by name only (``overload-twice``, ``episodes``)."""
    overload = ((60.0, {"rate_rps": 60.0, "burstiness": 0.0}), (after_s, {"rate_rps": BASE_RPS}))
    twice = (*overload[:1], (90.0, {"rate_rps": BASE_RPS}), *overload)
    calm = {"rate_rps": 30.0}
    mixed = {"rate_rps": 30.0, "long_prompt_share": 0.15}
    episodes = (
        (warmup_s, calm),
        (45.0, {"rate_rps": 75.0, "burstiness": 0.0}),
        (90.0, calm),
        (30.0, {"rate_rps": 90.0, "burstiness": 0.0}),
        (90.0, mixed),
        (60.0, {**mixed, "rate_rps": 70.0, "burstiness": 0.0}),
        (90.0, mixed),
        (20.0, {**mixed, "rate_rps": 85.0, "burstiness": 0.0}),
        (after_s, mixed),
    )
    return [
        Scenario("overload", ((warmup_s, {}), *overload)),
        Scenario("prompts", ((warmup_s, {}), (after_s, {"prompt_median_tokens": 2000.0}))),
        Scenario("slow-pool", ((warmup_s + after_s, {}),), slowdowns=((warmup_s, 3.0),)),
    ] + (
        [Scenario("overload-twice", ((warmup_s, {}), *twice)), Scenario("episodes", episodes, pods=6)]
        if extra
        else []
    )


def selected(names: list[str] | None, warmup_s: float = 180.0, after_s: float = 150.0) -> list[Scenario]:
    """The scenarios a harness runs: #9's three when ``names`` is ``None``, else those named (also
    the ones asked for by name only), in ``scenarios``' order; an unknown name is an error."""
    if names is None:
        return scenarios(warmup_s, after_s)
    every = scenarios(warmup_s, after_s, extra=True)
    unknown = set(names) - {s.name for s in every}
    if unknown:
        raise SystemExit(f"unknown scenario(s) {sorted(unknown)}; known: {[s.name for s in every]}")
    return [s for s in every if s.name in names]
