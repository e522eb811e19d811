"""The policy interface and the heuristic baselines (what schedulers do without predictions).

A policy turns a request, the candidates' wire feature rows and (optionally) one prediction
per candidate into a ``Decision``. Every policy reduces the candidates to costs (lower is
better, ``math.inf`` = ruled out) and lets its ``Picker`` choose (see ``picking``), so every
decision is reproducible from the policy's seed.

Baselines, all ignoring predictions:

- ``RandomPolicy``: uniform over the candidates.
- ``LeastQueue``: fewest requests on the pod (waiting + running).
- ``LeastKV``: lowest KV-cache utilisation.
- ``CompositeHeuristic``: the prefix + queue + KV composite score of ``fallback`` (llm-d's
  default profile), the same score the predicted-latency policies fall back to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scheduler_client.fallback import DEFAULT_WEIGHTS, CompositeWeights, composite_scores, queue_depth
from scheduler_client.picking import Picker
from scheduler_client.types import Decision, Prediction, RoutingRequest, Row

__all__ = [
    "CompositeHeuristic",
    "CostPolicy",
    "LeastKV",
    "LeastQueue",
    "Policy",
    "RandomPolicy",
]


class Policy(Protocol):
    """What a router needs from a policy."""

    name: str
    uses_predictions: bool

    def choose(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction] | None = None,
        extra: Sequence[Prediction] | None = None,
    ) -> Decision: ...

    def extra_rows(self, request: RoutingRequest, rows: Sequence[Row]) -> list[Row]:
        """Rows to predict in the same call after the candidates' (``extra`` of ``choose``); often none."""
        ...


class CostPolicy:
    """Base class: ``costs`` per candidate, then the picker. Subclasses set ``name`` and ``costs``."""

    name = "cost"
    uses_predictions = False

    def __init__(self, picker: Picker | None = None, *, seed: int = 0) -> None:
        self.picker = picker if picker is not None else Picker(seed=seed)

    def costs(
        self, request: RoutingRequest, rows: Sequence[Row], predictions: Sequence[Prediction] | None
    ) -> tuple[list[float], str]:
        """Per-candidate costs and a short reason for the decision log."""
        raise NotImplementedError

    def extra_rows(self, request: RoutingRequest, rows: Sequence[Row]) -> list[Row]:
        """No extra rows: only the candidates' own predictions are used."""
        return []

    def costs_with_extra(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction] | None,
        extra: Sequence[Prediction],
    ) -> tuple[list[float], str]:
        """``costs``, for policies that also use the predictions of their ``extra_rows``."""
        return self.costs(request, rows, predictions)

    def choose(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction] | None = None,
        extra: Sequence[Prediction] | None = None,
    ) -> Decision:
        if not rows:
            raise ValueError("no candidate pods")
        if predictions is not None and len(predictions) != len(rows):
            raise ValueError(f"{len(predictions)} predictions for {len(rows)} candidates")
        costs, reason = self.costs_with_extra(request, rows, predictions, extra or ())
        used = self.uses_predictions and predictions is not None
        return Decision(self.picker.pick(costs), self.name, used, reason)


class RandomPolicy(CostPolicy):
    """Uniformly random pod."""

    name = "random"

    def costs(
        self, request: RoutingRequest, rows: Sequence[Row], predictions: Sequence[Prediction] | None
    ) -> tuple[list[float], str]:
        return [0.0] * len(rows), "random"


class LeastQueue(CostPolicy):
    """Pod with the fewest waiting + running requests (ties: random)."""

    name = "least-queue"

    def costs(
        self, request: RoutingRequest, rows: Sequence[Row], predictions: Sequence[Prediction] | None
    ) -> tuple[list[float], str]:
        return [float(queue_depth(row)) for row in rows], "queue depth"


class LeastKV(CostPolicy):
    """Pod with the lowest KV-cache utilisation (ties: random)."""

    name = "least-kv"

    def costs(
        self, request: RoutingRequest, rows: Sequence[Row], predictions: Sequence[Prediction] | None
    ) -> tuple[list[float], str]:
        return [float(row["kv_cache_percentage"]) for row in rows], "kv-cache use"


class CompositeHeuristic(CostPolicy):
    """Highest prefix + queue + KV composite score (``fallback.composite_scores``; weights 3/2/2)."""

    name = "composite"

    def __init__(
        self, weights: CompositeWeights = DEFAULT_WEIGHTS, picker: Picker | None = None, *, seed: int = 0
    ) -> None:
        super().__init__(picker, seed=seed)
        self.weights = weights

    def costs(
        self, request: RoutingRequest, rows: Sequence[Row], predictions: Sequence[Prediction] | None
    ) -> tuple[list[float], str]:
        return [-score for score in composite_scores(rows, self.weights)], "composite score"


def fallback_costs(rows: Sequence[Row], weights: CompositeWeights = DEFAULT_WEIGHTS) -> list[float]:
    """Costs of the composite fallback (negated scores), for predicted policies without predictions."""
    return [-score for score in composite_scores(rows, weights)]
