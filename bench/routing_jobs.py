"""One evaluation run as a picklable-free job for a process pool: names in, JSON out.

A job is (store dir, seed, requests, scenario name, policy name, settings): the worker
rebuilds the scenario and the policy from ``routing_setup`` by name (the recommended ones with
``settings``, a JSON object of ``default_policy``'s keyword settings), predicts in process with
``StorePredictions`` (loaded once per worker and store) and returns the ``RunResult`` as JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from bench.routing_local import StorePredictions
from bench.routing_setup import HEURISTICS, PREDICTED, RECOMMENDED, RECOMMENDED_ADMISSION, scenario_named
from bench.routing_sim import RunResult, run_policy
from scheduler_client import CompositeHeuristic, Policy, default_policy

_SOURCES: dict[str, StorePredictions] = {}


def policy_for(name: str, seed: int, settings: dict[str, float]) -> Policy:
    """The named benchmark policy; the recommended ones with ``settings`` (``default_policy`` keywords)."""
    if name in HEURISTICS:
        return HEURISTICS[name](seed)
    if name == "composite (tie-break seed + 1)":
        return CompositeHeuristic(seed=seed + 1)
    if name.startswith(RECOMMENDED_ADMISSION):
        return default_policy(seed, admission=True, **settings)
    if name.startswith(RECOMMENDED):
        # The same settings serve both recommended policies; the admission ones count only with admission.
        keep = settings.get("admission", False)
        routing = {k: v for k, v in settings.items() if keep or not k.startswith("admission_")}
        return default_policy(seed, **routing)
    return PREDICTED[name](seed)


def run_job(store: str, seed: int, requests: int, scenario: str, policy: str, settings: str) -> str:
    """One run; ``settings`` is a JSON object of ``default_policy`` keywords."""
    chosen = scenario_named(scenario, seed, requests)
    routed = policy_for(policy, seed, json.loads(settings))
    source = None
    if routed.uses_predictions:
        source = _SOURCES.get(store)
        if source is None:
            source = _SOURCES[store] = StorePredictions(Path(store))
    result = asyncio.run(run_policy(chosen, routed, source))
    result.policy = policy
    return json.dumps(dataclasses.asdict(result))


def result_from_json(text: str) -> RunResult:
    return RunResult(**json.loads(text))
