"""The chance that a request meets its SLOs on a pod, from a quantile prediction.

The services predict a high quantile (p90 by default) of TTFT and TPOT, not a distribution.
Ranking pods on that quantile's headroom weighs TTFT and TPOT by how far the quantile is from
each objective, not by how likely the request is to meet *both*, which is what SLO attainment
counts. ``log_chance`` turns the quantile into a chance under a stated assumption: the actual
latency is log-normal around the prediction with a fixed log-spread per target (``Spreads``),
so with ``z_q`` the standard normal quantile of the predicted level q,

    P(actual <= slo) = Phi(ln(slo / predicted) / spread + z_q)

and the chance of meeting both objectives is the product (they are treated as independent).
A prediction exactly at the objective gives P = q. The spreads are assumptions, not fitted:
0.5 for TTFT (queueing makes it wide) and 0.3 for TPOT (an average over many steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from scheduler_client.types import Prediction, RoutingRequest

__all__ = ["DEFAULT_SPREADS", "Spreads", "log_chance"]

_NORMAL = NormalDist()
_FLOOR = 1e-12  # chances are clipped here, so a hopeless pod still has a finite cost


@dataclass(frozen=True, slots=True)
class Spreads:
    """Assumed log-spread (sigma of ln actual) of TTFT and TPOT around the prediction; its level."""

    ttft: float = 0.5
    tpot: float = 0.3
    quantile: float = 0.9  # the level the service predicts (its /status "quantile")

    def __post_init__(self) -> None:
        if not (self.ttft > 0 and self.tpot > 0 and 0.0 < self.quantile < 1.0):
            raise ValueError("spreads must be > 0 and the quantile in (0, 1)")


DEFAULT_SPREADS = Spreads()


def log_chance(request: RoutingRequest, prediction: Prediction, spreads: Spreads = DEFAULT_SPREADS) -> float:
    """ln P(the request meets every SLO it has) on the pod ``prediction`` is for; 0.0 without SLOs."""
    z_q = _NORMAL.inv_cdf(spreads.quantile)
    total = 0.0
    for slo, predicted, spread in (
        (request.ttft_slo_ms, prediction.ttft_ms, spreads.ttft),
        (request.tpot_slo_ms, prediction.tpot_ms, spreads.tpot),
    ):
        if slo is None:
            continue
        z = math.log(slo / max(predicted, 1e-6)) / spread + z_q
        total += math.log(max(_NORMAL.cdf(z), _FLOOR))
    return total
