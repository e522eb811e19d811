"""The demo's end-of-run summary: accuracy overall, recently and per model version, routing
quality against round-robin on the same simulated workload, and sample-feedback counts.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stack.demo_stats import Outcome, accuracy_report


@dataclass
class DemoRun:
    """Raw results of one demo run; ``build_summary`` turns them into the summary dict."""

    duration_s: float
    pods: int
    rate_rps: float
    window: int
    wall_s: float
    sim_s: float
    requests: int
    rows: int
    prediction_errors: int
    last_error: str | None
    call_latencies_ms: list[float]
    versions: dict[str, float]  # version -> wall seconds into the run when first seen
    final_version: str | None
    quantile: float
    outcomes: list[Outcome]
    samples: dict[str, int]
    round_robin_ttft_ms: list[float] = field(default_factory=list)
    round_robin_tpot_ms: list[float] = field(default_factory=list)
    training_server: dict[str, Any] | None = None  # its /status digest at the end, when known


def build_summary(run: DemoRun) -> dict[str, Any]:
    """Everything worth reporting about a run, as plain JSON-able values."""
    q = run.quantile
    predicted = [o for o in run.outcomes if o.predicted_ttft_ms is not None]
    recent = predicted[-run.window :]
    lat = np.asarray(run.call_latencies_ms, dtype=float)
    return {
        "requests": run.requests,
        "completions": len(run.outcomes),
        # Completions whose prediction was scored: all but those drained after the arrivals stopped.
        "scored_completions": len(predicted),
        "rows_predicted": run.rows,
        "prediction_errors": run.prediction_errors,
        "last_prediction_error": run.last_error,
        "pods": run.pods,
        "rate_rps": run.rate_rps,
        "sim_duration_s": round(run.sim_s, 3),
        "wall_s": round(run.wall_s, 3),
        "speedup": round(run.sim_s / run.wall_s, 2) if run.wall_s > 0 else None,
        "requests_per_wall_s": round(run.requests / run.wall_s, 1) if run.wall_s > 0 else None,
        "rows_per_wall_s": round(run.rows / run.wall_s, 1) if run.wall_s > 0 else None,
        "call_latency_ms": {
            "p50": float(np.percentile(lat, 50)) if lat.size else None,
            "p99": float(np.percentile(lat, 99)) if lat.size else None,
        },
        "quantile": q,
        "final_model_version": run.final_version,
        "model_versions": [
            {"version": v, "first_seen_wall_s": round(t, 2), **_per_version(predicted, v, q)}
            for v, t in run.versions.items()
        ],
        "ttft": {"overall": _accuracy(predicted, "ttft", q), "recent": _accuracy(recent, "ttft", q)},
        "tpot": {"overall": _accuracy(predicted, "tpot", q), "recent": _accuracy(recent, "tpot", q)},
        "routing": {
            "ttft_p50_ms": _pct([o.ttft_ms for o in run.outcomes], 50),
            "ttft_p90_ms": _pct([o.ttft_ms for o in run.outcomes], 90),
            "tpot_p90_ms": _pct([o.tpot_ms for o in run.outcomes if o.tpot_ms > 0], 90),
            "round_robin_ttft_p50_ms": _pct(run.round_robin_ttft_ms, 50),
            "round_robin_ttft_p90_ms": _pct(run.round_robin_ttft_ms, 90),
            "round_robin_tpot_p90_ms": _pct([t for t in run.round_robin_tpot_ms if t > 0], 90),
        },
        "samples": dict(run.samples),
        "training_server": run.training_server,
    }


def format_summary(s: dict[str, Any], width: int = 79) -> str:
    """The summary as a short human-readable block, wrapped to ``width`` columns."""
    lines = ["", "=== demo summary ==="]
    lines.append(
        f"simulated {s['sim_duration_s']:.1f} s in {s['wall_s']:.1f} s wall ({s['speedup']}x real time): "
        f"{s['requests']} requests over {s['pods']} pods, {s['rows_predicted']} rows predicted, "
        f"{s['prediction_errors']} failed prediction calls"
    )
    lat = s["call_latency_ms"]
    if lat["p50"] is not None:
        lines.append(f"prediction call latency: p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms")
    versions = ", ".join(v["version"] for v in s["model_versions"]) or "-"
    lines.append(f"model versions seen: {versions} (final {s['final_model_version']})")
    target = s["quantile"] * 100
    for name in ("ttft", "tpot"):
        for scope in ("overall", "recent"):
            acc = s[name][scope]
            if not acc["count"]:
                continue
            vs = acc["pinball"] / acc["constant_pinball"] if acc["constant_pinball"] else float("nan")
            words = _coverage_words(acc["coverage"], s["quantile"])
            lines.append(
                f"{name.upper()} p{target:g} {scope:>7}: coverage {acc['coverage'] * 100:5.1f}% "
                f"(target {target:g}%: {words}), MAPE {acc['mape'] * 100:5.1f}%, "
                f"pinball {acc['pinball']:.2f} = {vs:.2f}x the best constant in hindsight  "
                f"[{acc['count']} completions]"
            )
    if s["ttft"]["overall"]["count"]:
        lines.append(_LEGEND)
    for v in s["model_versions"]:
        if v["ttft_coverage"] is None:
            continue
        lines.append(
            f"  {v['version']}: {v['count']} completions, TTFT coverage {v['ttft_coverage'] * 100:.1f}% "
            f"MAPE {v['ttft_mape'] * 100:.1f}%, TPOT coverage {_pct_text(v['tpot_coverage'])} "
            f"MAPE {_pct_text(v['tpot_mape'])}"
        )
    r = s["routing"]
    if r["ttft_p90_ms"] is not None and r["round_robin_ttft_p90_ms"] is not None:
        lines.append(
            f"routing by predicted TTFT: p90 TTFT {r['ttft_p90_ms']:.0f} ms vs "
            f"{r['round_robin_ttft_p90_ms']:.0f} ms "
            f"for round-robin on the same workload (p50 {r['ttft_p50_ms']:.0f} vs "
            f"{r['round_robin_ttft_p50_ms']:.0f} ms)"
        )
    sm = s["samples"]
    lines.append(
        f"samples: {sm['sent']} sent, {sm['accepted']} accepted, {sm['rejected']} rejected, "
        f"{sm['throttled']} throttled answers, {sm['dropped']} dropped, {sm['unsent']} unsent"
    )
    ts = s.get("training_server")
    if ts:
        lines.append(
            f"training server: {ts['accepted_samples']} samples accepted, "
            f"{ts['window_samples']} in the window, {ts['retrains']} retrain(s); "
            f"store holds {', '.join(ts['versions_in_store'])} (current {ts['current_version']})"
        )
    return "\n".join(_wrap(line, width) if line else line for line in lines)


_LEGEND = (
    "  What these mean: coverage is the share of requests that finished within their predicted "
    "time (a calibrated p90 model: 90%; more: predictions run high, fewer: they run low). MAPE is "
    "the average gap between prediction and actual (a p90 prediction sits above the typical latency "
    "on purpose, so it is never 0). Pinball compares the model with the one number that would have "
    "been best for those same requests, chosen afterwards: under 1.00x the model beats it. 'recent' "
    "is the last --demo-window completions: a short quiet stretch, where latencies barely vary, is "
    "easy for a constant and can read as over 1x. Requests finishing after the arrivals stopped are "
    "not scored."
)


def _wrap(line: str, width: int) -> str:
    indent = line[: len(line) - len(line.lstrip())]
    return textwrap.fill(
        line, width, subsequent_indent=indent + "    ", break_long_words=False, break_on_hyphens=False
    )


def _coverage_words(coverage: float, quantile: float) -> str:
    gap = coverage - quantile
    if abs(gap) <= 0.02:
        return "on target"
    return "predictions run high" if gap > 0 else "predictions run low"


def _accuracy(outcomes: list[Outcome], which: str, q: float) -> dict[str, float | int | None]:
    if which == "ttft":
        pred = [o.predicted_ttft_ms for o in outcomes]
        actual = [o.ttft_ms for o in outcomes]
    else:
        pred = [o.predicted_tpot_ms for o in outcomes]
        actual = [o.tpot_ms for o in outcomes]
    return accuracy_report(np.asarray(pred, dtype=float), np.asarray(actual, dtype=float), q)


def _per_version(outcomes: list[Outcome], version: str, q: float) -> dict[str, Any]:
    mine = [o for o in outcomes if o.model_version == version]
    ttft, tpot = _accuracy(mine, "ttft", q), _accuracy(mine, "tpot", q)
    return {
        "count": len(mine),
        "ttft_coverage": ttft["coverage"],
        "ttft_mape": ttft["mape"],
        "tpot_coverage": tpot["coverage"],
        "tpot_mape": tpot["mape"],
    }


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _pct_text(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"
