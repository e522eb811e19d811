"""Placement cost to others: what putting this request on a pod does to the requests already there.

Every prefill chunk a pod runs lengthens the decode steps of every sequence co-scheduled with
it (chunked prefill), and every extra running sequence makes each step a little longer. A
policy that looks only at the new request's own predicted latency piles prefill work onto
pods whose running requests are decoding near their TPOT SLO. ``PlacementCost`` adds, per
candidate pod, the predicted harm to those requests.

How the harm is estimated (``harm``):

- ``"physics"`` (what ``default_policy`` uses): the work the placement adds to the pod, times
  the requests it slows down. Its uncached prompt is prefilled in chunks co-scheduled with
  every sequence on the pod, and each chunk lengthens every one of their steps in proportion
  to its tokens, so

      harm_p = (running_p + waiting_p) * (uncached_p + decode_equivalent_tokens) / 1000

  (``uncached_p``: the prompt tokens pod p does not hold in its prefix cache; the optional
  ``decode_equivalent_tokens`` stands for the request's own decode steps). Zero on an idle
  pod, and it needs no extra rows. In the simulator's step model (``stack/sim_pod.py``) a
  prefill token costs every co-scheduled sequence 0.018 ms, so 1000 units of harm are about
  18 ms x (output tokens)^-1 of TPOT for each of the pod's requests: a harm weight around 0.01
  puts it on the scale of the own term's -ln P.
- ``"tpot"``: from the same models, in the same bulk prediction call: for each candidate,
  ``with_request(row)`` is the pod's row as it will look once this request is placed there
  (its uncached prompt added to ``prefill_tokens_in_flight``, its KV context to
  ``decode_tokens_in_flight``, one more running request). The router predicts the
  candidates' rows and these extra rows together (``extra_rows``), so one routing decision
  stays one call:

      delta_p = max(0, tpot(with_request(row_p)) - tpot(row_p))        ms per output token
      harm_p  = delta_p * (running_p + waiting_p) / others_tpot_slo_ms  "SLO-widths" summed

  On the routing benchmark this did not help: the TPOT model answers "the TPOT of a request
  *arriving* in this state", whose increase is largest on lightly loaded pods, not the
  marginal TPOT of the requests already running (docs/benchmarks-routing.md).

The cost of pod p, lower is better:

    cost_p = own_p + harm_weight * harm_p + cache_weight * (1 - prefix_cache_score_p)
             + ttft_cost_per_s * predicted_ttft_p / 1000
             + prefill_cost_per_ktoken * (prefill_tokens_in_flight_p + uncached_p) / 1000

The own term depends on ``objective``:

- ``"headroom"``: ``-headroom_p``, the request's own weighted relative SLO headroom
  (``SloHeadroom``'s ``h``: 0.5 TTFT + 0.5 TPOT, as a share of each SLO). As in
  ``SloHeadroom("spread")``, pods predicted to meet both SLOs are the only ones in the draw
  while there are any; otherwise the shortfall is the own term.
- ``"chance"``: ``-ln P(meet both SLOs on p)`` (``odds.log_chance``: the p90 prediction read as
  a log-normal with assumed spreads). Attainment counts requests that meet *both* objectives;
  headroom ranks an interactive request by its wide TTFT margin while its tight TPOT is what it
  misses.
- ``"expected"``: ``-P(meet both SLOs on p)``, the request's own contribution to the expected
  attainment. Unlike ``-ln P``, it does not pay any price for a slightly better chance of a
  request that will miss anyway: for such a request the other terms decide (what it costs the
  pod's requests, its predicted TTFT below). Its scale is 1 where ``-ln P``'s is unbounded, so its
  weights are smaller.

``ttft_cost_per_s`` adds that much per second of the request's own predicted TTFT, with any
objective: it keeps a request that cannot meet its SLO from being sent behind a long queue only
because the queue's pod holds its prefix or few other requests (the TTFT tail).

``prefill_cost_per_ktoken`` adds that much per thousand prompt tokens pod p must prefill before this
request's first token (those in flight there and its own uncached ones): the work ahead of it, read
from the row rather than from the TTFT model. In an overload burst, when no request has a chance
and the own term is flat, a harm term that counts *requests* (``decode_equivalent_tokens``) sends some
of them behind the longest prefill queues; the predicted TTFT there comes from states the model has
rarely seen, while the tokens ahead are what the queue is.

``hopeless_chance`` (off by default): a request whose chance of meeting its SLO (as for
``"chance"``) is below it on every pod goes where it starts soonest (the lowest predicted TTFT),
whatever the other terms say: the opposite of ``SloHeadroom``'s sacrifice rule. It keeps the TTFT
tail short when the harm term (or ``decode_equivalent_tokens``) is strong enough to send requests
that will miss anyway behind a long queue on a pod with fewer requests.

The cache term is the share of the prompt pod p must prefill: the work the placement adds to
that pod, which every request there pays for in longer steps, and the prefix it may evict. (Own
predicted TTFT sees only the request's own share of a cache miss.) ``others_tpot_slo_ms`` is the
TPOT objective assumed for the requests already running (default: this request's own TPOT SLO,
else 50 ms).

Wrapped in ``PrefixAffinity(..., threshold=0.8)`` this is the llm-d pipeline's shape: prefix
affinity gated by predicted TTFT with epsilon exploration, then SLO headroom and the harm term.

``HarmAdmission`` sheds in the same currency: a sheddable request is rejected when on every pod
its own chance of meeting its SLO (``odds``, what admitting it adds to the expected attainment)
is smaller than ``harm_weight`` x the physics harm its placement does to the pod's requests (what
admitting it there takes from theirs). A pod with nothing on it has no harm, so a request is never
shed while one is idle. ``Admission`` sheds only requests no pod is predicted to serve within their
SLO, whatever they cost the others: under load it sheds requests that would have made it on a
quiet pod and keeps ones that slow down a busy pod's decodes (docs/benchmarks-routing.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, get_args

from scheduler_client.heuristics import Policy
from scheduler_client.odds import DEFAULT_SPREADS, Spreads, log_chance
from scheduler_client.picking import Picker
from scheduler_client.policies import Admission, PredictedPolicy, SloHeadroom
from scheduler_client.types import Prediction, RoutingRequest, Row, meets_slo

__all__ = [
    "HarmAdmission",
    "HarmKind",
    "Objective",
    "PlacementCost",
    "physics_harms",
    "prefill_ahead",
    "uncached_tokens",
    "with_request",
]

DEFAULT_OTHERS_TPOT_SLO_MS = 50.0
HarmKind = Literal["physics", "tpot"]
Objective = Literal["headroom", "chance", "expected"]


def uncached_tokens(row: Row) -> int:
    """The prompt tokens the candidate pod of ``row`` must prefill (not in its prefix cache)."""
    return round(int(row["input_token_length"]) * (1.0 - float(row["prefix_cache_score"])))


def prefill_ahead(row: Row) -> int:
    """The prompt tokens the candidate pod must prefill before the first token of ``row``'s request:
    those in flight there and its own uncached ones."""
    return int(row.get("prefill_tokens_in_flight", 0)) + uncached_tokens(row)


def _others(row: Row) -> int:
    return int(row["num_request_running"]) + int(row["num_request_waiting"])


def physics_harms(rows: Sequence[Row], decode_equivalent_tokens: float = 0.0) -> list[float]:
    """Per candidate: the work placing the request there adds, times the requests it slows down
    (``harm="physics"``; see the module docstring)."""
    return [_others(row) * (uncached_tokens(row) + decode_equivalent_tokens) / 1000.0 for row in rows]


def with_request(row: Row) -> dict[str, object]:
    """The candidate pod's row once the request ``row`` describes is placed there (see the module)."""
    prompt = int(row["input_token_length"])
    out = dict(row)
    out["num_request_running"] = int(row["num_request_running"]) + 1
    out["prefill_tokens_in_flight"] = prefill_ahead(row)
    out["decode_tokens_in_flight"] = int(row.get("decode_tokens_in_flight", 0)) + prompt
    return out


