"""What the routing benchmark compares: the policies, the request mixes and their loads.

``bench.routing_compare`` runs every policy here on every (mix, load) scenario.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.routing_sim import Scenario, workload_config
from scheduler_client import (
    Admission,
    CompositeHeuristic,
    LeastKV,
    LeastQueue,
    Policy,
    PrefixAffinity,
    RandomPolicy,
    SloHeadroom,
    default_policy,
)

PolicyFactory = Callable[[int], Policy]

HEURISTICS: dict[str, PolicyFactory] = {
    "random": lambda seed: RandomPolicy(seed=seed),
    "least-queue": lambda seed: LeastQueue(seed=seed),
    "least-kv": lambda seed: LeastKV(seed=seed),
    "composite": lambda seed: CompositeHeuristic(seed=seed),
}


def _affinity(seed: int) -> PrefixAffinity:
    return PrefixAffinity(
        SloHeadroom("spread"),
        threshold=0.5,
        ttft_margin_ms=50.0,
        ttft_margin_frac=0.25,
        epsilon=0.05,
        seed=seed,
    )


RECOMMENDED = "recommended"
RECOMMENDED_ADMISSION = "recommended+admission"
# The recommended policy is scheduler_client.default_policy; its settings (recommended.py) were
# chosen on the validation seeds (``--tune``), never on the evaluation seeds.
PREDICTED: dict[str, PolicyFactory] = {
    "slo-spread": lambda seed: SloHeadroom("spread", seed=seed),
    "prefix-affinity": _affinity,
    RECOMMENDED: lambda seed: default_policy(seed),
    "slo-spread+admission": lambda seed: Admission(SloHeadroom("spread", seed=seed), slack_frac=0.25),
    RECOMMENDED_ADMISSION: lambda seed: default_policy(seed, admission=True),
}
DESCRIPTIONS = {
    "random": "uniformly random pod",
    "least-queue": "fewest waiting + running requests",
    "least-kv": "lowest KV-cache utilisation",
    "composite": "llm-d's default scoring: (3 x prefix-cache score + 2 x min-max-normalised queue score "
    "+ 2 x (1 - KV use)) / 7, highest wins (also the client's fallback score)",
    "slo-spread": "SLO headroom: among pods predicted to meet both SLOs, the most relative headroom "
    "(0.5 TTFT + 0.5 TPOT); if none, the least shortfall",
    "prefix-affinity": "pods with prefix-cache score >= 0.5 preferred unless their predicted TTFT "
    "exceeds the best pod's by more than max(50 ms, 25%); slo-spread among them; 5% exploration",
    RECOMMENDED: "`scheduler_client.default_policy()`: prefix affinity (score >= 0.8) gated by predicted "
    "TTFT (within max(50 ms, 25%) of the best pod), 5% exploration; among the pods kept, the lowest "
    "-P(meeting both SLOs) (its share of the expected attainment, from the p90 predictions, assumed "
    "log-normal) + harm weight x the requests on the pod x (the prompt tokens it must prefill there + "
    "decode-equivalent tokens for its own decode steps) / 1000 (the physics placement cost to the others; "
    "no extra rows) + cache weight x the uncached share of the prompt + TTFT cost x its predicted TTFT in "
    "seconds + prefill cost x the prompt tokens the pod must prefill before its first token / 1000; the "
    "objective and weights are chosen on the validation seeds, below",
    "slo-spread+admission": "slo-spread; a sheddable request is rejected when every pod's predicted TTFT "
    "or TPOT exceeds its SLO by more than 25%",
    RECOMMENDED_ADMISSION: "`default_policy(admission=True)`: the recommended policy with an admission "
    "test for sheddable requests, chosen on the validation seeds (below) between the harm test (rejected "
    "when on every pod its chance of meeting its SLO is smaller than the admission harm weight x the "
    "physics harm of placing it there) and the SLO test (rejected when every pod's predicted TTFT or "
    "TPOT exceeds its SLO x (1 + slack))",
}


@dataclass(frozen=True)
class Load:
    name: str
    offered_rps: float  # realised mean arrival rate (see Scenario.offered_rps)
    burstiness: float


@dataclass(frozen=True)
class Mix:
    """A request mix (``WorkloadConfig`` overrides) and the loads it is evaluated at."""

    name: str
    description: str
    overrides: dict[str, Any]
    loads: tuple[Load, ...]


MIXES = (
    Mix(
        "chat",
        "the simulator's default mix: prompts median 700 tokens (lognormal, sigma 1), outputs median "
        "120; 64 prompt families (Zipf 1.1) with ~600-token shared prefixes, which all fit in every "
        "pod's prefix cache",
        {},
        (
            Load("low", 50.0, 0.3),
            Load("medium", 75.0, 0.3),
            Load("high", 90.0, 0.3),
            Load("bursty near-saturation", 90.0, 0.6),
        ),
    ),
    Mix(
        "prefix-heavy",
        "long shared prefixes (RAG, agents, long system prompts): prompts median 2000 tokens "
        "(sigma 0.6), 256 families (Zipf 1.0) with ~1500-token prefixes shared by 90% of requests; "
        "the families' prefixes add up to ~8x one pod's prefix cache",
        {
            "num_families": 256,
            "family_zipf_s": 1.0,
            "family_prefix_median_tokens": 1500.0,
            "prompt_median_tokens": 2000.0,
            "prompt_sigma": 0.6,
            "shared_prefix_prob": 0.9,
        },
        (
            Load("low", 20.0, 0.3),
            Load("medium", 30.0, 0.3),
            Load("high", 40.0, 0.3),
            Load("bursty near-saturation", 40.0, 0.6),
        ),
    ),
)
HARD_LOADS = ("high", "near-saturation")  # the loads named by their ends, where the targets of #10 apply
NOMINAL_RPS = 100.0  # each stream is generated at this rate, then scaled to each load


def scenario_named(name: str, seed: int, num_requests: int) -> Scenario:
    """The scenario ``name`` (e.g. "chat / high") of ``scenarios(seed, num_requests)``."""
    (chosen,) = [s for s in scenarios(seed, num_requests) if s.name == name]
    return chosen


def scenarios(seed: int, num_requests: int, mixes: Sequence[Mix] = MIXES) -> list[Scenario]:
    """One scenario per (mix, load); the loads of a mix with the same burstiness share one sequence."""
    out = []
    for mix in mixes:
        for load in mix.loads:
            base = workload_config(
                NOMINAL_RPS, burstiness=load.burstiness, seed=seed, num_requests=num_requests
            )
            out.append(
                Scenario(
                    f"{mix.name} / {load.name}",
                    dataclasses.replace(base, **mix.overrides),
                    cluster_seed=seed,
                    offered_rps=load.offered_rps,
                )
            )
    return out
