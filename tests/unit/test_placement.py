"""PlacementCost: the predicted harm of a placement to a pod's running requests changes decisions.

The decisions here come from constructed predictions (the policy is a pure function of them);
``tests/e2e/test_placement_e2e.py`` checks the same against trained models and the simulator.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from scheduler_client import (
    Admission,
    HarmAdmission,
    PlacementCost,
    Prediction,
    PrefixAffinity,
    RoutingRequest,
    SloHeadroom,
    default_policy,
    with_request,
)
from scheduler_client.odds import Spreads, log_chance
from scheduler_client.placement import physics_harms, prefill_ahead
from scheduler_client.recommended import (
    ADMISSION_HARM_WEIGHT,
    ADMISSION_RULE,
    ADMISSION_SLACK,
    AFFINITY_THRESHOLD,
    CACHE_WEIGHT,
    DECODE_EQUIVALENT_TOKENS,
    HARM_KIND,
    HARM_WEIGHT,
    OBJECTIVE,
    PREFILL_COST_PER_KTOKEN,
    TTFT_COST_PER_S,
)
from stack.simulator import Cluster, Completion, PodConfig, SimRequest
from tests.harm_scene import LONG_PROMPT, harm_scene

INTERACTIVE = RoutingRequest(ttft_slo_ms=250.0, tpot_slo_ms=30.0)

BATCH = RoutingRequest(ttft_slo_ms=2000.0, tpot_slo_ms=60.0)


def row(running: int, waiting: int = 0, prefix: float = 0.0, prefill: int = 0) -> dict[str, Any]:
    return {
        "kv_cache_percentage": 0.2,
        "input_token_length": 3000,
        "num_request_waiting": waiting,
        "num_request_running": running,
        "num_tokens_generated": 1,
        "prefix_cache_score": prefix,
        "prefill_tokens_in_flight": prefill,
        "decode_tokens_in_flight": 1000 * running,
    }


def cached_prefix_scene(
    cached_pod: int, prompt_tokens: int, pods_of_background: list[int]
) -> tuple[Cluster, list[int]]:
    """Two jitter-free simulated pods; ``cached_pod`` holds family 7's 3000-token prefix, and one
    background request per entry of ``pods_of_background`` (``prompt_tokens`` long, 400 output
    tokens) is decoding on that pod at t = 1.5 s. Returns the cluster and the background ids."""
    cluster = Cluster([PodConfig(step_jitter_frac=0.0)] * 2, seed=0)
    prefix = SimRequest(0, 0.0, prompt_tokens=3100, output_tokens=2, family=7, prefix_tokens=3000)
    cluster.route(prefix, cached_pod)
    cluster.advance_to(1.0)  # the pod now caches family 7's prefix
    background = []
    for i, pod in enumerate(pods_of_background):
        req = SimRequest(
            1 + i, 1.0, prompt_tokens=prompt_tokens, output_tokens=400, family=100 + i, prefix_tokens=0
        )
        cluster.route(req, pod)
        background.append(req.request_id)
    cluster.advance_to(1.5)  # all decoding
    return cluster, background


def run_with(cluster: Cluster, new: SimRequest, pod: int) -> list[Completion]:
    """Every completion of a copy of ``cluster`` with ``new`` routed to ``pod`` (the simulator's answer
    to "what if it went there?"); ``cluster`` itself is untouched."""
    trial = copy.deepcopy(cluster)
    trial.route(new, pod)
    return trial.drain()


def test_with_request_adds_the_uncached_prompt_and_one_running_request() -> None:
    placed = with_request(row(running=4, prefix=0.25, prefill=500))
    assert placed["num_request_running"] == 5
    assert placed["prefill_tokens_in_flight"] == 500 + 2250  # 75% of 3000 uncached
    assert placed["decode_tokens_in_flight"] == 4000 + 3000
    minimal = {k: v for k, v in row(running=1).items() if not k.endswith("_in_flight")}
    assert with_request(minimal)["prefill_tokens_in_flight"] == 3000  # the optional fields default to 0


def test_harm_to_a_busy_pod_changes_the_decision() -> None:
    """Own headroom prefers the busy pod; the harm to its 40 decoding requests sends it elsewhere."""
    rows = [row(running=40), row(running=2, waiting=3, prefill=15000)]
    own = [Prediction(120.0, 18.0, "v"), Prediction(400.0, 20.0, "v")]
    placed = [Prediction(130.0, 19.5, "v"), Prediction(410.0, 21.0, "v")]
    assert SloHeadroom("spread").choose(BATCH, rows, own).pod == 0
    assert PlacementCost(harm_weight=0.0).choose(BATCH, rows, own, placed).pod == 0
    policy = PlacementCost(harm_weight=1.0)
    assert policy.harms(BATCH, rows, own, placed) == pytest.approx([1.5 * 40 / 60, 1.0 * 5 / 60])
    decision = policy.choose(BATCH, rows, own, placed)
    assert decision.pod == 1 and decision.used_predictions


def test_pods_missing_the_slo_stay_out_while_some_pod_meets_it() -> None:
    rows = [row(running=1), row(running=60)]
    own = [Prediction(2500.0, 10.0), Prediction(300.0, 30.0)]  # pod 0 misses the TTFT SLO
    placed = [Prediction(2500.0, 10.0), Prediction(300.0, 40.0)]  # ... and pod 1 would be harmed
    assert PlacementCost(harm_weight=10.0).choose(BATCH, rows, own, placed).pod == 1


def test_extra_rows_are_one_per_candidate_and_none_without_the_harm_term() -> None:
    rows = [row(running=3), row(running=5)]
    assert PlacementCost(1.0).extra_rows(BATCH, rows) == [with_request(r) for r in rows]
    assert PlacementCost(0.0).extra_rows(BATCH, rows) == []
    wrapped = Admission(PrefixAffinity(PlacementCost(1.0)))
    assert len(wrapped.extra_rows(BATCH, rows)) == 2


def test_without_predictions_it_falls_back_to_the_composite_score() -> None:
    rows = [row(running=10), row(running=0)]
    decision = PlacementCost(1.0).choose(BATCH, rows, None)
    assert decision.pod == 1 and not decision.used_predictions and "fallback" in decision.reason


def test_a_prediction_at_the_slo_is_a_chance_of_the_predicted_quantile() -> None:
    at_slo = Prediction(250.0, 30.0)
    assert math.exp(log_chance(RoutingRequest(ttft_slo_ms=250.0), at_slo)) == pytest.approx(0.9)
    assert math.exp(log_chance(INTERACTIVE, at_slo)) == pytest.approx(0.81)  # both: the product
    assert math.exp(log_chance(INTERACTIVE, at_slo, Spreads(quantile=0.5))) == pytest.approx(0.25)
    assert log_chance(RoutingRequest(), at_slo) == 0.0
    better, worse = Prediction(100.0, 20.0), Prediction(400.0, 45.0)
    assert log_chance(INTERACTIVE, better) > log_chance(INTERACTIVE, at_slo) > log_chance(INTERACTIVE, worse)
    assert math.isfinite(log_chance(INTERACTIVE, Prediction(1e6, 1e4)))  # hopeless, still ranked


def test_the_chance_objective_ranks_by_the_binding_slo() -> None:
    """Headroom averages a wide TTFT margin with a thin TPOT one; the chance sees the TPOT risk."""
    rows = [row(running=2), row(running=2)]
    own = [Prediction(40.0, 29.0), Prediction(180.0, 22.0)]  # pod 0: TTFT far below, TPOT at the edge
    assert PlacementCost(0.0).choose(INTERACTIVE, rows, own).pod == 0
    assert PlacementCost(0.0, objective="chance").choose(INTERACTIVE, rows, own).pod == 1


def test_the_cache_term_keeps_a_request_where_its_prefix_is() -> None:
    """Own latency alone barely prefers the cached pod; the prefill work it saves decides."""
    rows = [row(running=4, prefix=0.0), row(running=4, prefix=0.75)]
    own = [Prediction(150.0, 24.0), Prediction(160.0, 24.0)]  # the cold pod answers a bit sooner
    assert PlacementCost(0.0, objective="chance").choose(INTERACTIVE, rows, own).pod == 0
    assert PlacementCost(0.0, objective="chance", cache_weight=1.0).choose(INTERACTIVE, rows, own).pod == 1
    with pytest.raises(ValueError):
        PlacementCost(0.0, cache_weight=-1.0)
    with pytest.raises(ValueError):
        PlacementCost(0.0, objective="median")  # type: ignore[arg-type]


def test_default_policy_is_the_documented_shape() -> None:
    policy = default_policy(seed=3)
    assert isinstance(policy, PrefixAffinity) and policy.threshold == AFFINITY_THRESHOLD == 0.8
    assert policy.epsilon == 0.05 and policy.ttft_margin_ms == 50.0 and policy.ttft_margin_frac == 0.25
    assert isinstance(policy.base, PlacementCost) and policy.base.harm_weight == HARM_WEIGHT
    assert policy.base.harm == HARM_KIND == "physics"
    assert policy.base.objective == OBJECTIVE == "expected" and policy.base.cache_weight == CACHE_WEIGHT
    assert policy.base.decode_equivalent_tokens == DECODE_EQUIVALENT_TOKENS > 0
    assert policy.base.prefill_cost_per_ktoken == PREFILL_COST_PER_KTOKEN > 0
    assert policy.base.ttft_cost_per_s == TTFT_COST_PER_S > 0
    assert policy.extra_rows(BATCH, [row(running=1)]) == []  # the physics harm needs no extra rows
    assert default_policy(harm="tpot", harm_weight=1.0).extra_rows(BATCH, [row(running=1)]) != []
    shedding = default_policy(admission=True)
    assert isinstance(shedding, Admission) and isinstance(shedding.inner, PrefixAffinity)
    # Reproducible from the seed: the same draws give the same decisions.
    rows = [row(running=2, prefix=0.9), row(running=2, prefix=0.9), row(running=2)]
    own = [Prediction(100.0, 20.0)] * 3
    first = [default_policy(seed=5).choose(BATCH, rows, own, own).pod for _ in range(1)]
    assert first == [default_policy(seed=5).choose(BATCH, rows, own, own).pod]


def test_expected_attainment_lets_a_request_that_will_miss_anyway_spare_the_others() -> None:
    """An interactive request misses its TPOT objective on both pods (the one with fewer requests
    gives it a slightly better, still tiny, chance). ``-ln P`` pays for that chance and piles its
    uncached prefill onto the pod with 12 requests decoding; ``-P`` sees no difference worth paying
    for and the physics harm sends it to the pod with 5. Where the chance is real, both agree."""
    rows = [row(running=12), row(running=5)]
    hopeless = [Prediction(120.0, 90.0), Prediction(120.0, 120.0)]  # TPOT SLO 30 ms: P ~ 9e-3, 4e-4
    assert log_chance(INTERACTIVE, hopeless[0]) > log_chance(INTERACTIVE, hopeless[1]) + 2.0
    chance = PlacementCost(0.005, objective="chance", harm="physics")
    expected = PlacementCost(0.005, objective="expected", harm="physics")
    assert chance.choose(INTERACTIVE, rows, hopeless).pod == 0
    assert expected.choose(INTERACTIVE, rows, hopeless).pod == 1
    likely = [Prediction(120.0, 20.0), Prediction(120.0, 45.0)]  # P ~ 0.99 against ~ 0.47
    assert chance.choose(INTERACTIVE, rows, likely).pod == expected.choose(INTERACTIVE, rows, likely).pod == 0
    # The TTFT cost keeps a request that misses everywhere off the pod where it would wait longest.
    slow_start = [Prediction(3000.0, 60.0), Prediction(400.0, 150.0)]  # P ~ 2e-5 and 1e-5
    untimed = PlacementCost(0.0, objective="expected", harm="physics")
    assert untimed.choose(INTERACTIVE, rows, slow_start).pod == 0
    timed = PlacementCost(0.0, objective="expected", harm="physics", ttft_cost_per_s=0.35)
    assert timed.choose(INTERACTIVE, rows, slow_start).pod == 1
    with pytest.raises(ValueError):
        PlacementCost(0.0, ttft_cost_per_s=-1.0)


def test_a_request_no_pod_gives_a_chance_starts_soonest_with_hopeless_chance() -> None:
    """With a strong per-request term (the decode equivalent), the harm sends a request that misses
    on both pods behind the long queue of the pod with fewer requests; with ``hopeless_chance`` it
    goes where it starts soonest. A request with a real chance somewhere is not affected."""
    rows = [row(running=40), row(running=20, waiting=15)]
    hopeless = [Prediction(300.0, 90.0), Prediction(6000.0, 80.0)]  # TPOT SLO 30 ms: P < 1e-2 on both
    strong = PlacementCost(0.005, objective="expected", harm="physics", decode_equivalent_tokens=8000)
    assert strong.choose(INTERACTIVE, rows, hopeless).pod == 1
    guarded = PlacementCost(
        0.005, objective="expected", harm="physics", decode_equivalent_tokens=8000, hopeless_chance=0.05
    )
    decision = guarded.choose(INTERACTIVE, rows, hopeless)
    assert decision.pod == 0 and "soonest start" in decision.reason
    likely = [Prediction(300.0, 90.0), Prediction(200.0, 20.0)]  # a real chance on pod 1
    assert guarded.choose(INTERACTIVE, rows, likely).pod == strong.choose(INTERACTIVE, rows, likely).pod == 1
    with pytest.raises(ValueError):
        PlacementCost(0.0, hopeless_chance=1.0)


def test_the_readme_documents_default_policy_as_it_is() -> None:
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "`scheduler_client.default_policy(seed=0)` is the policy we recommend" in readme
    assert f"affinity (score >= {AFFINITY_THRESHOLD:.2f})" in readme
    assert f"plus harm weight {HARM_WEIGHT:g} x the requests on the pod x (the prompt tokens" in readme
    assert f"it must prefill there + {DECODE_EQUIVALENT_TOKENS:g} for its own decode steps) / 1000" in readme
    assert f"plus {PREFILL_COST_PER_KTOKEN:g} x the prompt tokens the pod must prefill before its" in readme
    assert HARM_WEIGHT > 0 and HARM_KIND == "physics"
    assert f"plus cache weight {CACHE_WEIGHT:g} x the share of the prompt" in readme
    assert f"plus {TTFT_COST_PER_S:g} x its predicted TTFT there in seconds" in readme
    assert "the lowest -P(meeting both the TTFT and the TPOT SLO)" in readme
    assert isinstance(default_policy().base, PlacementCost) and default_policy().base.objective == "expected"
    assert default_policy().extra_rows(BATCH, [row(running=1)]) == []  # no extra rows are sent
    policy = default_policy()
    assert isinstance(policy, PrefixAffinity) and policy.epsilon == 0.05 and "5% exploration" in readme
    assert policy.ttft_margin_ms == 50.0 and "within max(50 ms, 25%) of the best pod" in readme
    shedding = default_policy(admission=True)
    assert ADMISSION_RULE == "harm" and isinstance(shedding, HarmAdmission)
    assert shedding.harm_weight == ADMISSION_HARM_WEIGHT
    assert shedding.decode_equivalent_tokens == DECODE_EQUIVALENT_TOKENS
    assert f"smaller than {ADMISSION_HARM_WEIGHT:g} x that harm on every pod" in readme
    by_slo = default_policy(admission=True, admission_rule="slo")
    assert isinstance(by_slo, Admission) and by_slo.slack_frac == ADMISSION_SLACK
    with pytest.raises(ValueError, match="admission_rule"):
        default_policy(admission=True, admission_rule="never")  # type: ignore[arg-type]


def test_harm_admission_sheds_a_request_worth_less_than_what_it_costs_busy_pods() -> None:
    """Every pod holds 45 decoding requests and the request's p90 is within its SLO, so the SLO test
    admits it. Its chance of meeting the SLO (0.84) is worth less than the harm its 3000-token prefill
    and decode do to those requests (0.003 x 315): the harm test sheds it. With a pod of 30 (harm
    0.003 x 210), or an idle one, or for a request that may not be shed, it is routed."""
    within = [Prediction(240.0, 29.0), Prediction(240.0, 29.0)]
    chance = math.exp(log_chance(INTERACTIVE, within[0]))
    assert chance == pytest.approx(0.84, abs=0.005)
    crowded, busy = [row(running=45), row(running=45)], [row(running=45), row(running=30)]
    assert physics_harms(busy, 4000) == pytest.approx([315.0, 210.0])
    sheddable = RoutingRequest(250.0, 30.0, sheddable=True)
    policy = HarmAdmission(PlacementCost(0.0), harm_weight=0.003, decode_equivalent_tokens=4000)
    assert Admission(PlacementCost(0.0)).choose(sheddable, crowded, within).admitted
    shed = policy.choose(sheddable, crowded, within)
    assert shed.pod is None and "costs the others more" in shed.reason and policy.rejected == 1
    assert policy.choose(sheddable, busy, within).admitted
    assert policy.choose(INTERACTIVE, crowded, within).admitted  # not sheddable
    assert policy.choose(sheddable, crowded, None).admitted  # fallback: nothing is shed
    idle = [row(running=45), row(running=0)]
    hopeless = [Prediction(2000.0, 90.0), Prediction(2000.0, 90.0)]
    assert not Admission(PlacementCost(0.0)).choose(sheddable, idle, hopeless).admitted
    assert policy.choose(sheddable, idle, hopeless).admitted  # an idle pod has no harm
    assert policy.rejected == 1
    with pytest.raises(ValueError):
        HarmAdmission(PlacementCost(0.0), harm_weight=0.0)


def test_the_cache_term_picks_the_pod_the_simulator_says_costs_the_others_less() -> None:
    """Two simulated pods decode the same background requests; pod 1 holds the new request's
    prefix. Own predictions tie (pod 0 even a little ahead), so own chance alone takes pod 0;
    the simulator, run both ways, says the uncached prefill on pod 0 lengthens the others'
    decode steps more. The recommended cache term sees that and takes pod 1."""
    cluster, background = cached_prefix_scene(1, 300, [i % 2 for i in range(40)])
    new = SimRequest(99, 1.5, prompt_tokens=4000, output_tokens=50, family=7, prefix_tokens=3000)
    rows = cluster.candidate_rows(new)
    assert rows[1]["prefix_cache_score"] == pytest.approx(0.75) and rows[0]["prefix_cache_score"] == 0

    def others_tpot(pod: int) -> float:
        return sum(c.tpot_ms for c in run_with(cluster, new, pod) if c.request.request_id in background)

    assert others_tpot(0) > others_tpot(1)  # the simulator: the cached pod costs the others less
    own = [Prediction(150.0, 26.0), Prediction(152.0, 26.0)]
    request = RoutingRequest(ttft_slo_ms=600.0, tpot_slo_ms=40.0)
    assert PlacementCost(0.0, objective="chance").choose(request, rows, own).pod == 0
    recommended = PlacementCost(0.0, objective="chance", cache_weight=CACHE_WEIGHT)
    assert recommended.choose(request, rows, own).pod == 1


def test_the_physics_harm_is_the_work_added_times_the_requests_slowed_down() -> None:
    rows = [row(running=0), row(running=10, waiting=2, prefix=0.5), row(running=3)]
    own = [Prediction(100.0, 20.0)] * 3
    policy = PlacementCost(1.0, harm="physics")
    assert policy.extra_rows(BATCH, rows) == []  # from the rows alone: no extra prediction rows
    assert policy.harms(BATCH, rows, own, []) == pytest.approx([0.0, 12 * 1.5, 3 * 3.0])
    assert PlacementCost(1.0, harm="physics", decode_equivalent_tokens=1000).harms(
        BATCH, rows, own, []
    ) == pytest.approx([0.0, 12 * 2.5, 3 * 4.0])
    with pytest.raises(ValueError):
        PlacementCost(1.0, harm="misses")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PlacementCost(1.0, harm="physics", decode_equivalent_tokens=-1.0)


def test_the_recommended_harm_term_takes_the_pod_the_simulator_says_costs_the_others_less() -> None:
    """Pod 0 decodes 20 requests; pod 1 decodes 2 and has 3 long prompts queued. The new long
    prompt would get its first token sooner on pod 0, so its own chance alone takes pod 0; the
    simulator, run both ways, says its prefill there costs the requests already on the pods more
    TPOT. ``default_policy``'s harm term sees that from the rows alone and takes pod 1."""
    cluster, new = harm_scene(), LONG_PROMPT
    rows = cluster.candidate_rows(new)

    def others_tpot(pod: int) -> float:
        return sum(c.tpot_ms for c in run_with(cluster, new, pod) if c.request.request_id != new.request_id)

    assert others_tpot(0) > others_tpot(1)  # the simulator: pod 1 costs the others less
    request = RoutingRequest(ttft_slo_ms=1000.0, tpot_slo_ms=60.0)
    own = [Prediction(150.0, 22.0), Prediction(700.0, 22.0)]  # pod 0 serves it sooner
    assert default_policy(harm_weight=0.0).choose(request, rows, own).pod == 0
    assert default_policy().choose(request, rows, own).pod == 1


