"""The calibration figure of the accuracy report (matplotlib, Agg backend, one PNG).

Six panels, TTFT and TPOT side by side in each:

1. reliability: the observed quantile of the actual latency against the mean prediction, per
   decile of the predicted value (a calibrated model sits on the diagonal);
2. coverage per decile of the predicted value (a calibrated model stays in the target band);
3. to 5. coverage per queue-depth, KV-cache and prefix-score bin (the training server's bins),
   with each bin's sample count;
6. coverage over simulated time (rolling window), with the moments new model versions answered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

COLORS = {"ttft": "#1f77b4", "tpot": "#d62728"}
BAND = 0.02  # the design's calibration tolerance: +-2 points around the target


def calibration_figure(
    summaries: dict[str, dict[str, Any]],
    timelines: dict[str, tuple[np.ndarray, np.ndarray]],
    version_times_s: list[float],
    quantile: float,
    title: str,
    path: Path,
) -> None:
    """Write the figure. ``summaries[model]`` comes from ``accuracy_metrics.summarise``;
    ``timelines[model]`` is (simulated time, rolling coverage)."""
    fig, axes = plt.subplots(3, 2, figsize=(13, 13.5))
    target = quantile * 100
    _reliability(axes[0][0], summaries, quantile)
    _decile_coverage(axes[0][1], summaries, target)
    for ax, dim, name in zip(
        (axes[1][0], axes[1][1], axes[2][0]),
        ("waiting", "kv", "prefix"),
        ("queue depth (num_request_waiting)", "KV-cache utilisation", "prefix-cache score"),
        strict=True,
    ):
        _bin_coverage(ax, summaries, dim, name, target)
    _timeline(axes[2][1], timelines, version_times_s, target)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _band(ax: Any, target: float) -> None:
    ax.axhspan(target - BAND * 100, target + BAND * 100, color="#2ca02c", alpha=0.15, lw=0)
    ax.axhline(
        target, color="#2ca02c", lw=1, ls="--", label=f"target {target:g}% (band \u00b1{BAND * 100:g})"
    )


def _reliability(ax: Any, summaries: dict[str, dict[str, Any]], quantile: float) -> None:
    lo, hi = np.inf, 0.0
    for model, summary in summaries.items():
        rows = summary["per_decile"]
        x = np.array([r["predicted_mean_ms"] for r in rows])
        y = np.array([r["observed_quantile_ms"] for r in rows])
        ax.plot(x, y, "o-", color=COLORS[model], label=model.upper())
        lo, hi = min(lo, x.min(), y.min()), max(hi, x.max(), y.max())
    ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls=":", label="calibrated")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = [t for t in (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if lo / 1.5 <= t <= hi * 1.5]
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("mean predicted p%g per decile of prediction (ms)" % (quantile * 100))
    ax.set_ylabel("observed p%g of actual latency (ms)" % (quantile * 100))
    ax.set_title("Reliability: predicted quantile vs observed")
    ax.legend(loc="upper left")
    ax.grid(True, which="both", alpha=0.3)


def _decile_coverage(ax: Any, summaries: dict[str, dict[str, Any]], target: float) -> None:
    for model, summary in summaries.items():
        cov = [r["coverage"] * 100 for r in summary["per_decile"]]
        ax.plot(range(1, len(cov) + 1), cov, "o-", color=COLORS[model], label=model.upper())
    _band(ax, target)
    ax.set_xlabel("decile of the predicted value (1 = smallest predictions)")
    ax.set_ylabel("coverage: actual <= predicted (%)")
    ax.set_title("Coverage across predicted-value deciles")
    ax.set_xticks(range(1, 11))
    ax.set_ylim(min(50, ax.get_ylim()[0]), 100.5)
    ax.legend(loc="lower left")
    ax.grid(True, alpha=0.3)


def _bin_coverage(ax: Any, summaries: dict[str, dict[str, Any]], dim: str, name: str, target: float) -> None:
    labels = list(next(iter(summaries.values()))["per_bin"][dim])
    width = 0.4
    x = np.arange(len(labels))
    for i, (model, summary) in enumerate(summaries.items()):
        groups = summary["per_bin"][dim]
        cov = [groups[label]["coverage"] * 100 if label in groups else np.nan for label in labels]
        bars = ax.bar(x + (i - 0.5) * width, cov, width, color=COLORS[model], alpha=0.75, label=model.upper())
        for bar, label in zip(bars, labels, strict=True):
            n = groups.get(label, {}).get("samples", 0)
            ax.annotate(f"{n}", (bar.get_x() + bar.get_width() / 2, 2), ha="center", va="bottom",
                        fontsize=7, rotation=90, color="black")  # fmt: skip
    _band(ax, target)
    ax.set_xticks(x)
    ax.set_xticklabels([label.split("=", 1)[1] for label in labels], rotation=0)
    ax.set_xlabel(f"{name} bin (sample counts inside the bars)")
    ax.set_ylabel("coverage (%)")
    ax.set_ylim(0, 125)
    ax.set_yticks(range(0, 101, 20))
    ax.set_title(f"Coverage by {name}")
    ax.legend(loc="upper center", ncol=3, fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)


def _timeline(
    ax: Any, timelines: dict[str, tuple[np.ndarray, np.ndarray]], version_times_s: list[float], target: float
) -> None:
    for model, (t, cov) in timelines.items():
        ax.plot(t, cov * 100, color=COLORS[model], lw=1, label=model.upper())
    for i, t_s in enumerate(version_times_s):
        ax.axvline(t_s, color="grey", lw=0.6, ls=":", label="new version answers" if i == 0 else None)
    _band(ax, target)
    ax.set_xlabel("simulated time of routing (s)")
    ax.set_ylabel("rolling coverage (%)")
    ax.set_title("Coverage over time, first run (rolling 500 requests, warm-up included)")
    ax.set_ylim(0, 125)
    ax.set_yticks(range(0, 101, 20))
    ax.legend(loc="upper center", ncol=2, fontsize=8)
    ax.grid(True, alpha=0.3)


# --- issue #9 evidence figures (bench/accuracy_evidence.py) -------------------------------------


def reliability_grid(replays: list[dict[str, Any]], quantile: float, path: Path) -> None:
    """Coverage per decile of the predicted value, ours (trained models) against the naive baseline
    (on the requests it answered), one column per replay, TTFT on top and TPOT below."""
    from bench.accuracy_metrics import deciles

    cols = len(replays)
    fig, axes = plt.subplots(2, cols, figsize=(3.6 * cols, 7), squeeze=False)
    target = quantile * 100
    for c, replay in enumerate(replays):
        for r, model in enumerate(("ttft", "tpot")):
            ax = axes[r][c]
            s = replay["streams"][model]
            ours = s.subset(s.trained)
            naive = s.subset(~np.isnan(s.naive))
            for label, pred, act, color, marker in (
                ("ours", ours.predicted, ours.actual, COLORS[model], "o-"),
                ("naive", naive.naive, naive.actual, "#7f7f7f", "s--"),
            ):
                if len(act) >= 10:
                    cov = [d["coverage"] * 100 for d in deciles(pred, act, quantile)]
                    ax.plot(
                        range(1, len(cov) + 1),
                        cov,
                        marker,
                        color=color,
                        ms=4,
                        label=f"{label} (n={len(act)})",
                    )
            _band(ax, target)
            ax.set_ylim(0, 102)
            ax.set_xticks(range(1, 11))
            ax.set_title(f"{replay['name']}\n{model.upper()}", fontsize=9)
            if c == 0:
                ax.set_ylabel("coverage (%)")
            if r == 1:
                ax.set_xlabel("decile of the predicted value")
            ax.legend(loc="lower left", fontsize=7)
            ax.grid(True, alpha=0.3)
    fig.suptitle(
        f"Reliability: p{target:g} coverage by decile of the prediction (ours vs naive)", fontsize=11
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def step_timelines(replays: list[dict[str, Any]], quantile: float, path: Path) -> None:
    """Coverage per 10 simulated seconds around the step changes, ours against naive."""
    from bench.accuracy_targets import RECOVERY_BAND, WINDOW_S, window_coverage

    rows = len(replays)
    fig, axes = plt.subplots(rows, 2, figsize=(13, 3.2 * rows), squeeze=False)
    target = quantile * 100
    for r, replay in enumerate(replays):
        for c, model in enumerate(("ttft", "tpot")):
            ax = axes[r][c]
            s = replay["streams"][model]
            end = float(s.time_s.max()) if len(s) else 0.0
            known = ~np.isnan(s.naive)
            for label, t, covered, color, style in (
                ("ours", s.time_s, s.actual <= s.predicted, COLORS[model], "-"),
                ("naive", s.time_s[known], (s.actual <= s.naive)[known], "#7f7f7f", "--"),
            ):
                w = window_coverage(t, covered, 0.0, end, WINDOW_S)
                ax.plot([x[0] for x in w], [x[1] * 100 for x in w], style, color=color, lw=1.2, label=label)
            prior = s.time_s[~s.trained]
            if len(prior):
                ax.axvspan(0, float(prior.max()), color="#ff7f0e", alpha=0.08, lw=0, label="prior answering")
            for name, at, _ in replay["steps"]:
                ax.axvline(at, color="black", lw=0.8, ls=":")
                ax.annotate(name, (at, 3), fontsize=7, rotation=90, va="bottom", ha="right")
            ax.axhspan(
                target - RECOVERY_BAND * 100, target + RECOVERY_BAND * 100, color="#2ca02c", alpha=0.15, lw=0
            )
            ax.axhline(target, color="#2ca02c", lw=1, ls="--")
            ax.set_ylim(0, 102)
            ax.set_title(f"{replay['name']}: {model.upper()}", fontsize=9)
            ax.set_xlabel("simulated time of routing (s)")
            ax.set_ylabel(f"coverage per {WINDOW_S:g} s (%)")
            ax.legend(loc="lower right", fontsize=7)
            ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