class PlacementCost(PredictedPolicy):
    """Own SLO headroom (or chance, or expected attainment) + ``harm_weight`` x predicted TPOT harm
    to the pod's requests + ``cache_weight`` x the uncached share of the prompt + ``ttft_cost_per_s``
    x its predicted TTFT in seconds + ``prefill_cost_per_ktoken`` x the prompt tokens to prefill before
    its first token, in thousands (see the module docstring)."""

    name = "placement-cost"

    def __init__(
        self,
        harm_weight: float = 1.0,
        *,
        cache_weight: float = 0.0,
        objective: Objective = "headroom",
        ttft_cost_per_s: float = 0.0,
        harm: HarmKind = "tpot",
        decode_equivalent_tokens: float = 0.0,
        prefill_cost_per_ktoken: float = 0.0,
        hopeless_chance: float = 0.0,
        spreads: Spreads = DEFAULT_SPREADS,
        others_tpot_slo_ms: float | None = None,
        ttft_weight: float = 0.5,
        tpot_weight: float = 0.5,
        picker: Picker | None = None,
        seed: int = 0,
    ) -> None:
        if harm_weight < 0 or not math.isfinite(harm_weight):
            raise ValueError("harm_weight must be a finite number >= 0")
        if cache_weight < 0 or not math.isfinite(cache_weight):
            raise ValueError("cache_weight must be a finite number >= 0")
        if objective not in get_args(Objective):
            raise ValueError(f"objective must be one of {get_args(Objective)}")
        if ttft_cost_per_s < 0 or not math.isfinite(ttft_cost_per_s):
            raise ValueError("ttft_cost_per_s must be a finite number >= 0")
        if harm not in get_args(HarmKind):
            raise ValueError(f"harm must be one of {get_args(HarmKind)}")
        if decode_equivalent_tokens < 0 or not math.isfinite(decode_equivalent_tokens):
            raise ValueError("decode_equivalent_tokens must be a finite number >= 0")
        if prefill_cost_per_ktoken < 0 or not math.isfinite(prefill_cost_per_ktoken):
            raise ValueError("prefill_cost_per_ktoken must be a finite number >= 0")
        if not 0.0 <= hopeless_chance < 1.0:
            raise ValueError("hopeless_chance must be in [0, 1)")
        if others_tpot_slo_ms is not None and not others_tpot_slo_ms > 0:
            raise ValueError("others_tpot_slo_ms must be > 0 (or None)")
        super().__init__(picker, seed=seed)
        self.harm_weight = harm_weight
        self.cache_weight = cache_weight
        self.objective = objective
        self.ttft_cost_per_s = ttft_cost_per_s
        self.harm = harm
        self.decode_equivalent_tokens = decode_equivalent_tokens
        self.prefill_cost_per_ktoken = prefill_cost_per_ktoken
        self.hopeless_chance = hopeless_chance
        self.spreads = spreads
        self.others_tpot_slo_ms = others_tpot_slo_ms
        self._own = SloHeadroom("spread", ttft_weight=ttft_weight, tpot_weight=tpot_weight)
        self.ttft_weight = ttft_weight
        self.tpot_weight = tpot_weight

    def extra_rows(self, request: RoutingRequest, rows: Sequence[Row]) -> list[Row]:
        return [with_request(row) for row in rows] if self.harm_weight > 0 and self.harm == "tpot" else []

    def harms(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction],
        extra: Sequence[Prediction],
    ) -> list[float]:
        """Per candidate: the harm to the requests already there (``harm``; see the module docstring)."""
        if self.harm == "physics":
            return physics_harms(rows, self.decode_equivalent_tokens)
        slo = self.others_tpot_slo_ms or request.tpot_slo_ms or DEFAULT_OTHERS_TPOT_SLO_MS
        if not extra:
            return [0.0] * len(rows)
        if len(extra) != len(rows):
            raise ValueError(f"{len(extra)} placement predictions for {len(rows)} candidates")
        return [
            max(0.0, placed.tpot_ms - alone.tpot_ms) * _others(row) / slo
            for row, alone, placed in zip(rows, predictions, extra, strict=True)
        ]

    def predicted_costs(
        self,
        request: RoutingRequest,
        rows: Sequence[Row],
        predictions: Sequence[Prediction],
        extra: Sequence[Prediction] = (),
    ) -> tuple[list[float], str]:
        logs = None  # ln P(meeting both SLOs) per pod, for the objectives and the hopeless rule
        if request.has_slo and (self.hopeless_chance or self.objective != "headroom"):
            logs = [log_chance(request, p, self.spreads) for p in predictions]
            if self.hopeless_chance and max(logs) < math.log(self.hopeless_chance):
                reason = "placement cost; no pod gives it a chance: soonest start"
                return [p.ttft_ms for p in predictions], reason
        harms = self.harms(request, rows, predictions, extra)
        if not request.has_slo:
            own = [p.ttft_ms / 1000.0 + p.tpot_ms / DEFAULT_OTHERS_TPOT_SLO_MS for p in predictions]
            reason = "no SLO: latency"
        elif self.objective == "chance" and logs is not None:
            own = [-x for x in logs]
            reason = "chance of meeting the SLO"
        elif self.objective == "expected" and logs is not None:
            own = [-math.exp(x) for x in logs]
            reason = "expected attainment"
        else:
            own = []
            meeting = [meets_slo(request, p) for p in predictions]
            for p, ok in zip(predictions, meeting, strict=True):
                ttft, tpot = self._own.headrooms(request, p)
                w_ttft = self.ttft_weight if request.ttft_slo_ms is not None else 0.0
                w_tpot = self.tpot_weight if request.tpot_slo_ms is not None else 0.0
                h = (w_ttft * ttft + w_tpot * tpot) / ((w_ttft + w_tpot) or 1.0)
                own.append(-h if ok or not any(meeting) else math.inf)
            reason = "pods meeting the SLO" if any(meeting) else "no pod meets the SLO: least shortfall"
        costs = [
            c
            + self.harm_weight * harm
            + self.cache_weight * (1.0 - float(row["prefix_cache_score"]))
            + self.ttft_cost_per_s * p.ttft_ms / 1000.0
            + self.prefill_cost_per_ktoken * prefill_ahead(row) / 1000.0
            for c, harm, row, p in zip(own, harms, rows, predictions, strict=True)
        ]
        return costs, f"placement cost; {reason}"


