"""Routing policies built on per-pod latency predictions.

Each policy gets the request (with its optional TTFT/TPOT SLOs), the candidates' feature
rows and one ``Prediction`` per candidate, reduces them to costs (lower is better,
``math.inf`` = ruled out) and lets its ``Picker`` choose: the lowest cost by default, or a
weighted-random pick (softmax with a temperature, or top-k; see ``picking``). Without
predictions (the client is in fallback mode) every policy here uses the composite heuristic
score of ``fallback`` instead and says so in the decision (``used_predictions=False``).

Policies and their parameters:

``LowestLatency(tpot_weight)``
    cost = ttft_ms + tpot_weight * tpot_ms: predicted latency of the request until
    ``tpot_weight`` tokens after the first. ``tpot_weight=0`` routes by TTFT alone. SLOs are
    ignored.

``SloHeadroom(strategy, ttft_weight, tpot_weight, margin_frac, tpot_weight_no_slo,
sacrifice_slack_frac)``
    headroom = SLO - prediction, for TTFT and TPOT; a pod *meets* the SLO if both are
    >= ``margin_frac`` * SLO. If some pods meet it, only they stay in the draw, ranked by
    the weighted relative headroom h = w_ttft * (ttft headroom / TTFT SLO) + w_tpot * (tpot
    headroom / TPOT SLO): ``strategy="pack"`` takes the least positive headroom (fills pods
    up, keeps others free for later requests), ``"spread"`` the most (safety margin against
    prediction error and bursts). If none meets it, the least negative headroom wins (cost =
    weighted relative shortfall). A request without SLOs is routed as ``LowestLatency``.
    Optional ``sacrifice_slack_frac`` (off by default): a request that every pod is
    predicted to miss by more than that fraction of its SLO goes to the pod with the
    *highest* predicted TTFT instead, keeping the better pods for requests that can still
    make it. Under overload this raises SLO attainment a lot, at the price of a very long
    tail for the sacrificed requests; shedding them (``Admission``) is the cleaner choice
    where the request may be rejected.

``PrefixAffinity(base, threshold, ttft_margin_ms, ttft_margin_frac, epsilon)``
    Prefer pods whose ``prefix_cache_score`` >= ``threshold`` (their cache saves prefill),
    unless their predicted TTFT exceeds the best pod's by more than
    max(``ttft_margin_ms``, ``ttft_margin_frac`` * best TTFT). Among the preferred pods the
    ``base`` policy's costs decide; if none is preferred, ``base`` decides over all. With
    probability ``epsilon`` the preference is skipped (exploration: spreads hot prefixes so
    more pods get warm caches). Its draws come from ``random.Random(seed)``.

``Admission(inner, slack_frac)``
    Rejects (``Decision.pod is None``) a *sheddable* request with an SLO when no pod is
    predicted to meet it within a slack: every pod's predicted TTFT or TPOT exceeds its SLO
    times (1 + ``slack_frac``). Predictions are a high quantile (p90 by default), so a
    prediction just above the SLO still means a good chance of meeting it; with the spread of
    LLM latencies, ``slack_frac=0.5`` is roughly "more likely to miss than to meet"; a negative
    slack sheds unless some pod is predicted to meet the SLO with that much headroom.
    Everything else goes to ``inner``. Without predictions nothing is rejected: the fallback
    cannot tell. ``placement.HarmAdmission`` sheds by another test: what the request is worth
    against what its placement costs the requests already on the pod.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

from scheduler_client.fallback import DEFAULT_WEIGHTS, CompositeWeights
from scheduler_client.heuristics import CostPolicy, Policy, fallback_costs
from scheduler_client.picking import Picker
from scheduler_client.types import Decision, Prediction, RoutingRequest, Row, meets_slo

__all__ = ["Admission", "LowestLatency", "PredictedPolicy", "PrefixAffinity", "SloHeadroom"]


class PredictedPolicy(CostPolicy):
    """Base of the predicted-latency policies: composite fallback when predictions are missing."""

    name = "predicted"
    uses_predictions = True

    def __init__(
        self,
        picker: Picker | None = None,
        *,
        seed: int = 0,
        fallback_weights: CompositeWeights = DEFAULT_WEIGHTS,
    ) -> None:
        super().__init__(picker, seed=seed)
        self.fallback_weights = fallback_weights

    def costs(
        self, request: RoutingRequest, rows: Sequence[Row], predictions: Sequence[Prediction] | None
    ) -> tuple[list[float], str]:
        return self.costs_with_extra(request, rows, predictions, ())

    def costs_with_extra(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction] | None,
        extra: Sequence[Prediction],
    ) -> tuple[list[float], str]:
        if predictions is None:
            return fallback_costs(rows, self.fallback_weights), "fallback: composite score"
        return self.predicted_costs(request, rows, predictions, extra)

    def predicted_costs(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction],
        extra: Sequence[Prediction] = (),
    ) -> tuple[list[float], str]:
        """Costs from the candidates' predictions (and those of ``extra_rows``, in ``extra``)."""
        raise NotImplementedError


