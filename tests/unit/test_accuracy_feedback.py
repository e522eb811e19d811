"""What the accuracy replays post for a request, under each feedback protocol (``bench.accuracy_replay``)."""

from __future__ import annotations

import pytest

from bench.accuracy_replay import FEEDBACKS, STREAMING, ReplayConfig, completion_samples, first_token_sample
from stack.simulator import Cluster, Completion, FirstToken, PodConfig, Workload, WorkloadConfig, round_robin

PREDICTION = (120.0, 30.0, "000007-trained", {"ttft": "trained", "tpot": "trained"})


def _served_under_load() -> tuple[list[Completion], list[FirstToken]]:
    """500 requests at 60 per s on two small pods: queues build, so a request finishes under a load
    other than the one it was routed into."""
    cluster = Cluster([PodConfig(kv_capacity_tokens=12000)] * 2, seed=3)
    cluster.record_first_tokens()
    choose, done, firsts = round_robin(), [], []
    for req in Workload(WorkloadConfig(rate_rps=60, num_requests=500, seed=3, prompt_max_tokens=4000)):
        done += cluster.advance_to(req.arrival_s)
        firsts += cluster.take_first_tokens()
        cluster.route(req, choose(req, cluster.candidate_rows(req)))
    done += cluster.drain()
    return done, firsts + cluster.take_first_tokens()


def test_a_completion_reports_the_pods_load_when_it_finished() -> None:
    done, _ = _served_under_load()
    loads = [c.finished_load for c in done]
    assert all(load is not None for load in loads)
    assert loads[-1] == {"kv_cache_percentage": 0.0, "num_request_waiting": 0, "num_request_running": 0}
    # under load the pod's state at the end of a request is mostly not the one it was routed into
    moved = [c for c in done if c.finished_load["num_request_running"] != c.features["num_request_running"]]
    assert len(moved) > len(done) / 2
    assert all(0.0 <= load["kv_cache_percentage"] <= 1.0 for load in loads if load)


@pytest.mark.parametrize("feedback", FEEDBACKS)
def test_each_protocol_posts_each_latency_once_with_the_row_and_prediction_it_promises(feedback: str) -> None:
    done, firsts = _served_under_load()
    c = next(
        c
        for c in done
        if c.tpot_ms > 0
        and c.finished_load
        != {k: c.features[k] for k in ("kv_cache_percentage", "num_request_waiting", "num_request_running")}
    )
    f = next(f for f in firsts if f.request.request_id == c.request.request_id)
    cfg = ReplayConfig(feedback=feedback)  # type: ignore[arg-type]
    samples = completion_samples(c, PREDICTION, cfg)
    if feedback not in STREAMING:
        assert samples == [{**c.features, "actual_ttft_ms": c.ttft_ms, "actual_tpot_ms": c.tpot_ms}]
        sent = completion_samples(c, PREDICTION, ReplayConfig(feedback=feedback, send_predictions=True))  # type: ignore[arg-type]
        assert sent[0]["predicted_ttft_ms"] == 120.0 and sent[0]["predicted_tpot_ms"] == 30.0
        return
    first = first_token_sample(f, PREDICTION, cfg)
    assert {k: first[k] for k in c.features} == c.features  # the routing-time row
    assert (first["actual_ttft_ms"], first["actual_tpot_ms"]) == (c.ttft_ms, 0.0)
    [tpot] = samples
    assert (tpot["actual_ttft_ms"], tpot["actual_tpot_ms"]) == (0.0, c.tpot_ms)
    assert "predicted_tpot_ms" not in first and "predicted_ttft_ms" not in tpot
    if feedback == "first-token":
        assert {k: tpot[k] for k in c.features} == c.features
        assert "predicted_ttft_ms" not in first and "predicted_tpot_ms" not in tpot
    else:  # today's EPP: the prediction routed on, and TPOT with the pod's load at the last token
        assert first["predicted_ttft_ms"] == 120.0 and tpot["predicted_tpot_ms"] == 30.0
        assert c.finished_load is not None
        assert {k: tpot[k] for k in c.finished_load} == c.finished_load
        assert (tpot["prefix_cache_score"], tpot["num_tokens_generated"]) == (0.0, 0)
        assert tpot["input_token_length"] == c.features["input_token_length"]
    # a request with a single output token has no TPOT to report
    one = Completion(c.request, c.pod, c.routed_at_s, c.features, c.ttft_ms, 0.0, c.finished_s)
    assert completion_samples(one, PREDICTION, cfg) == []
