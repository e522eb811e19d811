"""Value types shared by the client and the policies: predictions, requests, decisions."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_client.fallback import Row

__all__ = ["Decision", "Prediction", "RoutingRequest", "Row", "meets_slo"]


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted latency of the request on one candidate pod (the service's quantile, p90 by default)."""

    ttft_ms: float
    tpot_ms: float
    model_version: str | None = None


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """What a policy knows about the request besides the pods' rows.

    ``ttft_slo_ms`` / ``tpot_slo_ms``: per-request objectives (``None`` = no objective).
    ``sheddable``: the request may be rejected when no pod is predicted to meet its SLO.
    """

    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    sheddable: bool = False

    def __post_init__(self) -> None:
        for slo in (self.ttft_slo_ms, self.tpot_slo_ms):
            if slo is not None and not slo > 0:
                raise ValueError("SLOs must be > 0 ms (or None)")

    @property
    def has_slo(self) -> bool:
        return self.ttft_slo_ms is not None or self.tpot_slo_ms is not None


@dataclass(frozen=True, slots=True)
class Decision:
    """A routing decision: the chosen pod index, or ``None`` when the request was rejected.

    ``used_predictions`` is False for heuristic policies and for predicted-latency policies
    that had to fall back to the composite score (no predictions for this request).
    """

    pod: int | None
    policy: str
    used_predictions: bool
    reason: str = ""

    @property
    def admitted(self) -> bool:
        return self.pod is not None


def meets_slo(request: RoutingRequest, prediction: Prediction, margin_frac: float = 0.0) -> bool:
    """True if ``prediction`` is within every SLO of ``request`` times (1 - ``margin_frac``).

    A positive margin demands headroom; a negative one tolerates predictions above the SLO.
    """
    keep = 1.0 - margin_frac
    if request.ttft_slo_ms is not None and prediction.ttft_ms > request.ttft_slo_ms * keep:
        return False
    return not (request.tpot_slo_ms is not None and prediction.tpot_ms > request.tpot_slo_ms * keep)
