"""The routing policy we recommend: ``default_policy(seed=0)``.

    PrefixAffinity(PlacementCost(objective="expected", harm="physics", harm_weight=HARM_WEIGHT,
                                 cache_weight=CACHE_WEIGHT, ttft_cost_per_s=TTFT_COST_PER_S,
                                 decode_equivalent_tokens=DECODE_EQUIVALENT_TOKENS,
                                 prefill_cost_per_ktoken=PREFILL_COST_PER_KTOKEN),
                   threshold=0.8, ttft_margin_ms=50, ttft_margin_frac=0.25, epsilon=0.05)

Prefix-cache affinity (llm-d's affinity filter, threshold 0.80) gated by predicted TTFT, with
5% exploration; among the pods it keeps, the cost of a pod is

    -P(the request meets both its TTFT and TPOT SLO there)          (``odds``: from the p90)
    + HARM_WEIGHT x (requests on the pod)
                  x (prompt tokens it must prefill there + DECODE_EQUIVALENT_TOKENS) / 1000
    + CACHE_WEIGHT x the share of its prompt the pod must prefill
    + TTFT_COST_PER_S x its predicted TTFT there, in seconds
    + PREFILL_COST_PER_KTOKEN x (prompt tokens the pod must prefill before its first token) / 1000

(``placement``: the harm term is the work the placement adds, times the requests it slows
down: its uncached prompt, and its own decode steps counted as ``DECODE_EQUIVALENT_TOKENS`` prompt
tokens, so a request whose prompt a pod holds in its prefix cache still weighs the requests
decoding there; the last term is the prefill queue ahead of it, read from the row, which keeps that
decode term from sending requests behind the longest prefill queues in an overload burst. No term
needs extra prediction rows, so a decision stays one bulk call of one row per candidate). The own
term is the request's contribution to the expected SLO attainment (what the scheduler is judged
on), not ``-ln P``: the log paid a large price for a slightly better chance of
a request that will miss anyway; with ``-P`` such a request goes where it costs the others least
and, through the TTFT term, where it starts soonest (the TTFT tail).

With ``admission=True`` the policy is wrapped in an admission test for sheddable requests, by
``ADMISSION_RULE``: ``"harm"`` (``placement.HarmAdmission(harm_weight=ADMISSION_HARM_WEIGHT)``)
rejects one when on every pod its chance of meeting its SLO is smaller than the admission harm
weight x the physics harm of placing it there (the same harm as the cost's, with its decode term);
``"slo"`` (``Admission(slack_frac=ADMISSION_SLACK)``) rejects one no pod is predicted to serve
within its SLO times (1 + slack).

``OBJECTIVE``, ``HARM_WEIGHT``, ``CACHE_WEIGHT``, ``TTFT_COST_PER_S``, ``DECODE_EQUIVALENT_TOKENS``,
``PREFILL_COST_PER_KTOKEN``, ``ADMISSION_RULE``, ``ADMISSION_HARM_WEIGHT`` and ``ADMISSION_SLACK`` were
chosen on the routing benchmark's validation seeds only (never its evaluation seeds),
``DECODE_EQUIVALENT_TOKENS`` and ``PREFILL_COST_PER_KTOKEN`` also on the validation seeds of its second
setting (a model learnt online, slower pods, one SLO:
``bench.routing_online``); the evidence is in docs/benchmarks-routing.md.
"""

from __future__ import annotations

from typing import Literal, get_args

from scheduler_client.heuristics import Policy
from scheduler_client.placement import HarmAdmission, HarmKind, Objective, PlacementCost
from scheduler_client.policies import Admission, PrefixAffinity

__all__ = [
    "ADMISSION_HARM_WEIGHT",
    "ADMISSION_RULE",
    "ADMISSION_SLACK",
    "CACHE_WEIGHT",
    "DECODE_EQUIVALENT_TOKENS",
    "HARM_KIND",
    "HARM_WEIGHT",
    "OBJECTIVE",
    "PREFILL_COST_PER_KTOKEN",
    "TTFT_COST_PER_S",
    "AdmissionRule",
    "default_policy",
]

AdmissionRule = Literal["harm", "slo"]

# Chosen on the validation seeds (bench.routing_compare); see the module docstring.
OBJECTIVE: Objective = "expected"
HARM_KIND: HarmKind = "physics"
HARM_WEIGHT = 0.005
CACHE_WEIGHT = 0.15
TTFT_COST_PER_S = 0.25
DECODE_EQUIVALENT_TOKENS = 4000.0
PREFILL_COST_PER_KTOKEN = 0.04
ADMISSION_RULE: AdmissionRule = "harm"
ADMISSION_HARM_WEIGHT = 0.003
ADMISSION_SLACK = 0.0
AFFINITY_THRESHOLD = 0.8


def default_policy(
    seed: int = 0,
    *,
    admission: bool = False,
    harm_weight: float = HARM_WEIGHT,
    cache_weight: float = CACHE_WEIGHT,
    admission_rule: AdmissionRule = ADMISSION_RULE,
    admission_harm_weight: float = ADMISSION_HARM_WEIGHT,
    admission_slack: float = ADMISSION_SLACK,
    harm: HarmKind = HARM_KIND,
    objective: Objective = OBJECTIVE,
    ttft_cost_per_s: float = TTFT_COST_PER_S,
    decode_equivalent_tokens: float = DECODE_EQUIVALENT_TOKENS,
    prefill_cost_per_ktoken: float = PREFILL_COST_PER_KTOKEN,
    hopeless_chance: float = 0.0,
) -> Policy:
    """The recommended policy (see the module docstring); reproducible from ``seed``.

    ``hopeless_chance`` (``PlacementCost``'s; off in the recommended setting) is here for
    benchmarks of variants (``bench.routing_online``).
    """
    policy: Policy = PrefixAffinity(
        PlacementCost(
            harm_weight=harm_weight,
            cache_weight=cache_weight,
            objective=objective,
            harm=harm,
            ttft_cost_per_s=ttft_cost_per_s,
            decode_equivalent_tokens=decode_equivalent_tokens,
            prefill_cost_per_ktoken=prefill_cost_per_ktoken,
            hopeless_chance=hopeless_chance,
            seed=seed,
        ),
        threshold=AFFINITY_THRESHOLD,
        ttft_margin_ms=50.0,
        ttft_margin_frac=0.25,
        epsilon=0.05,
        seed=seed,
    )
    if not admission:
        return policy
    if admission_rule == "harm":
        return HarmAdmission(
            policy, harm_weight=admission_harm_weight, decode_equivalent_tokens=decode_equivalent_tokens
        )
    if admission_rule == "slo":
        return Admission(policy, slack_frac=admission_slack)
    raise ValueError(f"admission_rule must be one of {get_args(AdmissionRule)}")