class HarmAdmission(Admission):
    """Sheds a sheddable request when on every pod its chance of meeting its SLO is smaller than
    ``harm_weight`` x the physics harm of placing it there (see the module docstring); else
    ``inner`` decides."""

    shed_reason = "shed: on every pod it costs the others more than its chance of meeting the SLO"

    def __init__(
        self,
        inner: Policy,
        *,
        harm_weight: float,
        decode_equivalent_tokens: float = 0.0,
        spreads: Spreads = DEFAULT_SPREADS,
    ) -> None:
        if not 0 < harm_weight < math.inf:
            raise ValueError("harm_weight must be a finite number > 0")
        if decode_equivalent_tokens < 0 or not math.isfinite(decode_equivalent_tokens):
            raise ValueError("decode_equivalent_tokens must be a finite number >= 0")
        super().__init__(inner)
        self.harm_weight = harm_weight
        self.decode_equivalent_tokens = decode_equivalent_tokens
        self.spreads = spreads

    def sheds(self, request: RoutingRequest, rows: Sequence[Row], predictions: Sequence[Prediction]) -> bool:
        harms = physics_harms(rows, self.decode_equivalent_tokens)
        return all(
            math.exp(log_chance(request, p, self.spreads)) < self.harm_weight * harm
            for p, harm in zip(predictions, harms, strict=True)
        )
