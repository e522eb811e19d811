"""Metrics of the accuracy evidence and the issue #9 targets they are judged against.

A replay is reduced, per model (TTFT, TPOT), to a ``Stream``: per scored request its time
(simulated or trace seconds), load stage, queue depth, our prediction, the naive baseline's
prediction (NaN before the baseline's first fit), the actual value and whether a trained model
(not the prior) answered. Everything below works on those arrays, so it can be tested on
synthetic streams with a known answer. Coverage is ``actual <= predicted``; pinball loss is the
training server's (``training_server.evaluation.pinball_loss``).

``judge(..., slack=True)`` is not #9's targets but a what-if for its owner: the coverage checks
with a tolerance of ``SLACK`` in the prediction's own units (the prediction x ``1 + SLACK`` covers
at least the floor in every group and overall, the prediction x ``1 - SLACK`` at most the band's
top overall). Where the pods saturate, a latency has almost no tail above its p90, and a 1 %
change of a prediction moves its coverage by 3-8 points (docs/accuracy-history.md, "How precisely
a p90 must sit on the real traces"); the band of +-2 points is then narrower than any estimate's
jitter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from training_server.evaluation import pinball_loss

TOLERANCE = 0.02  # overall coverage: target +- 2 points
FLOOR = 0.02  # every regime and stage: coverage >= target - 2 points
PINBALL_RATIO = 0.7  # ours / naive, overall
QUEUED_RATIO = 0.6  # ours / naive, waiting > 0
RECOVERY_BAND = 0.03  # recovered: window coverage within 3 points of the target ...
RECOVERY_LIMIT_S = 60.0  # ... within this long after the step
WINDOW_S = 10.0
MIN_WINDOW = 30  # a window with fewer requests is not judged
MIN_GROUP = 50  # a regime or stage with fewer requests is listed but not judged
SLACK = 0.02  # judge(slack=True): the coverage checks' tolerance, a share of the prediction


@dataclass(frozen=True)
class Stream:
    time_s: np.ndarray
    stage: np.ndarray  # label per request (str)
    waiting: np.ndarray
    depth_bin: np.ndarray  # the training server's queue-depth bin label per request (str)
    predicted: np.ndarray
    naive: np.ndarray
    actual: np.ndarray
    trained: np.ndarray  # bool: a trained model (not the prior) answered

    def __len__(self) -> int:
        return len(self.actual)

    def subset(self, mask: np.ndarray) -> Stream:
        return Stream(**{k: getattr(self, k)[mask] for k in self.__dataclass_fields__})


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (``(nan, nan)`` for no samples)."""
    if n == 0:
        return math.nan, math.nan
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def metrics(s: Stream, quantile: float) -> dict[str, Any]:
    """Coverage (with its interval) and pinball of ours; the same for the naive baseline on the
    requests it answered, and the pinball ratio ours/naive on exactly those requests."""
    n = len(s)
    if n == 0:
        return {"samples": 0}
    covered = s.actual <= s.predicted
    lo, hi = wilson(int(covered.sum()), n)
    out: dict[str, Any] = {
        "samples": n,
        "coverage": float(covered.mean()),
        "coverage_lo": lo,
        "coverage_hi": hi,
        # the coverage of the prediction x (1 -+ SLACK): what judge(slack=True) checks
        "coverage_below": float(np.mean(s.actual <= s.predicted * (1.0 - SLACK))),
        "coverage_above": float(np.mean(s.actual <= s.predicted * (1.0 + SLACK))),
        "pinball_ms": float(pinball_loss(s.actual, s.predicted, quantile).mean()),
    }
    both = ~np.isnan(s.naive)
    out["compared"] = int(both.sum())
    if both.any():
        ours = float(pinball_loss(s.actual[both], s.predicted[both], quantile).mean())
        naive = float(pinball_loss(s.actual[both], s.naive[both], quantile).mean())
        out["naive_coverage"] = float(np.mean(s.actual[both] <= s.naive[both]))
        out["naive_pinball_ms"] = naive
        out["ours_pinball_compared_ms"] = ours
        out["ratio"] = ours / naive if naive > 0 else math.nan
    return out


def grouped(s: Stream, labels: np.ndarray, quantile: float) -> dict[str, dict[str, Any]]:
    return {str(g): metrics(s.subset(labels == g), quantile) for g in _ordered(labels)}


def regimes(s: Stream) -> np.ndarray:
    return np.where(s.waiting > 0, "waiting>0", "waiting=0").astype(object)


def _ordered(labels: np.ndarray) -> list[Any]:
    seen: dict[Any, None] = {}
    for label in labels.tolist():
        seen.setdefault(label, None)
    return sorted(seen, key=_natural)


def _natural(label: Any) -> tuple[float, str]:
    text = str(label)
    value = text.split("=", 1)[-1].split("-", 1)[0].rstrip("+").lstrip(">")
    try:
        return float(value), text
    except ValueError:
        return float("inf"), text


def window_coverage(
    time_s: np.ndarray, covered: np.ndarray, start_s: float, end_s: float, window_s: float = WINDOW_S
) -> list[tuple[float, float, int]]:
    """(window end, coverage, requests) of consecutive windows ``[a, a + window_s)`` from ``start_s``."""
    out = []
    a = start_s
    while a + window_s <= end_s + 1e-9:
        mask = (time_s >= a) & (time_s < a + window_s)
        n = int(mask.sum())
        out.append((a + window_s, float(covered[mask].mean()) if n else math.nan, n))
        a += window_s
    return out


