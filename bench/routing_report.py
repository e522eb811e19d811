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
                f"| {_share(r) if kind == 'predicted' else '-'} |"
            )
    return "\n".join(lines)


def pooled(per_seed: Sequence[tuple[int, RunResult]]) -> list[RunResult]:
    """One result per (scenario, policy) over the seeds: counts summed (so attainment is pooled),
    latency percentiles, throughput and goodput averaged over the seeds' runs."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for _, r in per_seed:
        groups.setdefault((r.scenario, r.policy), []).append(r)
    out = []
    for (scenario, policy), runs in groups.items():
        n = len(runs)
        out.append(
            RunResult(
                scenario=scenario,
                policy=policy,
                arrivals=sum(r.arrivals for r in runs),
                completed=sum(r.completed for r in runs),
                rejected=sum(r.rejected for r in runs),
                met_slo=sum(r.met_slo for r in runs),
                ttft_ms={k: sum(r.ttft_ms[k] for r in runs) / n for k in runs[0].ttft_ms},
                tpot_ms={k: sum(r.tpot_ms[k] for r in runs) / n for k in runs[0].tpot_ms},
                throughput_rps=sum(r.throughput_rps for r in runs) / n,
                goodput_rps=sum(r.goodput_rps for r in runs) / n,
                fallback_decisions=sum(r.fallback_decisions for r in runs),
            )
        )
    return out


def paired_differences(
    per_seed: Sequence[tuple[int, RunResult]], scenario: str, policy: str, baseline: str
) -> list[float]:
    """Per seed: attainment of ``policy`` minus ``baseline`` on ``scenario``, in points."""
    att = {(seed, r.policy): r.attainment for seed, r in per_seed if r.scenario == scenario}
    seeds = sorted({seed for seed, _ in per_seed})
    return [
        100 * (att[(seed, policy)] - att[(seed, baseline)])
        for seed in seeds
        if (seed, policy) in att and (seed, baseline) in att
    ]


TARGETS = ("recommended", "recommended+admission")


def summary_table(
    results: Sequence[RunResult],
    per_seed: Sequence[tuple[int, RunResult]],
    heuristics: set[str],
    offered: dict[str, float],
    noise: dict[str, float],
) -> str:
    """Per load: the best heuristic, then each target policy (or the best predicted one) against it."""
    names = {r.policy for r in results}
    targets = [t for t in TARGETS if t in names]
    lines = [
        "| load | offered (req/s) | best heuristic | attainment | policy | attainment | difference "
        "| per seed | noise floor | TTFT p99 (ms), heuristic / policy |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for load in _ordered(r.scenario for r in results):
        rows = {r.policy: r for r in results if r.scenario == load}
        h = max((r for r in rows.values() if r.policy in heuristics), key=_att)
        best = max((r for r in rows.values() if r.policy not in heuristics), key=_att)
        for p in [rows[t] for t in targets] or [best]:
            diff = 100 * (p.attainment - h.attainment)
            seeds = " / ".join(f"{d:+.1f}" for d in paired_differences(per_seed, load, p.policy, h.policy))
            lines.append(
                f"| {load} | {offered.get(load, math.nan):.1f} | {h.policy} | {100 * h.attainment:.1f}% "
                f"| {p.policy} | {100 * p.attainment:.1f}% | {diff:+.1f} pts | {seeds} "
                f"| {noise.get(load, math.nan):.1f} pts | {h.ttft_ms['p99']:.0f} / {p.ttft_ms['p99']:.0f} |"
            )
    return "\n".join(lines)


def plot(results: Sequence[RunResult], heuristics: set[str], path: Path) -> None:
    """Per mix (columns): SLO attainment and TTFT p90 against load, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key = {(r.scenario, r.policy): r for r in results}
    mixes = _ordered(r.scenario.split(" / ")[0] for r in results)
    policies = _ordered(r.policy for r in results)
    predicted = [p for p in policies if p not in heuristics]
    cmap = plt.get_cmap("viridis")
    greys = plt.get_cmap("Greys")
    fig, axes = plt.subplots(2, len(mixes), figsize=(6.5 * len(mixes), 8.5), squeeze=False)
    for col, mix in enumerate(mixes):
        scenarios = [s for s in _ordered(r.scenario for r in results) if s.split(" / ")[0] == mix]
        labels = [s.split(" / ", 1)[1].replace(" near-", "\nnear-") for s in scenarios]
        for j, policy in enumerate(policies):
            if policy in heuristics:
                style = {"color": greys(0.4 + 0.5 * j / max(1, len(heuristics) - 1)), "linestyle": "--"}
            else:
                style = {"color": cmap(0.9 * predicted.index(policy) / max(1, len(predicted) - 1))}
            att = [100 * by_key[(s, policy)].attainment for s in scenarios]
            p90 = [by_key[(s, policy)].ttft_ms["p90"] for s in scenarios]
            axes[0][col].plot(range(len(scenarios)), att, marker="o", label=policy, **style)
            axes[1][col].plot(range(len(scenarios)), p90, marker="o", label=policy, **style)
        for row in (0, 1):
            axes[row][col].set_xticks(range(len(scenarios)))
            axes[row][col].set_xticklabels(labels)
            axes[row][col].grid(alpha=0.3)
        axes[0][col].set_title(f"{mix}: SLO attainment (TTFT and TPOT met)")
        axes[0][col].set_ylabel("% of all requests")
        axes[1][col].set_title(f"{mix}: TTFT p90")
        axes[1][col].set_ylabel("ms (log scale)")
        axes[1][col].set_yscale("log")
    axes[0][0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _share(r: RunResult) -> str:
    return f"{100 * r.fallback_decisions / r.arrivals:.1f}% ({r.fallback_decisions})"


def _att(r: RunResult) -> float:
    return r.attainment


def _ms(p: dict[str, float], digits: int = 0) -> str:
    return " / ".join(f"{p[k]:.{digits}f}" for k in ("p50", "p90", "p99"))


def _ordered(names: object) -> list[str]:
    seen: dict[str, None] = {}
    for name in names:  # type: ignore[attr-defined]
        seen.setdefault(name, None)
    return list(seen)
