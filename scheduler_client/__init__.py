"""Scheduler-side client of the latency-model services, and routing policies built on it.

- ``LatencyClient`` (``client``): per-pod predictions in one call, a per-call deadline, an
  automatic, reported fallback to a heuristic score, and buffered sample feeding
  (``feeder``).
- Policies (``policies`` and the baselines in ``heuristics``), each reproducible from a seed.
- ``PlacementCost`` (``placement``): own SLO headroom plus the predicted harm of the placement
  to the pod's running requests, from extra rows in the same bulk call.
- ``default_policy(seed=0)`` (``recommended``): the policy we recommend.
- ``Router`` (``router``): a client and a policy, one decision per request (``decide``).
"""

from scheduler_client.client import ClientConfig, ClientCounters, InvalidRowsError, LatencyClient
from scheduler_client.fallback import CompositeWeights, FallbackPolicy, Mode, composite_scores
from scheduler_client.feeder import FeederConfig, FeederCounters, SampleFeeder, training_entry
from scheduler_client.heuristics import CompositeHeuristic, LeastKV, LeastQueue, Policy, RandomPolicy
from scheduler_client.picking import Picker
from scheduler_client.placement import HarmAdmission, PlacementCost, with_request
from scheduler_client.policies import Admission, LowestLatency, PrefixAffinity, SloHeadroom
from scheduler_client.recommended import default_policy
from scheduler_client.router import Router, decide
from scheduler_client.types import Decision, Prediction, RoutingRequest, meets_slo

__all__ = [
    "Admission",
    "ClientConfig",
    "ClientCounters",
    "CompositeHeuristic",
    "CompositeWeights",
    "Decision",
    "FallbackPolicy",
    "FeederConfig",
    "FeederCounters",
    "HarmAdmission",
    "InvalidRowsError",
    "LatencyClient",
    "LeastKV",
    "LeastQueue",
    "LowestLatency",
    "Mode",
    "Picker",
    "PlacementCost",
    "Policy",
    "Prediction",
    "PrefixAffinity",
    "RandomPolicy",
    "Router",
    "RoutingRequest",
    "SampleFeeder",
    "SloHeadroom",
    "composite_scores",
    "decide",
    "default_policy",
    "meets_slo",
    "training_entry",
    "with_request",
]
