"""The two-pod state the placement-cost tests route a long prompt into: pod 0 decodes 20 requests,
pod 1 decodes 2 and has 3 long prompts queued (the unit and the e2e test of the harm term)."""

from __future__ import annotations

from stack.simulator import Cluster, PodConfig, SimRequest

# The request both tests place: a long prompt with a short answer.
LONG_PROMPT = SimRequest(1000, 1.0, prompt_tokens=4000, output_tokens=60, family=7, prefix_tokens=0)


def harm_scene() -> Cluster:
    """The cluster at ``LONG_PROMPT``'s arrival, before it is routed."""
    cluster = Cluster([PodConfig(step_jitter_frac=0.0)] * 2, seed=0)
    for i in range(20):
        cluster.route(SimRequest(i, 0.0, 300, 400, family=1 + i % 3, prefix_tokens=0), 0)
    for i in range(2):
        cluster.route(SimRequest(100 + i, 0.0, 300, 200, family=4, prefix_tokens=0), 1)
    cluster.advance_to(0.9)
    for i in range(3):
        cluster.route(SimRequest(200 + i, 0.9, 4000, 400, family=5, prefix_tokens=0), 1)
    cluster.advance_to(LONG_PROMPT.arrival_s)
    return cluster