def test_the_decode_term_takes_a_cached_request_off_a_pod_full_of_decodes_as_the_simulator_says() -> None:
    """Pod 0 holds the new request's prefix and decodes 30 requests; pod 1 decodes 4. Without the
    decode term the physics harm of a cached prompt on pod 0 is almost nothing however many requests
    decode there, so it goes to pod 0; the simulator, run both ways, says the others' decode steps
    (and its own) are longer there. The recommended decode term sees that and takes pod 1."""
    cluster, background = cached_prefix_scene(0, 700, [0] * 30 + [1] * 4)
    new = SimRequest(99, 1.5, prompt_tokens=3100, output_tokens=200, family=7, prefix_tokens=3000)
    rows = cluster.candidate_rows(new)
    assert rows[0]["prefix_cache_score"] > 0.9 and rows[1]["prefix_cache_score"] == 0

    def outcome(pod: int) -> tuple[float, float]:
        done = run_with(cluster, new, pod)
        others = sum(c.tpot_ms for c in done if c.request.request_id in background)
        (own,) = [c.tpot_ms for c in done if c.request.request_id == new.request_id]
        return others, own

    assert outcome(0)[0] > outcome(1)[0] and outcome(0)[1] > outcome(1)[1]
    own = [Prediction(150.0, 40.0)] * 2  # the same chance on both pods: the other terms decide
    request = RoutingRequest(ttft_slo_ms=2000.0, tpot_slo_ms=100.0)
    # The placement cost alone (default_policy's affinity filter would keep only the cached pod).
    without = default_policy(decode_equivalent_tokens=0.0).base
    assert without.choose(request, rows, own).pod == 0
    recommended = default_policy().base
    assert recommended.decode_equivalent_tokens == DECODE_EQUIVALENT_TOKENS
    assert recommended.choose(request, rows, own).pod == 1


