"""Routing policies' decisions on constructed candidates, predictions and requests."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from scheduler_client import (
    Admission,
    CompositeHeuristic,
    LeastKV,
    LeastQueue,
    LowestLatency,
    Picker,
    Prediction,
    PrefixAffinity,
    RandomPolicy,
    RoutingRequest,
    SloHeadroom,
    composite_scores,
)

NO_SLO = RoutingRequest()


def row(waiting: int = 0, running: int = 0, kv: float = 0.0, prefix: float = 0.0) -> dict[str, Any]:
    return {
        "kv_cache_percentage": kv,
        "input_token_length": 1000,
        "num_request_waiting": waiting,
        "num_request_running": running,
        "num_tokens_generated": 1,
        "prefix_cache_score": prefix,
    }


def preds(*pairs: tuple[float, float]) -> list[Prediction]:
    return [Prediction(ttft, tpot, "v1") for ttft, tpot in pairs]


IDLE = [row(), row(), row()]


# -- heuristics ----------------------------------------------------------------------------------


def test_least_queue_counts_waiting_and_running() -> None:
    rows = [row(waiting=2, running=1), row(waiting=0, running=2), row(waiting=1, running=3)]
    assert LeastQueue().choose(NO_SLO, rows).pod == 1


def test_least_kv_picks_the_emptiest_cache() -> None:
    rows = [row(kv=0.5), row(kv=0.7), row(kv=0.2)]
    decision = LeastKV().choose(NO_SLO, rows)
    assert decision.pod == 2 and not decision.used_predictions


def test_composite_trades_prefix_against_queue_and_kv() -> None:
    # Weights 3/2/2: a full prefix hit outweighs the worst queue in the pool ...
    rows = [row(waiting=4, kv=0.5, prefix=1.0), row(waiting=0, kv=0.5, prefix=0.0)]
    assert CompositeHeuristic().choose(NO_SLO, rows).pod == 0
    # ... but a small hit does not.
    rows = [row(waiting=4, kv=0.5, prefix=0.3), row(waiting=0, kv=0.5, prefix=0.0)]
    assert CompositeHeuristic().choose(NO_SLO, rows).pod == 1
    scores = composite_scores([row(waiting=4, kv=0.5, prefix=1.0), row(kv=0.0)])
    assert scores == pytest.approx([(3 * 1.0 + 2 * 0.0 + 2 * 0.5) / 7, (0 + 2 * 1.0 + 2 * 1.0) / 7])


def test_ties_are_broken_at_random_but_reproducibly() -> None:
    policy_a, policy_b = LeastQueue(seed=3), LeastQueue(seed=3)
    seq_a = [policy_a.choose(NO_SLO, IDLE).pod for _ in range(50)]
    seq_b = [policy_b.choose(NO_SLO, IDLE).pod for _ in range(50)]
    assert seq_a == seq_b and set(seq_a) == {0, 1, 2}
    uniform = RandomPolicy(seed=1)
    randoms = Counter(uniform.choose(NO_SLO, [row(waiting=9), row()]).pod for _ in range(1000))
    assert 400 < randoms[0] < 600


# -- lowest predicted latency ----------------------------------------------------------------------


def test_lowest_latency_uses_predictions_not_queue_depth() -> None:
    rows = [row(waiting=0), row(waiting=5), row(waiting=1)]
    p = preds((300, 20), (80, 20), (120, 20))
    decision = LowestLatency().choose(NO_SLO, rows, p)
    assert decision.pod == 1 and decision.used_predictions


def test_lowest_latency_tpot_weight_counts_the_decode() -> None:
    p = preds((100, 40), (150, 20))
    assert LowestLatency(tpot_weight=0).choose(NO_SLO, IDLE[:2], p).pod == 0
    assert LowestLatency(tpot_weight=10).choose(NO_SLO, IDLE[:2], p).pod == 1  # 500 vs 350


def test_predicted_policies_fall_back_to_the_composite_score_without_predictions() -> None:
    rows = [row(waiting=3, kv=0.6), row(waiting=0, kv=0.1), row(waiting=1, kv=0.3)]
    for policy in (LowestLatency(), SloHeadroom("pack"), PrefixAffinity(epsilon=0)):
        decision = policy.choose(RoutingRequest(500, 50), rows, None)
        assert decision.pod == 1 and not decision.used_predictions
        assert decision.reason.startswith("fallback")


def test_prediction_count_must_match_candidates() -> None:
    with pytest.raises(ValueError, match="2 predictions for 3 candidates"):
        LowestLatency().choose(NO_SLO, IDLE, preds((1, 1), (2, 2)))


# -- SLO headroom ----------------------------------------------------------------------------------

SLO = RoutingRequest(ttft_slo_ms=500, tpot_slo_ms=50)
# ttft headroom 0.8/0.4/-0.2 of the SLO; tpot headroom 0.6/0.2/0.6
SLO_PREDS = preds((100, 20), (300, 40), (600, 20))


def test_pack_takes_the_least_positive_headroom_and_spread_the_most() -> None:
    assert SloHeadroom("pack").choose(SLO, IDLE, SLO_PREDS).pod == 1
    assert SloHeadroom("spread").choose(SLO, IDLE, SLO_PREDS).pod == 0


def test_pods_missing_either_slo_are_excluded_while_some_pod_meets_both() -> None:
    # Pod 0 has the most TTFT headroom but breaks the TPOT SLO.
    p = preds((50, 60), (400, 45), (450, 49))
    assert SloHeadroom("spread").choose(SLO, IDLE, p).pod == 1
    assert SloHeadroom("pack").choose(SLO, IDLE, p).pod == 2


def test_when_no_pod_meets_the_slo_the_least_negative_headroom_wins() -> None:
    p = preds((900, 45), (550, 55), (700, 40))  # shortfalls 0.8/2, (0.1+0.1)/2, 0.4/2
    for strategy in ("pack", "spread"):
        decision = SloHeadroom(strategy).choose(SLO, IDLE, p)
        assert decision.pod == 1 and "no pod meets" in decision.reason


def test_headroom_weights_decide_between_ttft_and_tpot() -> None:
    p = preds((100, 45), (400, 10))  # pod 0: ttft-rich, pod 1: tpot-rich
    assert SloHeadroom("spread", ttft_weight=1, tpot_weight=0).choose(SLO, IDLE[:2], p).pod == 0
    assert SloHeadroom("spread", ttft_weight=0, tpot_weight=1).choose(SLO, IDLE[:2], p).pod == 1


def test_margin_requires_headroom_not_just_meeting() -> None:
    p = preds((480, 20), (100, 49))
    # With a 10% margin pod 0 (96% of the TTFT SLO) no longer counts as meeting; pod 1 neither.
    assert SloHeadroom("pack").choose(SLO, IDLE[:2], p).pod == 0
    decision = SloHeadroom("pack", margin_frac=0.1).choose(SLO, IDLE[:2], p)
    assert "no pod meets" in decision.reason


def test_a_ttft_only_slo_ignores_tpot_and_no_slo_routes_by_latency() -> None:
    p = preds((100, 500), (450, 5))
    assert SloHeadroom("spread").choose(RoutingRequest(ttft_slo_ms=500), IDLE[:2], p).pod == 0
    assert SloHeadroom("pack").choose(RoutingRequest(ttft_slo_ms=500), IDLE[:2], p).pod == 1
    assert SloHeadroom("pack").choose(NO_SLO, IDLE[:2], p).pod == 0


# -- prefix affinity -------------------------------------------------------------------------------


def test_prefix_affinity_prefers_warm_pods_within_the_margin() -> None:
    rows = [row(prefix=0.0), row(prefix=0.9), row(prefix=0.6)]
    p = preds((100, 20), (140, 20), (130, 20))
    policy = PrefixAffinity(threshold=0.5, ttft_margin_ms=50, epsilon=0)
    decision = policy.choose(NO_SLO, rows, p)
    assert decision.pod == 2 and decision.reason.startswith("prefix affinity")  # best TTFT of the warm


def test_prefix_affinity_gives_up_a_warm_pod_that_is_too_slow() -> None:
    rows = [row(prefix=0.0), row(prefix=0.9)]
    p = preds((100, 20), (400, 20))
    decision = PrefixAffinity(threshold=0.5, ttft_margin_ms=50, epsilon=0).choose(NO_SLO, rows, p)
    assert decision.pod == 0 and decision.reason.startswith("no prefix-affine pod")
    relative = PrefixAffinity(threshold=0.5, ttft_margin_ms=0, ttft_margin_frac=4.0, epsilon=0)
    assert relative.choose(NO_SLO, rows, p).pod == 1  # 400 <= 100 + 4 * 100


def test_prefix_affinity_explores_with_probability_epsilon() -> None:
    rows = [row(prefix=0.0), row(prefix=0.9)]
    p = preds((100, 20), (120, 20))
    policy = PrefixAffinity(threshold=0.5, ttft_margin_ms=50, epsilon=0.25, seed=5)
    picks = Counter(policy.choose(NO_SLO, rows, p).pod for _ in range(2000))
    assert 0.2 < picks[0] / 2000 < 0.3  # exploring picks the fastest pod, 0
    assert _replay(rows, p, seed=5) == _replay(rows, p, seed=5) != _replay(rows, p, seed=6)


def _replay(rows: list[dict[str, Any]], p: list[Prediction], seed: int) -> list[int | None]:
    policy = PrefixAffinity(threshold=0.5, ttft_margin_ms=50, epsilon=0.25, seed=seed)
    return [policy.choose(NO_SLO, rows, p).pod for _ in range(100)]


def test_prefix_affinity_over_slo_headroom_keeps_slo_filtering() -> None:
    rows = [row(prefix=0.0), row(prefix=0.9), row(prefix=0.8)]
    p = preds((100, 20), (120, 60), (130, 30))  # warm pod 1 breaks the TPOT SLO
    policy = PrefixAffinity(SloHeadroom("spread"), threshold=0.5, ttft_margin_ms=50, epsilon=0)
    assert policy.choose(SLO, rows, p).pod == 2


# -- admission -------------------------------------------------------------------------------------


def test_admission_sheds_only_sheddable_requests_no_pod_can_serve() -> None:
    policy = Admission(SloHeadroom("spread"))
    hopeless = preds((900, 45), (800, 55))
    shed = policy.choose(RoutingRequest(500, 50, sheddable=True), IDLE[:2], hopeless)
    assert shed.pod is None and not shed.admitted and shed.policy == "slo-spread+admission"
    kept = policy.choose(RoutingRequest(500, 50, sheddable=False), IDLE[:2], hopeless)
    assert kept.pod == 1  # least shortfall
    fine = policy.choose(RoutingRequest(500, 50, sheddable=True), IDLE[:2], preds((400, 45), (800, 55)))
    assert fine.pod == 0
    assert policy.choose(RoutingRequest(sheddable=True), IDLE[:2], hopeless).admitted  # no SLO
    assert policy.choose(RoutingRequest(500, 50, sheddable=True), IDLE[:2], None).admitted  # fallback
    assert policy.rejected == 1


# -- weighted-random final pick --------------------------------------------------------------------


def test_softmax_pick_favours_low_costs_in_proportion() -> None:
    picker = Picker(temperature=10.0, seed=1)
    costs = [0.0, 10.0, math.inf]
    counts = Counter(picker.pick(costs) for _ in range(20000))
    assert counts[2] == 0
    assert counts[0] / counts[1] == pytest.approx(math.e, rel=0.08)


def test_top_k_draws_uniformly_among_the_k_best() -> None:
    picker = Picker(top_k=2, seed=1)
    counts = Counter(picker.pick([5.0, 1.0, 2.0, 9.0]) for _ in range(4000))
    assert set(counts) == {1, 2} and abs(counts[1] - counts[2]) < 300


def test_picks_are_reproducible_from_the_seed_and_infinite_costs_are_never_picked() -> None:
    costs = [3.0, 1.0, 2.0, math.inf]
    p1, p2 = Picker(temperature=1.0, seed=9), Picker(temperature=1.0, seed=9)
    picks = [p1.pick(costs) for _ in range(200)]
    assert picks == [p2.pick(costs) for _ in range(200)] and 3 not in picks
    with pytest.raises(ValueError, match="no candidate"):
        Picker().pick([math.inf, math.nan])


def test_policy_with_a_softmax_picker_spreads_load_over_near_equal_pods() -> None:
    policy = LowestLatency(picker=Picker(temperature=20.0, seed=2))
    p = preds((100, 20), (105, 20), (400, 20))
    counts = Counter(policy.choose(NO_SLO, IDLE, p).pod for _ in range(1000))
    assert counts[0] > 300 and counts[1] > 300 and counts[2] < 5


def test_admission_slack_tolerates_predictions_somewhat_above_the_slo() -> None:
    near = preds((600, 45), (800, 55))  # best pod: TTFT 1.2x its SLO
    request = RoutingRequest(500, 50, sheddable=True)
    assert Admission(SloHeadroom("spread")).choose(request, IDLE[:2], near).pod is None
    assert Admission(SloHeadroom("spread"), slack_frac=0.25).choose(request, IDLE[:2], near).pod == 0
    far = preds((800, 45), (900, 55))  # 1.6x
    assert Admission(SloHeadroom("spread"), slack_frac=0.5).choose(request, IDLE[:2], far).pod is None


def test_a_negative_admission_slack_demands_headroom() -> None:
    within = preds((450, 45), (480, 48))  # both within the SLO, by 10% at best
    request = RoutingRequest(500, 50, sheddable=True)
    assert Admission(SloHeadroom("spread")).choose(request, IDLE[:2], within).pod == 0
    assert Admission(SloHeadroom("spread"), slack_frac=-0.1).choose(request, IDLE[:2], within).pod == 0
    assert Admission(SloHeadroom("spread"), slack_frac=-0.2).choose(request, IDLE[:2], within).pod is None
    with pytest.raises(ValueError):
        Admission(SloHeadroom("spread"), slack_frac=-1.0)


def test_sacrifice_sends_hopeless_requests_to_the_slowest_pod() -> None:
    policy = SloHeadroom("spread", sacrifice_slack_frac=0.25)
    hopeless = preds((900, 45), (2000, 55), (700, 40))  # every pod > 1.25x the TTFT SLO
    decision = policy.choose(SLO, IDLE, hopeless)
    assert (
        decision.pod == 1 and decision.reason.startswith("hopeless") and policy.name == "slo-spread+sacrifice"
    )
    close = preds((600, 45), (2000, 55), (700, 40))  # pod 0 within the slack: least shortfall
    assert policy.choose(SLO, IDLE, close).pod == 0
    assert policy.choose(SLO, IDLE, SLO_PREDS).pod == 0  # someone meets it: spread as usual
