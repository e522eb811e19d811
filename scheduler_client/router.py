"""A router: one ``LatencyClient`` and one policy, deciding one request at a time.

``await router.route(request, rows)`` asks for predictions only if the policy uses them,
falls back automatically (see ``client``), and returns the policy's ``Decision``.
``router.completed(row, ttft_ms, tpot_ms)`` feeds the sample back for training.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_client.client import LatencyClient
from scheduler_client.fallback import Mode
from scheduler_client.heuristics import Policy
from scheduler_client.types import Decision, RoutingRequest, Row


class Router:
    """Routes requests with ``policy``, using ``client`` for predictions and samples."""

    def __init__(self, client: LatencyClient, policy: Policy) -> None:
        self.client = client
        self.policy = policy

    @property
    def mode(self) -> Mode:
        return self.client.mode

    async def route(self, request: RoutingRequest, rows: Sequence[Row]) -> Decision:
        predictions = await self.client.predict_for_routing(rows) if self.policy.uses_predictions else None
        return self.policy.choose(request, rows, predictions)

    def completed(self, row: Row, actual_ttft_ms: float, actual_tpot_ms: float) -> None:
        """Feed a finished request back: the row it was routed with and the latencies it got."""
        self.client.add_sample(row, actual_ttft_ms, actual_tpot_ms)