def test_the_prefill_cost_keeps_a_hopeless_request_out_of_the_longest_prefill_queue() -> None:
    """An overload burst: no pod gives the request a chance, so the own term is flat. Pod 0 has two
    requests and three 8000-token prompts queued; pod 1 decodes 12 requests. Counting requests, the
    decode term sends it behind pod 0's queue; the simulator says it starts far later there. The
    recommended prefill cost, the tokens ahead of it, takes pod 1."""
    cluster = Cluster([PodConfig(step_jitter_frac=0.0)] * 2, seed=0)
    for i in range(14):
        req = SimRequest(i, 0.0, prompt_tokens=700, output_tokens=400, family=100 + i, prefix_tokens=0)
        cluster.route(req, 0 if i < 2 else 1)
    cluster.advance_to(1.0)  # all decoding
    for i in range(3):
        cluster.route(
            SimRequest(20 + i, 1.0, prompt_tokens=8000, output_tokens=50, family=200 + i, prefix_tokens=0), 0
        )
    new = SimRequest(99, 1.0, prompt_tokens=2000, output_tokens=100, family=7, prefix_tokens=0)
    rows = cluster.candidate_rows(new)
    assert rows[0]["prefill_tokens_in_flight"] >= 20000 and rows[1]["prefill_tokens_in_flight"] == 0

    def ttft(pod: int) -> float:
        (own,) = [c.ttft_ms for c in run_with(cluster, new, pod) if c.request.request_id == new.request_id]
        return own

    assert ttft(0) > 2 * ttft(1)
    own = [Prediction(5000.0, 150.0)] * 2  # hopeless on both pods
    request = RoutingRequest(ttft_slo_ms=1000.0, tpot_slo_ms=50.0)
    assert default_policy(prefill_cost_per_ktoken=0.0).choose(request, rows, own).pod == 0
    recommended = default_policy()
    assert recommended.base.prefill_cost_per_ktoken == PREFILL_COST_PER_KTOKEN
    assert recommended.choose(request, rows, own).pod == 1
    assert prefill_ahead(rows[0]) == rows[0]["prefill_tokens_in_flight"] + 2000
    with pytest.raises(ValueError):
        PlacementCost(1.0, prefill_cost_per_ktoken=-0.1)
