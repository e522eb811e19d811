"""The clairvoyant rollout reference (bench.routing_rollout): its premise and its choice."""

from __future__ import annotations

import copy
import dataclasses
import math

from bench.routing_rollout import Rollout, run_rollout
from bench.routing_setup import scenarios
from bench.routing_sim import meets_slos
from stack.simulator import Cluster, Completion, PodConfig, SimRequest, Workload, WorkloadConfig


def _loaded_cluster(pods_used: int = 2) -> tuple[Cluster, list[SimRequest]]:
    cluster = Cluster(2, seed=3)
    requests = [
        dataclasses.replace(r, ttft_slo_ms=250.0, tpot_slo_ms=30.0)
        for r in Workload(WorkloadConfig(rate_rps=80.0, num_requests=300, seed=5))
    ]
    for i, req in enumerate(requests[:200]):
        cluster.advance_to(req.arrival_s)
        cluster.route(req, i % pods_used)
    return cluster, requests


def _key(c: Completion) -> tuple[int, int, float, float, float]:
    return (c.request.request_id, c.pod, c.ttft_ms, c.tpot_ms, c.finished_s)


def test_a_copy_run_to_the_end_is_the_trajectory_the_pod_then_runs_in_steps() -> None:
    cluster, _ = _loaded_cluster()
    pod = cluster.pods[0]
    assert pod.busy
    at_once: list[Completion] = []
    copy.deepcopy(pod).advance_to(math.inf, at_once)
    in_steps: list[Completion] = []
    t = cluster.now_s
    while pod.busy:
        t += 0.013
        pod.advance_to(t, in_steps)
    assert [_key(c) for c in in_steps] == [_key(c) for c in at_once]


def test_rollout_places_a_request_on_the_idle_pod_rather_than_behind_a_queue() -> None:
    cluster, requests = _loaded_cluster(pods_used=1)
    assert cluster.pods[0].num_waiting > 0 and not cluster.pods[1].busy
    req = requests[200]
    assert Rollout(cluster).choose(req, cluster.candidate_rows(req)) == 1


def _mirrored(tight_pod: int) -> tuple[Cluster, SimRequest]:
    """Two identical pods running the same requests; on ``tight_pod`` they have TPOT SLOs only 2%
    above the TPOT they are on course for, on the other pod loose ones."""
    pods = [PodConfig(step_jitter_frac=0.0)] * 2
    base = list(Workload(WorkloadConfig(rate_rps=30.0, num_requests=40, seed=11)))
    course, done = Cluster(pods), []
    for req in base:
        done += course.advance_to(req.arrival_s)
        course.route(req, 0)
    tpot = {c.request.request_id: c.tpot_ms for c in done + course.drain()}
    cluster = Cluster(pods)
    for req in base:
        cluster.advance_to(req.arrival_s)
        tight = dataclasses.replace(req, ttft_slo_ms=1e6, tpot_slo_ms=1.02 * tpot[req.request_id] or 1e6)
        loose = dataclasses.replace(req, request_id=req.request_id + 1000, ttft_slo_ms=1e6, tpot_slo_ms=1e6)
        cluster.route(tight, tight_pod)
        cluster.route(loose, 1 - tight_pod)
    # A long prompt with loose SLOs of its own, arriving while both pods are decoding.
    cluster.advance_to(base[-1].arrival_s + 0.05)
    new = dataclasses.replace(base[0], request_id=5000, prompt_tokens=6000, prefix_tokens=0)
    return cluster, dataclasses.replace(new, arrival_s=cluster.now_s, ttft_slo_ms=1e6, tpot_slo_ms=1e6)


def test_rollout_avoids_the_pod_whose_requests_its_prefill_would_push_past_their_slos() -> None:
    for tight_pod in (0, 1):
        cluster, req = _mirrored(tight_pod)
        # The pods run the same work, so the request's own outcome is the same on both.
        assert (
            cluster.candidate_rows(req)[0]["prefill_tokens_in_flight"]
            == (cluster.candidate_rows(req)[1]["prefill_tokens_in_flight"])
        )
        assert Rollout(cluster).choose(req, cluster.candidate_rows(req)) == 1 - tight_pod


def test_rollout_remembers_the_chosen_pods_trajectory_with_the_request_on_it() -> None:
    cluster, requests = _loaded_cluster()
    router = Rollout(cluster)
    req = requests[200]
    chosen = router.choose(req, cluster.candidate_rows(req))
    # What it remembers for the chosen pod is that pod's trajectory with the request placed there.
    trial = copy.deepcopy(cluster.pods[chosen])
    trial.enqueue(req, cluster.now_s, cluster.candidate_rows(req)[chosen])
    out: list[Completion] = []
    trial.advance_to(math.inf, out)
    assert router._meeting[chosen] == {c.request.request_id for c in out if meets_slos(c)}


def test_a_rollout_run_counts_what_it_routed() -> None:
    (scenario,) = [s for s in scenarios(7, 200) if s.name == "chat / low"]
    result = run_rollout(scenario, ttft_cost_per_s=1.0)
    assert result.arrivals == result.completed == 200
    assert result.policy == "rollout, TTFT cost 1/s"
    assert 0.9 <= result.attainment <= 1.0
