"""The heuristic composite score, and the switch between predicted and fallback routing.

When predictions are unavailable or late, a scheduler must still route every request. It
then scores each candidate pod from its wire feature row alone, the way llm-d's default
scheduling profile does (the weights are llm-d's defaults):

    score = (3 * prefix + 2 * queue + 2 * kv) / 7            (higher is better, in [0, 1])

    prefix = prefix_cache_score                              share of the prompt cached there
    queue  = (max_q - q) / (max_q - min_q)                   q = waiting + running, min-max
                                                             normalised over the candidates
                                                             (1.0 for all when they are equal)
    kv     = 1 - kv_cache_percentage

``FallbackSwitch`` decides which of the two is in force. It starts in ``predicted`` mode and
goes to ``fallback`` after ``failures_to_fallback`` consecutive failed or late prediction
calls. In fallback it stops waiting for predictions on the hot path and allows at most one
probe every ``probe_interval_s``; after ``successes_to_recover`` consecutive successful calls
it returns to ``predicted``. It reads time only through the ``now_s`` arguments, so it is a
pure state machine the client drives with ``time.monotonic()`` and tests drive by hand.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Row = Mapping[str, Any]
"""One candidate pod's wire feature row (wire-contract.md section 1)."""


@dataclass(frozen=True, slots=True)
class CompositeWeights:
    """Weights of the composite score's three terms (llm-d's default profile: 3, 2, 2)."""

    prefix: float = 3.0
    queue: float = 2.0
    kv: float = 2.0

    def __post_init__(self) -> None:
        if min(self.prefix, self.queue, self.kv) < 0 or self.prefix + self.queue + self.kv <= 0:
            raise ValueError("composite weights must be >= 0 and not all zero")


DEFAULT_WEIGHTS = CompositeWeights()


def queue_depth(row: Row) -> int:
    """Requests on the pod: waiting plus running."""
    return int(row["num_request_waiting"]) + int(row["num_request_running"])


def composite_scores(rows: Sequence[Row], weights: CompositeWeights = DEFAULT_WEIGHTS) -> list[float]:
    """Composite score of each candidate in [0, 1]; higher is better (see the module docstring)."""
    depths = [queue_depth(row) for row in rows]
    lo, hi = (min(depths), max(depths)) if depths else (0, 0)
    span = hi - lo
    total = weights.prefix + weights.queue + weights.kv
    scores = []
    for row, depth in zip(rows, depths, strict=True):
        queue = 1.0 if span == 0 else (hi - depth) / span
        value = (
            weights.prefix * float(row["prefix_cache_score"])
            + weights.queue * queue
            + weights.kv * (1.0 - float(row["kv_cache_percentage"]))
        )
        scores.append(value / total)
    return scores


class Mode(enum.StrEnum):
    """Where routing decisions come from."""

    PREDICTED = "predicted"
    FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class FallbackPolicy:
    """When to leave and when to return to predicted routing."""

    failures_to_fallback: int = 1  # consecutive failed/late calls before falling back
    probe_interval_s: float = 1.0  # in fallback, at most one probe this often
    successes_to_recover: int = 1  # consecutive successful calls before predicting again

    def __post_init__(self) -> None:
        if self.failures_to_fallback < 1 or self.successes_to_recover < 1:
            raise ValueError("failures_to_fallback and successes_to_recover must be >= 1")
        if self.probe_interval_s < 0:
            raise ValueError("probe_interval_s must be >= 0")


class FallbackSwitch:
    """State machine of the mode; counts its transitions."""

    def __init__(self, policy: FallbackPolicy | None = None) -> None:
        self.policy = policy or FallbackPolicy()
        self.mode = Mode.PREDICTED
        self.consecutive_failures = 0
        self.consecutive_successes = 0
        self.switches_to_fallback = 0
        self.switches_to_predicted = 0
        self.probes_started = 0
        self._probe_in_flight = False
        self._next_probe_s = 0.0

    def should_predict(self) -> bool:
        """In predicted mode the hot path asks for predictions; in fallback it does not wait."""
        return self.mode is Mode.PREDICTED

    def try_start_probe(self, now_s: float) -> bool:
        """In fallback: True (and a probe is now in flight) if one is due; the caller must report it."""
        if self.mode is Mode.PREDICTED or self._probe_in_flight or now_s < self._next_probe_s:
            return False
        self._probe_in_flight = True
        self._next_probe_s = now_s + self.policy.probe_interval_s
        self.probes_started += 1
        return True

    def probe_finished(self) -> None:
        """Release the probe slot (call after reporting its outcome)."""
        self._probe_in_flight = False

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self.consecutive_successes += 1
        if self.mode is Mode.FALLBACK and self.consecutive_successes >= self.policy.successes_to_recover:
            self.mode = Mode.PREDICTED
            self.switches_to_predicted += 1

    def record_failure(self, now_s: float) -> None:
        self.consecutive_successes = 0
        self.consecutive_failures += 1
        if self.mode is Mode.PREDICTED and self.consecutive_failures >= self.policy.failures_to_fallback:
            self.mode = Mode.FALLBACK
            self.switches_to_fallback += 1
            # The first probe waits a full interval: the service just failed.
            self._next_probe_s = now_s + self.policy.probe_interval_s
