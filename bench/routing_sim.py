"""Routing scenarios on the pod simulator, and one simulated run of a policy with its metrics.

A *scenario* is a pod pool and a seeded workload. Every request gets an SLO class and a
sheddable flag drawn from its own seeded stream (so they do not depend on the routing):

    class        share  TTFT SLO  TPOT SLO
    interactive   40%    250 ms    30 ms
    standard      40%    600 ms    40 ms
    batch         20%   2000 ms    60 ms
    sheddable: 30% of requests, whatever their class.

``run_policy`` drives the simulator in arrival order: at each arrival the pool advances to that
instant, the policy sees every pod's wire feature row (and, for predicted-latency policies,
one prediction per pod from a ``LatencyClient``), and the request is routed or rejected.
Completed requests can be fed back as training samples. Simulated time is independent of wall
time, so a prediction call's latency never changes the simulated outcome; only a failed or
late call (a fallback decision) can, and those are counted.

Metrics: SLO attainment = requests that completed within *both* their TTFT and TPOT SLO,
over *all* arrivals (a rejected request counts as a miss); TTFT/TPOT percentiles over
completed requests (TPOT over those with more than one output token); throughput and goodput
(SLO-meeting completions) per second of simulated time from the first arrival to the last
completion.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler_client import LatencyClient, Policy, RoutingRequest, decide
from scheduler_client.router import PredictionSource
from stack.simulator import Cluster, Completion, PodConfig, SimRequest, Workload, WorkloadConfig

SLO_CLASSES: tuple[tuple[str, float, float, float], ...] = (
    # name, share, TTFT SLO ms, TPOT SLO ms
    ("interactive", 0.4, 250.0, 30.0),
    ("standard", 0.4, 600.0, 40.0),
    ("batch", 0.2, 2000.0, 60.0),
)
SHEDDABLE_SHARE = 0.3


@dataclass(frozen=True)
class Scenario:
    """A named pod pool and workload; ``pods`` is a count of default pods or explicit configs.

    With ``offered_rps`` set, arrival times are scaled so that the realised mean arrival rate
    is exactly that: the same request sequence, compressed or stretched in time. (A seeded
    Markov-modulated stream's realised rate strays +-15% from its nominal rate over a few
    minutes; scaling keeps the loads of a comparison exactly where they are named.)
    """

    name: str
    workload: WorkloadConfig
    pods: int | tuple[PodConfig, ...] = 8
    cluster_seed: int = 0
    offered_rps: float | None = None

    def cluster(self) -> Cluster:
        """A fresh pool of this scenario's pods."""
        return Cluster(list(self.pods) if isinstance(self.pods, tuple) else self.pods, seed=self.cluster_seed)

    def requests(self) -> list[SimRequest]:
        arrivals = list(Workload(self.workload))
        if self.offered_rps is None or len(arrivals) < 2:
            return arrivals
        span_s = arrivals[-1].arrival_s - arrivals[0].arrival_s
        scale = (len(arrivals) - 1) / span_s / self.offered_rps
        return [dataclasses.replace(r, arrival_s=r.arrival_s * scale) for r in arrivals]


def workload_config(rate_rps: float, *, burstiness: float, seed: int, num_requests: int) -> WorkloadConfig:
    """The benchmark's workload shape: default lengths and prefixes, 2 s bursts 20% of the time."""
    return WorkloadConfig(
        rate_rps=rate_rps,
        burstiness=burstiness,
        burst_fraction=0.2,
        mean_burst_s=2.0,
        num_requests=num_requests,
        seed=seed,
    )


def with_slos(
    requests: list[SimRequest],
    seed: int,
    slo_classes: Sequence[tuple[str, float, float, float]] = SLO_CLASSES,
) -> list[tuple[SimRequest, RoutingRequest]]:
    """Attach an SLO class (of ``slo_classes``) and a sheddable flag to each request, from a stream
    seeded by ``seed``."""
    rng = np.random.default_rng([seed, 0x510])
    shares = np.array([share for _, share, _, _ in slo_classes])
    classes = rng.choice(len(slo_classes), size=len(requests), p=shares / shares.sum())
    sheddable = rng.random(len(requests)) < SHEDDABLE_SHARE
    out = []
    for req, cls, shed in zip(requests, classes.tolist(), sheddable.tolist(), strict=True):
        _, _, ttft_slo, tpot_slo = slo_classes[cls]
        req = dataclasses.replace(req, ttft_slo_ms=ttft_slo, tpot_slo_ms=tpot_slo)
        out.append((req, RoutingRequest(ttft_slo, tpot_slo, sheddable=bool(shed))))
    return out


