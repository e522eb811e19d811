"""The accuracy ceiling's references: what they may know, and what the naive baseline may not."""

from __future__ import annotations

import numpy as np

from bench.accuracy_ceiling import arrivals_while_decoding, naive_online, pool_rate_before_routing
from stack.sim_pod import Completion
from stack.workload import SimRequest


def _done(
    k: int, pod: int, routed_s: float, ttft_ms: float, finished_s: float, prompt: int = 100
) -> Completion:
    row = {
        "kv_cache_percentage": 0.2,
        "input_token_length": prompt,
        "num_request_waiting": k % 3,
        "num_request_running": 4,
        "num_tokens_generated": 1,
        "prefix_cache_score": 0.0,
    }
    request = SimRequest(k, routed_s, prompt, 20, 0, 0)
    return Completion(request, pod, routed_s, row, ttft_ms, 5.0 + k % 7, finished_s)


def test_arrivals_while_decoding_count_only_the_same_pod_between_first_token_and_completion() -> None:
    done = [
        _done(0, 0, 0.0, 1000.0, 11.0),  # decodes from 1 s to 11 s
        _done(1, 0, 0.5, 10.0, 2.0, prompt=300),  # before its first token: not counted
        _done(2, 0, 2.0, 10.0, 3.0, prompt=400),
        _done(3, 0, 6.0, 10.0, 7.0, prompt=600),
        _done(4, 1, 6.0, 10.0, 7.0, prompt=5000),  # another pod
        _done(5, 0, 12.0, 10.0, 13.0, prompt=700),  # after it finished
    ]
    rates = arrivals_while_decoding(done)
    assert rates[0].tolist() == [2 / 10.0, (400 + 600) / 10.0]
    assert rates[4].tolist() == [0.0, 0.0]


def test_the_naive_baseline_answers_each_request_before_its_own_sample_and_only_after_its_first_fit() -> None:
    # One request every 0.1 s, each done 50 ms later: the 1,000th sample (routed at 99.9 s) is
    # learned at the flush of 100 s, after the requests routed since 99 s were answered.
    done = [_done(k, 0, 0.1 * k, 10.0 + k % 5, 0.1 * k + 0.05) for k in range(1_500)]
    answers = naive_online(done, 0.9)
    routed = np.array([c.routed_at_s for c in done])
    assert np.isnan(answers[routed < 99.95]).all()
    assert np.isfinite(answers[routed >= 100.0]).all()


def test_the_pool_rate_counts_every_pod_s_completions_before_routing_within_the_horizon() -> None:
    done = [
        _done(0, 0, 0.0, 10.0, 1.0),  # completed 9 s before request 4 was routed: too early
        _done(1, 1, 4.0, 10.0, 6.0),  # another pod: counted
        _done(2, 0, 5.0, 10.0, 9.5),
        _done(3, 0, 9.0, 10.0, 10.5),  # completes after request 4 was routed: not known then
        _done(4, 1, 10.0, 10.0, 12.0),
    ]
    rate = pool_rate_before_routing(done, horizon_s=5.0)
    assert rate.shape == (5, 1)
    assert rate[4, 0] == 2 / 5.0
    assert rate[0, 0] == 0.0