class LowestLatency(PredictedPolicy):
    """Lowest ttft_ms + tpot_weight * tpot_ms (see the module docstring)."""

    name = "lowest-latency"

    def __init__(self, tpot_weight: float = 0.0, picker: Picker | None = None, *, seed: int = 0) -> None:
        if tpot_weight < 0:
            raise ValueError("tpot_weight must be >= 0")
        super().__init__(picker, seed=seed)
        self.tpot_weight = tpot_weight

    def predicted_costs(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction],
        extra: Sequence[Prediction] = (),
    ) -> tuple[list[float], str]:
        return [p.ttft_ms + self.tpot_weight * p.tpot_ms for p in predictions], "predicted latency"


class SloHeadroom(PredictedPolicy):
    """SLO headroom, pack or spread (see the module docstring)."""

    def __init__(
        self,
        strategy: Literal["pack", "spread"] = "spread",
        *,
        ttft_weight: float = 0.5,
        tpot_weight: float = 0.5,
        margin_frac: float = 0.0,
        tpot_weight_no_slo: float = 0.0,
        sacrifice_slack_frac: float | None = None,
        picker: Picker | None = None,
        seed: int = 0,
    ) -> None:
        if strategy not in ("pack", "spread"):
            raise ValueError("strategy must be 'pack' or 'spread'")
        if sacrifice_slack_frac is not None and sacrifice_slack_frac < 0:
            raise ValueError("sacrifice_slack_frac must be >= 0 (or None)")
        if ttft_weight < 0 or tpot_weight < 0 or ttft_weight + tpot_weight <= 0:
            raise ValueError("ttft_weight and tpot_weight must be >= 0 and not both zero")
        if not 0.0 <= margin_frac < 1.0:
            raise ValueError("margin_frac must be in [0, 1)")
        super().__init__(picker, seed=seed)
        self.name = f"slo-{strategy}"
        self.strategy = strategy
        self.ttft_weight = ttft_weight
        self.tpot_weight = tpot_weight
        self.margin_frac = margin_frac
        self.sacrifice_slack_frac = sacrifice_slack_frac
        if sacrifice_slack_frac is not None:
            self.name += "+sacrifice"
        self._no_slo = LowestLatency(tpot_weight_no_slo)

    def headrooms(self, request: RoutingRequest, prediction: Prediction) -> tuple[float, float]:
        """Relative TTFT and TPOT headroom, (SLO - prediction) / SLO; 0.0 where there is no SLO."""
        ttft = 0.0 if request.ttft_slo_ms is None else 1.0 - prediction.ttft_ms / request.ttft_slo_ms
        tpot = 0.0 if request.tpot_slo_ms is None else 1.0 - prediction.tpot_ms / request.tpot_slo_ms
        return ttft, tpot

    def predicted_costs(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction],
        extra: Sequence[Prediction] = (),
    ) -> tuple[list[float], str]:
        if not request.has_slo:
            return self._no_slo.predicted_costs(request, rows, predictions)
        w_ttft = self.ttft_weight if request.ttft_slo_ms is not None else 0.0
        w_tpot = self.tpot_weight if request.tpot_slo_ms is not None else 0.0
        if w_ttft + w_tpot <= 0:  # the only SLO present has weight 0: rank by it anyway
            w_ttft, w_tpot = float(request.ttft_slo_ms is not None), float(request.tpot_slo_ms is not None)
        total = w_ttft + w_tpot
        margin = self.margin_frac
        meeting: list[float] = []
        shortfall: list[float] = []
        for p in predictions:
            ttft, tpot = self.headrooms(request, p)
            h = (w_ttft * ttft + w_tpot * tpot) / total
            if meets_slo(request, p, margin):
                meeting.append(h if self.strategy == "pack" else -h)
            else:
                meeting.append(math.inf)
            shortfall.append((w_ttft * max(0.0, margin - ttft) + w_tpot * max(0.0, margin - tpot)) / total)
        if any(math.isfinite(c) for c in meeting):
            return meeting, f"{self.strategy}: pods meeting the SLO"
        slack = self.sacrifice_slack_frac
        if slack is not None and not any(meets_slo(request, p, -slack) for p in predictions):
            return [-p.ttft_ms for p in predictions], "hopeless: sacrificed to the slowest pod"
        return shortfall, "no pod meets the SLO: least shortfall"