@dataclass
class RunResult:
    """Outcome of one scenario under one policy."""

    scenario: str
    policy: str
    arrivals: int
    completed: int
    rejected: int
    met_slo: int
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    throughput_rps: float
    goodput_rps: float
    fallback_decisions: int = 0
    model_versions: dict[str, int] = field(default_factory=dict)

    @property
    def attainment(self) -> float:
        return self.met_slo / self.arrivals if self.arrivals else 0.0


def meets_slos(c: Completion) -> bool:
    """Whether a completed request met both its TTFT and its TPOT SLO (an unset SLO is met)."""
    return c.ttft_ms <= (c.request.ttft_slo_ms or np.inf) and c.tpot_ms <= (c.request.tpot_slo_ms or np.inf)


def summarize(
    scenario: str, policy: str, arrivals: list[SimRequest], done: list[Completion], rejected: int
) -> RunResult:
    ttft = np.array([c.ttft_ms for c in done])
    tpot = np.array([c.tpot_ms for c in done if c.tpot_ms > 0])
    met = sum(1 for c in done if meets_slos(c))
    start_s = arrivals[0].arrival_s if arrivals else 0.0
    span_s = max((c.finished_s for c in done), default=start_s) - start_s
    return RunResult(
        scenario=scenario,
        policy=policy,
        arrivals=len(arrivals),
        completed=len(done),
        rejected=rejected,
        met_slo=met,
        ttft_ms=_percentiles(ttft),
        tpot_ms=_percentiles(tpot),
        throughput_rps=len(done) / span_s if span_s > 0 else 0.0,
        goodput_rps=met / span_s if span_s > 0 else 0.0,
    )


def _percentiles(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    return {"p50": p50, "p90": p90, "p99": p99}


async def run_policy(
    scenario: Scenario,
    policy: Policy,
    client: PredictionSource | None = None,
    *,
    feed: LatencyClient | None = None,
    on_completion: Callable[[Completion], None] | None = None,
    on_arrival: Callable[[float], None] | None = None,
    slo_classes: Sequence[tuple[str, float, float, float]] = SLO_CLASSES,
) -> RunResult:
    """Simulate ``scenario`` routed by ``policy``; predictions from ``client``, samples fed to ``feed``.

    ``on_arrival(t_s)`` is called at each arrival before the pool advances to it (an online learner
    uses it to take in the samples due by then); ``slo_classes`` replaces ``SLO_CLASSES``.
    """
    if policy.uses_predictions and client is None:
        raise ValueError(f"policy {policy.name} needs a LatencyClient")
    arrivals = scenario.requests()
    cluster = scenario.cluster()
    done: list[Completion] = []
    rejected = fallbacks = 0
    versions: Counter[str] = Counter()

    def finished(completions: list[Completion]) -> None:
        done.extend(completions)
        for c in completions:
            if feed is not None:
                feed.add_sample(c.features, c.ttft_ms, c.tpot_ms)
            if on_completion is not None:
                on_completion(c)

    for i, (req, routing) in enumerate(with_slos(arrivals, scenario.workload.seed, slo_classes)):
        if i % 256 == 255:
            await asyncio.sleep(0)  # let other runs' calls and timers proceed
        if on_arrival is not None:
            on_arrival(req.arrival_s)
        finished(cluster.advance_to(req.arrival_s))
        rows = cluster.candidate_rows(req)
        if policy.uses_predictions and client is not None:
            decision, predictions = await decide(client, policy, routing, rows)
            if predictions is None:
                fallbacks += 1
            else:
                versions[predictions[0].model_version or "?"] += 1
        else:
            decision = policy.choose(routing, rows)
        if decision.pod is None:
            rejected += 1
            continue
        cluster.route(req, decision.pod)
    finished(cluster.drain())
    result = summarize(scenario.name, policy.name, arrivals, done, rejected)
    result.fallback_decisions = fallbacks
    result.model_versions = dict(versions)
    return result