def recovery_s(
    time_s: np.ndarray,
    covered: np.ndarray,
    step_s: float,
    end_s: float,
    quantile: float,
    band: float = RECOVERY_BAND,
    window_s: float = WINDOW_S,
    min_count: int = MIN_WINDOW,
) -> float | None:
    """Seconds from ``step_s`` to the end of the first window after it whose coverage is within
    ``band`` of ``quantile`` and whose next window is too (one good window can be luck); windows
    with fewer than ``min_count`` requests are skipped. None if that never happens before ``end_s``.
    The smallest possible answer is ``window_s``: a window must lie entirely after the step.
    """
    windows = [w for w in window_coverage(time_s, covered, step_s, end_s, window_s) if w[2] >= min_count]
    good = [abs(c - quantile) <= band + 1e-12 for _, c, _ in windows]
    for i in range(len(windows) - 1):
        if good[i] and good[i + 1]:
            return windows[i][0] - step_s
    return None


def check(label: str, value: float | None, ok: bool, goal: str) -> dict[str, Any]:
    return {"target": label, "value": value, "goal": goal, "pass": bool(ok)}


def judge(summary: dict[str, Any], quantile: float, slack: bool = False) -> list[dict[str, Any]]:
    """The issue #9 "Done means" checks for one replay and model, from ``summarise_stream``; with
    ``slack``, its coverage checks with a tolerance of ``SLACK`` in the prediction's units (see the
    module docstring; a group's value is then the coverage of its prediction x ``1 + SLACK``)."""
    rows = []
    o = summary["overall"]
    if not o.get("samples"):
        return [check("a trained model answered", 0, False, "> 0 requests")]
    low, high = quantile - TOLERANCE, quantile + TOLERANCE
    if slack:  # some prediction within SLACK of ours is covered within the band
        ok = o["coverage_above"] >= low - 1e-12 and o["coverage_below"] <= high + 1e-12
        rows.append(check("coverage overall", o["coverage"], ok, f"{low:.2f}-{high:.2f} within {SLACK:.0%}"))
    else:
        ok = abs(o["coverage"] - quantile) <= TOLERANCE + 1e-12
        rows.append(check("coverage overall", o["coverage"], ok, f"{low:.2f}-{high:.2f}"))
    key = "coverage_above" if slack else "coverage"
    for kind in ("regime", "depth", "stage"):
        judged = {k: v for k, v in summary[kind].items() if v["samples"] >= MIN_GROUP}
        if judged:
            name, worst = min(judged.items(), key=lambda kv: kv[1][key])
            rows.append(
                check(
                    f"min coverage per {kind} ({name})",
                    worst[key],
                    worst[key] >= quantile - FLOOR - 1e-12,
                    f">= {quantile - FLOOR:.2f}" + (f" within {SLACK:.0%}" if slack else ""),
                )
            )
    if "ratio" in o:
        rows.append(
            check("pinball / naive overall", o["ratio"], o["ratio"] <= PINBALL_RATIO, f"<= {PINBALL_RATIO}")
        )
    queued = summary["regime"].get("waiting>0", {})
    if queued.get("samples", 0) >= MIN_GROUP and "ratio" in queued:
        rows.append(
            check(
                "pinball / naive queued",
                queued["ratio"],
                queued["ratio"] <= QUEUED_RATIO,
                f"<= {QUEUED_RATIO}",
            )
        )
    for step in summary.get("steps", []):
        value = step["recovery_s"]
        rows.append(
            check(
                f"recovery after {step['name']} (s)",
                value,
                value is not None and value <= RECOVERY_LIMIT_S,
                f"<= {RECOVERY_LIMIT_S:g}",
            )
        )
    return rows


def summarise_stream(
    s: Stream,
    quantile: float,
    steps: list[tuple[str, float, float]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """Overall, per regime, per depth bin and per stage metrics of the trained-model requests, the
    overall figures including the prior, and per step ``(name, at_s, segment_end_s)`` the recovery
    time of ours and of the naive baseline and the coverage of the 60 s after the step; and
    ``steady_recovery_s``, the recovery rule applied to the steady stage before the first step (from
    up to 120 s before it), where nothing changed: a rule a steady model cannot pass there does not
    measure recovery."""
    trained = s.subset(s.trained)
    out: dict[str, Any] = {
        "overall": metrics(trained, quantile),
        "with_prior": metrics(s, quantile),
        "prior_requests": int((~s.trained).sum()),
        "regime": grouped(trained, regimes(trained), quantile),
        "depth": grouped(trained, trained.depth_bin, quantile),
        "stage": grouped(trained, trained.stage, quantile),
        "stage_with_prior": grouped(s, s.stage, quantile),
        "steps": [],
        "steady_recovery_s": None,
    }
    if steps and len(trained):
        # The recovery rule on the steady stage before the first step, from a point with no change
        # at all: what it reads for a stage the model has followed all along (not judged).
        first_s = steps[0][1]
        start_s = max(float(trained.time_s.min()), first_s - 2 * RECOVERY_LIMIT_S)
        covered = trained.actual <= trained.predicted
        out["steady_recovery_s"] = recovery_s(trained.time_s, covered, start_s, first_s, quantile)
    for name, at_s, end_s in steps:
        after = (s.time_s >= at_s) & (s.time_s < at_s + RECOVERY_LIMIT_S)
        naive_known = ~np.isnan(s.naive)
        out["steps"].append(
            {
                "name": name,
                "at_s": at_s,
                "recovery_s": recovery_s(s.time_s, s.actual <= s.predicted, at_s, end_s, quantile),
                "naive_recovery_s": recovery_s(
                    s.time_s[naive_known], (s.actual <= s.naive)[naive_known], at_s, end_s, quantile
                ),
                "first_60s": metrics(s.subset(after), quantile),
            }
        )
    return out
