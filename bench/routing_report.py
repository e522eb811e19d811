"""Rendering of the routing comparison: the Markdown table and the plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from bench.routing_sim import RunResult


def markdown_table(results: Sequence[RunResult], heuristics: set[str]) -> str:
    """One row per (load, policy); the best heuristic and best predicted policy of each load in bold."""
    lines = [
        "| load | policy | kind | SLO attainment | rejected | TTFT p50 / p90 / p99 (ms) "
        "| TPOT p50 / p90 / p99 (ms) | throughput (req/s) | goodput (req/s) | fallback decisions |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for load in _ordered(r.scenario for r in results):
        rows = [r for r in results if r.scenario == load]
        best = {
            kind: max((r for r in rows if (r.policy in heuristics) == is_h), key=_att, default=None)
            for kind, is_h in (("h", True), ("p", False))
        }
        for r in rows:
            kind = "heuristic" if r.policy in heuristics else "predicted"
            name = f"**{r.policy}**" if r in best.values() else r.policy
            rejected = 100 * r.rejected / r.arrivals
            lines.append(
                f"| {load} | {name} | {kind} | {100 * r.attainment:.1f}% | {rejected:.1f}% "
                f"| {_ms(r.ttft_ms)} | {_ms(r.tpot_ms, 1)} | {r.throughput_rps:.1f} | {r.goodput_rps:.1f} "
                f"| {r.fallback_decisions if kind == 'predicted' else '-'} |"
            )
    return "\n".join(lines)


def summary_table(results: Sequence[RunResult], heuristics: set[str], offered: dict[str, float]) -> str:
    """Per load: the best heuristic, the best predicted-latency policy and the difference in points."""
    lines = [
        "| load | offered (req/s) | best heuristic | attainment | best predicted-latency policy "
        "| attainment | difference |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    for load in _ordered(r.scenario for r in results):
        rows = [r for r in results if r.scenario == load]
        h = max((r for r in rows if r.policy in heuristics), key=_att)
        p = max((r for r in rows if r.policy not in heuristics), key=_att)
        diff = 100 * (p.attainment - h.attainment)
        lines.append(
            f"| {load} | {offered.get(load, math.nan):.1f} | {h.policy} | {100 * h.attainment:.1f}% "
            f"| {p.policy} | {100 * p.attainment:.1f}% | {diff:+.1f} pts |"
        )
    return "\n".join(lines)


def plot(results: Sequence[RunResult], heuristics: set[str], path: Path) -> None:
    """Attainment per load and policy (bars), and TTFT p90 per load (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = _ordered(r.scenario for r in results)
    policies = _ordered(r.policy for r in results)
    by_key = {(r.scenario, r.policy): r for r in results}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.2))
    width = 0.8 / len(policies)
    cmap_h, cmap_p = plt.get_cmap("Greys"), plt.get_cmap("viridis")
    n_h = sum(1 for p in policies if p in heuristics)
    n_p = len(policies) - n_h
    i_h = i_p = 0
    for j, policy in enumerate(policies):
        if policy in heuristics:
            color = cmap_h(0.35 + 0.5 * i_h / max(1, n_h - 1))
            i_h += 1
        else:
            color = cmap_p(0.15 + 0.75 * i_p / max(1, n_p - 1))
            i_p += 1
        xs = [i + (j - len(policies) / 2 + 0.5) * width for i in range(len(loads))]
        att = [100 * by_key[(load, policy)].attainment for load in loads]
        ax1.bar(xs, att, width, label=policy, color=color, edgecolor="black", linewidth=0.3)
        p90 = [by_key[(load, policy)].ttft_ms["p90"] for load in loads]
        ax2.plot(range(len(loads)), p90, marker="o", label=policy, color=color)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(loads)))
        ax.set_xticklabels(loads, rotation=10)
    ax1.set_ylabel("SLO attainment (% of all requests)")
    ax1.set_ylim(0, 100)
    ax1.set_title("SLO attainment (TTFT and TPOT met)")
    ax1.legend(fontsize=7, ncol=2, loc="lower left")
    ax2.set_yscale("log")
    ax2.set_ylabel("TTFT p90 (ms)")
    ax2.set_title("TTFT p90")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _att(r: RunResult) -> float:
    return r.attainment


def _ms(p: dict[str, float], digits: int = 0) -> str:
    return " / ".join(f"{p[k]:.{digits}f}" for k in ("p50", "p90", "p99"))


def _ordered(names: object) -> list[str]:
    seen: dict[str, None] = {}
    for name in names:  # type: ignore[attr-defined]
        seen.setdefault(name, None)
    return list(seen)
