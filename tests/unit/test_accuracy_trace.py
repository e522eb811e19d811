"""Stage recovery of the real traces, the step-change scenarios and the naive baseline."""

from __future__ import annotations

import numpy as np
import pytest

from bench.accuracy_naive import SlidingWindowBaseline
from bench.accuracy_steps import scenarios, selected
from bench.accuracy_trace import recover_stages, trace_times

RATES = [1.0, 2.0, 4.0, 8.0, 16.0]
DURATIONS = [120.0] * 5


def test_stage_boundaries_are_found_at_the_queue_drains_not_only_where_the_rates_put_them() -> None:
    # expected by the rates (n=3100): 100, 300, 700, 1500; the true stages drain a little later
    true = [0, 130, 340, 760, 1620]
    n = 3100
    rng = np.random.default_rng(1)
    load = np.empty(n)
    bounds = [*true, n]
    for s in range(5):
        a, b = bounds[s], bounds[s + 1]
        load[a:b] = np.linspace(3, 3 + 40 * (s + 1), b - a) + rng.uniform(0, 2, b - a)  # builds, then drains
    assert recover_stages(load, RATES, DURATIONS) == true


def test_without_drains_boundaries_stay_near_the_rate_shares() -> None:
    starts = recover_stages(np.full(3100, 5.0), RATES, DURATIONS)
    assert starts[0] == 0
    for got, expected in zip(starts[1:], [100, 300, 700, 1500], strict=True):
        assert abs(got - expected) <= 0.4 * expected


def test_trace_times_spread_each_stage_over_its_duration() -> None:
    times, stage = trace_times(10, [0, 2, 7], [10.0, 20.0, 30.0])
    assert stage.tolist() == [0, 0, 1, 1, 1, 1, 1, 2, 2, 2]
    assert times.tolist()[:3] == [0.0, 5.0, 10.0]
    assert times[6] == pytest.approx(10 + 20 * 4 / 5)
    assert times[7] == pytest.approx(30.0) and np.all(np.diff(times) > 0)


def test_scenarios_change_at_the_stated_times_with_time_ordered_unique_requests() -> None:
    overload, prompts, slow = scenarios(60.0, 30.0)
    assert [(name, at) for name, at, _ in overload.steps()] == [("60 req/s", 60.0), ("20 req/s", 120.0)]
    assert overload.phase(10) == "0: steady" and overload.phase(61) == "1: 60 req/s"
    requests = list(overload.requests(seed=3))
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals) and len({r.request_id for r in requests}) == len(requests)
    rate = sum(1 for a in arrivals if 60 <= a < 120) / 60
    assert rate > 2 * sum(1 for a in arrivals if a < 60) / 60  # the overload is real
    late = [r.prompt_tokens for r in prompts.requests(seed=3) if r.arrival_s >= 60]
    early = [r.prompt_tokens for r in prompts.requests(seed=3) if r.arrival_s < 60]
    assert np.median(late) > 2 * np.median(early)
    cluster = slow.cluster(seed=3)
    for _, action in slow.events():
        action(cluster)
    assert all(pod.cfg.slowdown == 3.0 for pod in cluster.pods)


def test_the_overload_twice_comes_only_by_name_and_repeats_the_overload() -> None:
    assert [s.name for s in scenarios()] == ["overload", "prompts", "slow-pool"]
    (twice,) = selected(["overload-twice"], 60.0, 30.0)
    assert twice.duration_s == 60 + 60 + 90 + 60 + 30
    assert [(name, at) for name, at, _ in twice.steps()] == [
        ("60 req/s", 60.0),
        ("20 req/s", 120.0),
        ("60 req/s", 210.0),
        ("20 req/s", 270.0),
    ]
    assert twice.phase(215) == "3: 60 req/s"
    arrivals = np.array([r.arrival_s for r in twice.requests(seed=3)])
    first, second = ((arrivals >= a) & (arrivals < a + 60) for a in (60, 210))
    assert second.sum() > 0.8 * first.sum() and second.sum() > 2 * (arrivals < 60).sum()


def test_the_episodes_run_six_pods_through_four_overloads_of_their_own_heights_and_a_new_prompt_mix() -> None:
    (episodes,) = selected(["episodes"])
    assert episodes.pods == 6 and len(episodes.cluster(seed=1).pods) == 6
    steps = episodes.steps()
    assert [name for name, _, _ in steps[1::2]] == ["30 req/s"] + ["30 req/s, 15% long prompts"] * 3
    peaks = [(name, end - at) for name, at, end in steps[0::2]]
    assert peaks == [
        ("75 req/s", 45.0),
        ("90 req/s", 30.0),
        ("70 req/s, 15% long prompts", 60.0),
        ("85 req/s, 15% long prompts", 20.0),
    ]
    requests = list(episodes.requests(seed=1))
    arrivals = np.array([r.arrival_s for r in requests])
    for name, at, end in steps[0::2]:  # each overload is real: far above the calm rate
        assert ((arrivals >= at) & (arrivals < end)).sum() / (end - at) > 2 * (arrivals < 180).sum() / 180, (
            name
        )
    long = np.array([r.prompt_tokens > 4000 for r in requests])
    assert long[arrivals >= steps[2][1]].mean() > 3 * long[arrivals < steps[2][1]].mean()  # the new mix


def _entries(n: int, rng: np.random.Generator) -> list[dict[str, float]]:
    tokens = rng.integers(10, 2000, n)
    return [
        {
            "kv_cache_percentage": 0.1,
            "input_token_length": int(t),
            "num_request_waiting": 0,
            "num_request_running": 1,
            "num_tokens_generated": 0,
            "prefix_cache_score": 0.0,
            "actual_ttft_ms": float(t) * (1 + 0.2 * rng.random()),
            "actual_tpot_ms": 0.0,  # this stream carries TTFT only, as half the trace entries do
        }
        for t in tokens
    ]


def test_naive_baseline_answers_nothing_before_its_first_fit_then_a_p90_per_row() -> None:
    rng = np.random.default_rng(0)
    baseline = SlidingWindowBaseline(0.9, window=10_000, retrain_every=1_000, rounds=60)
    baseline.learn(_entries(999, rng))
    rows = [{k: v for k, v in e.items() if not k.startswith("actual_")} for e in _entries(500, rng)]
    assert np.isnan(baseline.predict(rows)["ttft"]).all() and baseline.fits == 0
    baseline.learn(_entries(1, rng))
    assert baseline.fits == 1
    guess = baseline.predict(rows)
    assert np.isnan(guess["tpot"]).all()  # no TPOT ever seen: still no model
    tokens = np.array([r["input_token_length"] for r in rows], float)
    ratio = guess["ttft"] / tokens  # actual is tokens * U(1, 1.2): its p90 is tokens * 1.18
    assert 1.1 < float(np.median(ratio)) < 1.25


def test_a_harness_runs_the_three_by_default_those_named_otherwise_and_refuses_an_unknown_name() -> None:
    assert [s.name for s in selected(None)] == ["overload", "prompts", "slow-pool"]
    assert [s.name for s in selected(["overload-twice", "prompts"])] == ["prompts", "overload-twice"]
    assert selected([]) == []  # the traces alone
    with pytest.raises(SystemExit, match="overlaod"):
        selected(["overlaod"])
