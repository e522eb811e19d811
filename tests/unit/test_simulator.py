"""Behaviour of the pod-pool simulator: determinism, latency physics, KV and prefix caching."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stack.simulator import (
    Cluster,
    Completion,
    PodConfig,
    SimRequest,
    Workload,
    WorkloadConfig,
    round_robin,
    simulate,
)

WIRE_FIELDS = {
    "kv_cache_percentage",
    "input_token_length",
    "num_request_waiting",
    "num_request_running",
    "num_tokens_generated",
    "prefix_cache_score",
    "pod_type",
    "prefill_tokens_in_flight",
    "decode_tokens_in_flight",
    "encoder_matched_size",
    "encoder_input_size",
}


def _req(
    rid: int, prompt: int, output: int = 50, family: int = 0, prefix: int = 0, at: float = 0.0
) -> SimRequest:
    return SimRequest(rid, at, prompt, output, family, prefix)


def _alone(req: SimRequest, cluster: Cluster | None = None) -> Completion:
    """Serve one request on an otherwise idle single pod."""
    cluster = cluster or Cluster(1)
    cluster.advance_to(max(cluster.now_s, req.arrival_s))
    cluster.route(req, 0)
    (done,) = cluster.drain()
    return done


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def test_same_seed_gives_identical_runs_and_another_seed_differs() -> None:
    def run(seed: int) -> list[tuple[int, int, float, float, float]]:
        wl = Workload(WorkloadConfig(rate_rps=30, num_requests=400, seed=seed))
        done = simulate(wl, Cluster(3, seed=seed), round_robin())
        return [(c.request.request_id, c.pod, c.ttft_ms, c.tpot_ms, c.finished_s) for c in done]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_workload_is_ordered_bounded_and_repeatable() -> None:
    cfg = WorkloadConfig(rate_rps=50, burstiness=0.8, num_requests=2000, seed=3)
    reqs = list(Workload(cfg))
    assert reqs == list(Workload(cfg))
    assert len(reqs) == 2000
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals == sorted(arrivals)
    assert all(cfg.prompt_min_tokens <= r.prompt_tokens <= cfg.prompt_max_tokens for r in reqs)
    assert all(cfg.output_min_tokens <= r.output_tokens <= cfg.output_max_tokens for r in reqs)
    assert all(0 <= r.prefix_tokens < r.prompt_tokens for r in reqs)
    assert 25 < len(reqs) / arrivals[-1] < 100  # mean rate near 50 rps despite the bursts
    timed = list(Workload(dataclasses.replace(cfg, num_requests=None, duration_s=5.0)))
    assert timed and timed[-1].arrival_s < 5.0


def test_request_limit_keeps_the_poisson_rate() -> None:
    # Regression: truncating the last segment used to spread its arrivals over the whole segment.
    for seed in (1, 2, 11):
        reqs = list(Workload(WorkloadConfig(rate_rps=20, burstiness=0.0, num_requests=5000, seed=seed)))
        assert len(reqs) / reqs[-1].arrival_s == pytest.approx(20, rel=0.06)


def test_idle_pod_ttft_grows_with_prompt_and_tpot_is_fast() -> None:
    done = [_alone(_req(i, prompt)) for i, prompt in enumerate([50, 500, 2000, 8000])]
    ttfts = [c.ttft_ms for c in done]
    assert ttfts == sorted(ttfts)
    assert 15 < ttfts[0] < 40 and 120 < ttfts[-1] < 300
    assert all(8 < c.tpot_ms < 15 for c in done)


def test_prefix_hit_lowers_ttft() -> None:
    cluster = Cluster(1)
    cold = _alone(_req(0, 4000, family=5, prefix=3000), cluster)
    warm = _alone(_req(1, 4000, family=5, prefix=3000, at=10.0), cluster)
    other = _alone(_req(2, 4000, family=6, prefix=3000, at=20.0), cluster)
    assert warm.features["prefix_cache_score"] == pytest.approx(0.75)
    assert warm.ttft_ms < 0.6 * cold.ttft_ms
    assert other.ttft_ms == pytest.approx(cold.ttft_ms, rel=0.15)


def test_prefix_score_is_zero_on_fresh_pod_and_positive_after_same_family() -> None:
    cluster = Cluster(2)
    req = _req(0, 1000, family=3, prefix=400)
    assert [row["prefix_cache_score"] for row in cluster.candidate_rows(req)] == [0.0, 0.0]
    cluster.route(req, 1)
    cluster.drain()
    rows = cluster.candidate_rows(_req(1, 800, family=3, prefix=400, at=cluster.now_s))
    assert rows[0]["prefix_cache_score"] == 0.0
    assert rows[1]["prefix_cache_score"] == pytest.approx(400 / 800)
    assert cluster.candidate_rows(_req(2, 800, family=4, prefix=400))[1]["prefix_cache_score"] == 0.0


def test_prefix_cache_is_lru_bounded() -> None:
    cluster = Cluster([PodConfig(prefix_cache_capacity_tokens=1000)])
    for fam in range(3):  # 3 x 400 tokens: family 0 is evicted
        _alone(_req(fam, 600, family=fam, prefix=400, at=float(fam)), cluster)
    scores = [
        cluster.candidate_rows(_req(9, 600, family=f, prefix=400))[0]["prefix_cache_score"] for f in range(3)
    ]
    assert scores[0] == 0.0 and scores[1] > 0 and scores[2] > 0


def test_load_raises_ttft_and_tpot_and_queue_builds_under_overload() -> None:
    def run(rate: float) -> list[Completion]:
        wl = Workload(WorkloadConfig(rate_rps=rate, burstiness=0.0, num_requests=600, seed=11))
        return simulate(wl, Cluster(1), round_robin())

    light, heavy = run(1.0), run(20.0)
    tpot = lambda done: [c.tpot_ms for c in done if c.tpot_ms > 0]  # noqa: E731
    assert _p([c.ttft_ms for c in heavy], 50) > 3 * _p([c.ttft_ms for c in light], 50)
    assert _p(tpot(heavy), 50) > 2 * _p(tpot(light), 50)
    waiting = [c.features["num_request_waiting"] for c in heavy]
    assert max(waiting) > 50
    assert np.mean(waiting[-100:]) > np.mean(waiting[:100])  # the queue keeps growing
    assert max(c.features["kv_cache_percentage"] for c in heavy) > 0.8


def test_kv_usage_stays_within_capacity_with_preemption() -> None:
    cfg = PodConfig(kv_capacity_tokens=12000)
    cluster = Cluster([cfg, cfg])
    wl = Workload(WorkloadConfig(rate_rps=40, num_requests=500, seed=5, prompt_max_tokens=4000))
    choose = round_robin()
    done: list[Completion] = []
    for req in wl:
        done += cluster.advance_to(req.arrival_s)
        for pod in cluster.pods:
            assert 0 <= pod.kv_used_tokens <= cfg.kv_capacity_tokens
        rows = cluster.candidate_rows(req)
        assert all(0.0 <= row["kv_cache_percentage"] <= 1.0 for row in rows)
        cluster.route(req, choose(req, rows))
    done += cluster.drain()
    assert len(done) == 500
    assert all(pod.peak_kv_used_tokens <= cfg.kv_capacity_tokens for pod in cluster.pods)
    assert sum(pod.num_preemptions for pod in cluster.pods) > 0  # decode growth did hit the wall
    assert all(pod.kv_used_tokens == 0 for pod in cluster.pods)


def test_request_that_can_never_fit_is_rejected() -> None:
    cluster = Cluster([PodConfig(kv_capacity_tokens=1000)])
    with pytest.raises(ValueError, match="KV cache"):
        cluster.route(_req(0, 900, output=200), 0)


def test_every_routed_request_completes_with_wire_rows() -> None:
    wl = Workload(WorkloadConfig(rate_rps=60, num_requests=800, seed=2, output_min_tokens=1))
    cluster = Cluster([PodConfig(), PodConfig(slowdown=1.5), PodConfig()], seed=2)
    done = simulate(wl, cluster, round_robin())
    assert sorted(c.request.request_id for c in done) == list(range(800))
    assert [c.finished_s for c in done] == sorted(c.finished_s for c in done)
    for c in done:
        assert set(c.features) == WIRE_FIELDS
        assert c.features["num_tokens_generated"] == 1
        assert c.features["input_token_length"] == c.request.prompt_tokens
        assert c.features["pod_type"] == ""
        assert c.ttft_ms > 0 and c.finished_s >= c.routed_at_s
        assert (c.tpot_ms == 0.0) == (c.request.output_tokens == 1)
    rows = cluster.candidate_rows(_req(999, 100, at=cluster.now_s))
    assert all(r["num_request_waiting"] == r["num_request_running"] == 0 for r in rows)
    assert all(r["prefill_tokens_in_flight"] == r["decode_tokens_in_flight"] == 0 for r in rows)


def test_in_flight_features_reflect_queued_work() -> None:
    cluster = Cluster(1)
    cluster.route(_req(0, 3000, output=100), 0)
    cluster.route(_req(1, 1000, output=100), 0)
    row = cluster.candidate_rows(_req(2, 10))[0]
    assert row["num_request_waiting"] == 2 and row["prefill_tokens_in_flight"] == 4000
    cluster.advance_to(0.5)  # both prefilled, both decoding
    row = cluster.candidate_rows(_req(2, 10))[0]
    assert row["num_request_running"] == 2 and row["prefill_tokens_in_flight"] == 0
    assert row["decode_tokens_in_flight"] > 4000
    assert 0.0 < row["kv_cache_percentage"] < 0.1


def test_one_pod_has_worse_p90_ttft_than_round_robin_over_four() -> None:
    cfg = WorkloadConfig(rate_rps=12, num_requests=600, seed=4)
    single = simulate(Workload(cfg), Cluster(4), lambda req, rows: 0)
    spread = simulate(Workload(cfg), Cluster(4), round_robin())
    assert {c.pod for c in spread} == {0, 1, 2, 3}
    assert _p([c.ttft_ms for c in single], 90) > 2 * _p([c.ttft_ms for c in spread], 90)


def test_time_cannot_go_backwards() -> None:
    cluster = Cluster(1)
    cluster.advance_to(1.0)
    with pytest.raises(ValueError):
        cluster.advance_to(0.5)


def _residents_tpot(extra_prompt_tokens: list[int]) -> float:
    """Mean TPOT of 20 decoding requests when prompts of these sizes arrive while they decode."""
    cluster = Cluster([PodConfig(step_jitter_frac=0.0)])
    for i in range(20):
        cluster.route(_req(i, prompt=100, output=400), 0)
    cluster.advance_to(0.5)  # all 20 are decoding by now
    for j, tokens in enumerate(extra_prompt_tokens):
        cluster.route(_req(100 + j, prompt=tokens, output=2, at=0.5), 0)
    done = cluster.drain()
    return float(np.mean([c.tpot_ms for c in done if c.request.request_id < 20]))


def test_a_prefill_lengthens_every_co_scheduled_decode_step_in_proportion_to_its_tokens() -> None:
    """Chunked prefill: the decoders' TPOT grows by prefill_ms_per_token * tokens over their outputs."""
    alone = _residents_tpot([])
    one = _residents_tpot([8000]) - alone
    two = _residents_tpot([8000, 8000]) - alone
    expected = PodConfig().prefill_ms_per_token * 8000 / 399  # spread over the 399 decode steps
    assert one == pytest.approx(expected, rel=0.3)
    assert two == pytest.approx(2 * one, rel=0.15)


