"""A router: one ``LatencyClient`` and one policy, deciding one request at a time.

``await router.route(request, rows)`` asks for predictions only if the policy uses them,
falls back automatically (see ``client``), and returns the policy's ``Decision``.
``router.completed(row, ttft_ms, tpot_ms)`` feeds the sample back for training.

``decide`` is that decision for any caller holding a client and a policy: the candidates' rows
and the policy's ``extra_rows`` (e.g. ``PlacementCost``'s "pod with this request placed")
go in ONE bulk prediction call, and the answer is split back into the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scheduler_client.client import LatencyClient
from scheduler_client.fallback import Mode
from scheduler_client.heuristics import Policy
from scheduler_client.types import Decision, Prediction, RoutingRequest, Row


class PredictionSource(Protocol):
    """What ``decide`` needs: ``LatencyClient.predict_for_routing`` (``None`` = use the fallback)."""

    async def predict_for_routing(self, rows: Sequence[Row]) -> list[Prediction] | None: ...


async def decide(
    client: PredictionSource, policy: Policy, request: RoutingRequest, rows: Sequence[Row]
) -> tuple[Decision, list[Prediction] | None]:
    """The policy's decision and the candidates' predictions (``None``: none asked, or fallback)."""
    if not policy.uses_predictions:
        return policy.choose(request, rows), None
    extra_rows = policy.extra_rows(request, rows)
    predictions = await client.predict_for_routing([*rows, *extra_rows] if extra_rows else rows)
    if predictions is None:
        return policy.choose(request, rows, None), None
    n = len(rows)
    own = predictions[:n]
    return policy.choose(request, rows, own, predictions[n:] if extra_rows else None), own


class Router:
    """Routes requests with ``policy``, using ``client`` for predictions and samples."""

    def __init__(self, client: LatencyClient, policy: Policy) -> None:
        self.client = client
        self.policy = policy

    @property
    def mode(self) -> Mode:
        return self.client.mode

    async def route(self, request: RoutingRequest, rows: Sequence[Row]) -> Decision:
        decision, _ = await decide(self.client, self.policy, request, rows)
        return decision

    def completed(self, row: Row, actual_ttft_ms: float, actual_tpot_ms: float) -> None:
        """Feed a finished request back: the row it was routed with and the latencies it got."""
        self.client.add_sample(row, actual_ttft_ms, actual_tpot_ms)
