"""The in-process simulator replay judges the pinball ratios with ``--naive``, beside unchanged figures."""

from __future__ import annotations

import argparse

import pytest

import training_server.live_scoring as live_scoring
from bench.accuracy_steps import scenarios
from bench.sim_calibration_replay import replay


def _args(naive: bool, history: bool = False) -> argparse.Namespace:
    return argparse.Namespace(
        speed=5.0,
        pickup_s=0.2,
        train_s=0.4,
        feedback="completion",
        send_predictions=False,
        naive=naive,
        history=history,
        decompose=None,
        quantile=0.9,
        overrides={},
    )


def test_the_naive_baseline_runs_beside_the_services_and_is_judged_where_it_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live_scoring, "time", live_scoring.time)  # replay() swaps in a simulated clock
    prompts = scenarios(warmup_s=60.0, after_s=30.0)[1]  # 90 simulated s, about 1,800 requests
    assert prompts.name == "prompts"
    with_naive = replay(prompts, 0, _args(naive=True))
    without = replay(prompts, 0, _args(naive=False))
    for model in ("ttft", "tpot"):
        overall = with_naive[model]["summary"]["overall"]
        # it answers from its first fit on (1,000 samples), so only part of the requests compare
        assert 0 < overall["compared"] < overall["samples"], overall
        ratio = overall["ours_pinball_compared_ms"] / overall["naive_pinball_ms"]
        assert overall["ratio"] == pytest.approx(ratio)
        assert "pinball / naive overall" in {c["target"] for c in with_naive[model]["checks"]}
        assert "ratio" not in without[model]["summary"]["overall"]
        assert not any("naive" in c["target"] for c in without[model]["checks"])
        # the services' figures are the same with the baseline beside them (a fixed training time)
        assert overall["coverage"] == without[model]["summary"]["overall"]["coverage"]
        assert overall["pinball_ms"] == without[model]["summary"]["overall"]["pinball_ms"]


def test_history_gives_both_predictors_an_earlier_replay_before_the_first_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live_scoring, "time", live_scoring.time)
    prompts = scenarios(warmup_s=60.0, after_s=30.0)[1]
    cold = replay(prompts, 0, _args(naive=True))
    warm = replay(prompts, 0, _args(naive=True, history=True))
    assert warm["retrains"]["published"] > 0
    for model in ("ttft", "tpot"):
        c, w = cold[model]["summary"]["overall"], warm[model]["summary"]["overall"]
        # cold, the prior answers until 500 (TPOT: 200) samples came; warm, a model trained on the
        # history answers from its first retrain on (3 simulated s), and the naive baseline from the start
        assert w["samples"] > c["samples"] + 300, (c["samples"], w["samples"])
        assert w["compared"] == w["samples"]
        assert c["compared"] < c["samples"]