def test_long_prompt_share_makes_a_bimodal_prompt_mix_and_leaves_the_default_stream_alone() -> None:
    base = WorkloadConfig(num_requests=4000, seed=5)
    plain = [r.prompt_tokens for r in Workload(base)]
    assert plain == [r.prompt_tokens for r in Workload(dataclasses.replace(base, long_prompt_share=0.0))]
    mixed = [r.prompt_tokens for r in Workload(dataclasses.replace(base, long_prompt_share=0.3))]
    long = np.array(mixed) > 3000
    assert 0.25 < long.mean() < 0.35  # the short mode rarely exceeds 3000 tokens (median 700)
    assert np.median(np.array(mixed)[long]) == pytest.approx(6000, rel=0.1)
    assert max(mixed) <= 12352
    with pytest.raises(ValueError):
        WorkloadConfig(long_prompt_share=1.5)


def test_first_tokens_are_reported_once_per_request_when_they_happen_and_change_nothing() -> None:
    """A streaming scheduler learns a TTFT at the first token: the cluster reports each request's
    first token once (with preemptions: only the first), no later than its completion and before
    the clock that passed it, and recording them leaves the completions bit-identical."""

    def run(record: bool) -> tuple[list[Completion], list, list[tuple[float, float]]]:
        cfg = PodConfig(kv_capacity_tokens=12000)
        cluster = Cluster([cfg, cfg], seed=5)
        if record:
            cluster.record_first_tokens()
        wl = Workload(WorkloadConfig(rate_rps=40, num_requests=500, seed=5, prompt_max_tokens=4000))
        choose = round_robin()
        done: list[Completion] = []
        firsts: list = []
        clocks: list[tuple[float, float]] = []
        for req in wl:
            done += cluster.advance_to(req.arrival_s)
            taken = cluster.take_first_tokens() if record else []
            clocks += [(f.at_s, cluster.now_s) for f in taken]
            firsts += taken
            cluster.route(req, choose(req, cluster.candidate_rows(req)))
        done += cluster.drain()
        firsts += cluster.take_first_tokens() if record else []
        return done, firsts, clocks

    plain, none, _ = run(False)
    done, firsts, clocks = run(True)
    assert none == []
    assert [(c.request.request_id, c.ttft_ms, c.tpot_ms, c.finished_s) for c in done] == [
        (c.request.request_id, c.ttft_ms, c.tpot_ms, c.finished_s) for c in plain
    ]
    assert sum(c.preemptions for c in done) > 0  # the once-only rule was exercised
    by_id = {f.request.request_id: f for f in firsts}
    assert len(by_id) == len(firsts) == len(done) == 500
    for c in done:
        f = by_id[c.request.request_id]
        assert (f.ttft_ms, f.routed_at_s, f.pod, f.features) == (c.ttft_ms, c.routed_at_s, c.pod, c.features)
        assert c.routed_at_s < f.at_s <= c.finished_s
    assert all(at <= now for at, now in clocks)