class PrefixAffinity(PredictedPolicy):
    """Prefix-cache affinity within a TTFT margin, with epsilon exploration (see the module docstring)."""

    def __init__(
        self,
        base: PredictedPolicy | None = None,
        *,
        threshold: float = 0.5,
        ttft_margin_ms: float = 50.0,
        ttft_margin_frac: float = 0.0,
        epsilon: float = 0.05,
        picker: Picker | None = None,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= threshold <= 1.0 or not 0.0 <= epsilon <= 1.0:
            raise ValueError("threshold and epsilon must be in [0, 1]")
        if ttft_margin_ms < 0 or ttft_margin_frac < 0:
            raise ValueError("TTFT margins must be >= 0")
        super().__init__(picker, seed=seed)
        self.base = base if base is not None else LowestLatency()
        self.name = f"prefix-affinity({self.base.name})"
        self.threshold = threshold
        self.ttft_margin_ms = ttft_margin_ms
        self.ttft_margin_frac = ttft_margin_frac
        self.epsilon = epsilon
        self.rng = random.Random(seed + 1)  # independent of the picker's stream

    def extra_rows(self, request: RoutingRequest, rows: Sequence[Row]) -> list[Row]:
        return self.base.extra_rows(request, rows)

    def predicted_costs(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction],
        extra: Sequence[Prediction] = (),
    ) -> tuple[list[float], str]:
        costs, reason = self.base.predicted_costs(request, rows, predictions, extra)
        if self.epsilon and self.rng.random() < self.epsilon:
            return costs, f"explore; {reason}"
        best_ttft = min(p.ttft_ms for p in predictions)
        limit = best_ttft + max(self.ttft_margin_ms, self.ttft_margin_frac * best_ttft)
        preferred = [
            float(row["prefix_cache_score"]) >= self.threshold and p.ttft_ms <= limit
            for row, p in zip(rows, predictions, strict=True)
        ]
        masked = [c if keep else math.inf for c, keep in zip(costs, preferred, strict=True)]
        if not any(math.isfinite(c) for c in masked):
            return costs, f"no prefix-affine pod within the margin; {reason}"
        return masked, f"prefix affinity; {reason}"


class Admission:
    """Sheds sheddable requests no pod is predicted to serve within their SLO; else ``inner`` decides."""

    uses_predictions = True
    shed_reason = "shed: no pod is predicted to meet the SLO"

    def __init__(self, inner: Policy, *, slack_frac: float = 0.0) -> None:
        if not -1.0 < slack_frac < math.inf:
            raise ValueError("slack_frac must be > -1 (negative: shed unless the prediction has headroom)")
        self.inner = inner
        self.name = f"{inner.name}+admission"
        self.slack_frac = slack_frac
        self.rejected = 0

    def extra_rows(self, request: RoutingRequest, rows: Sequence[Row]) -> list[Row]:
        return self.inner.extra_rows(request, rows)

    def sheds(self, request: RoutingRequest, rows: Sequence[Row], predictions: Sequence[Prediction]) -> bool:
        """Whether to shed this sheddable request with an SLO: no pod is predicted to meet it within
        the slack."""
        return not any(meets_slo(request, p, -self.slack_frac) for p in predictions)

    def choose(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction] | None = None,
        extra: Sequence[Prediction] | None = None,
    ) -> Decision:
        if (
            predictions is not None
            and request.sheddable
            and request.has_slo
            and self.sheds(request, rows, predictions)
        ):
            self.rejected += 1
            return Decision(None, self.name, True, self.shed_reason)
        return self.inner.choose(request, rows, predictions, extra)
