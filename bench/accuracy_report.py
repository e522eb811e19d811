"""Accuracy report: simulator traffic replayed through real servers, every prediction made in advance.

Starts a real training server and one prediction server (reading the training server's local
store) on loopback, replays a simulated workload through their HTTP API (``bench.accuracy_replay``:
each request's routing-time rows are predicted before it runs; completions are fed back every
simulated second, so the training server retrains and publishes as in production, with faster
retrain triggers), and reports TTFT and TPOT coverage, pinball loss and MAPE overall, per stratum,
per bin, per decile of the predicted value and per model version, plus a calibration figure.
Requests answered by the prior (before the first trained version served) are the warm-up and are
excluded. Each seed is a separate run with fresh servers; the table gives each run and the median,
the strata, bins and figure pool the runs.

    .venv/bin/python bench/accuracy_report.py --seeds 0 1 2 \
        --out docs/accuracy-history.md --plot docs/accuracy-calibration.png
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.accuracy_doc import write_block  # noqa: E402
from bench.accuracy_metrics import MIN_REPORTED, Scored, dimension_bins, summarise, worst  # noqa: E402
from bench.accuracy_plot import calibration_figure  # noqa: E402
from bench.accuracy_replay import ReplayConfig, ReplayResult, replay  # noqa: E402
from tests.procs import start_service  # noqa: E402
from training_server.window import stratum_ids  # noqa: E402

MODELS = ("ttft", "tpot")
# Production settings except the retrain triggers, which fire more often so that a few
# simulated minutes see many versions (the default waits for 5,000 samples or a minute).
TRAINING_FLAGS = [
    "--min-new-samples", "1000",
    "--retrain-interval-s", "5",
    "--retrain-min-gap-s", "1",
    "--keep-versions", "1000",
]  # fmt: skip
PREDICTION_FLAGS = ["--poll-interval-s", "0.1"]
BEGIN, END = "<!-- accuracy-report:begin -->", "<!-- accuracy-report:end -->"
ROLLING = 500


def run_once(cfg: ReplayConfig, workdir: Path) -> tuple[ReplayResult, dict[str, Any]]:
    """One replay against fresh servers; returns it and the training server's view of it."""
    data_dir = workdir / f"seed{cfg.seed}"
    logs = data_dir / "logs"
    training = start_service("training_server", ["--data-dir", str(data_dir), *TRAINING_FLAGS], log_dir=logs)
    try:
        prediction = start_service(
            "prediction_server",
            ["--store", str(data_dir / "models"), *PREDICTION_FLAGS],
            log_dir=logs,
            ready_path="/readyz",
        )
        try:
            result = replay(cfg, prediction.url, training.url)
        finally:
            prediction.stop()
        server = {"seed": cfg.seed, **_training_view(training.url, set(result.versions))}
    finally:
        training.stop()
    return result, server


def _training_view(url: str, versions: set[str]) -> dict[str, Any]:
    """Retrain count and, per answering version, the trainer's own held-out estimate."""
    with httpx.Client(timeout=10) as client:
        status = client.get(url + "/status").json()
        held_out: dict[str, dict[str, float | None]] = {}
        for version in sorted(versions):
            response = client.get(f"{url}/models/versions/{version}/manifest.json")
            if response.status_code != 200:
                continue
            manifest = orjson.loads(response.content)
            held_out[version] = {
                name: (manifest["metrics"].get(name) or {}).get("overall", {}).get("coverage")
                for name in MODELS
            }
    return {"retrains": status["training"]["runs"], "held_out_coverage": held_out}


def after_warmup(result: ReplayResult, warmup_s: float, model: str | None = None) -> np.ndarray:
    """Requests trained trees of ``model`` (default: of both models) answered, routed at or after
    ``warmup_s`` simulated seconds."""
    trained = result.trained(model) if model else result.trained("ttft") & result.trained("tpot")
    return np.asarray(trained & (result.array("routed_at_s") >= warmup_s))


def scored(results: list[ReplayResult], model: str, warmup_s: float) -> Scored:
    """One model's predictions after the warm-up, pooled over runs (versions prefixed by seed)."""
    parts = []
    for r in results:
        keep = after_warmup(r, warmup_s, model)
        columns = {k: v[keep] for k, v in r.columns().items()}
        parts.append(
            (
                r.array(f"predicted_{model}_ms")[keep],
                r.array(f"actual_{model}_ms")[keep],
                stratum_ids(columns),
                dimension_bins(columns),
                np.array([f"s{r.config.seed}/{v}" for v in r.array("versions")[keep]], dtype=object),
            )
        )
    return Scored(
        predicted=np.concatenate([p[0] for p in parts]),
        actual=np.concatenate([p[1] for p in parts]),
        strata=np.concatenate([p[2] for p in parts]),
        bins={dim: np.concatenate([p[3][dim] for p in parts]) for dim in parts[0][3]},
        versions=np.concatenate([p[4] for p in parts]),
    )


def rolling(result: ReplayResult, model: str) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(result.array("routed_at_s"), kind="stable")
    t = result.array("routed_at_s")[order]
    covered = (result.array(f"actual_{model}_ms") <= result.array(f"predicted_{model}_ms"))[order]
    kernel = np.ones(ROLLING) / ROLLING
    return t[ROLLING - 1 :], np.convolve(covered.astype(float), kernel, mode="valid")


def version_times(result: ReplayResult) -> list[float]:
    """Simulated routing times at which a new version first answered (after the first one)."""
    order = np.argsort(result.array("routed_at_s"), kind="stable")
    seen: set[str] = set()
    times = []
    for i in order.tolist():
        version = result.versions[i]
        if version not in seen:
            if seen:
                times.append(result.routed_at_s[i])
            seen.add(version)
    return times


def per_run_row(
    result: ReplayResult, server: dict[str, Any], quantile: float, warmup_s: float
) -> dict[str, Any]:
    keep = after_warmup(result, warmup_s)
    trained = after_warmup(result, 0.0)
    routed = result.array("routed_at_s")
    row: dict[str, Any] = {
        "seed": result.config.seed,
        "requests": len(result.rows),
        "warmup_requests": int((~keep).sum()),
        "warmup_sim_s": float(routed[~keep].max()) if (~keep).any() else 0.0,
        "prior_requests": int((~trained).sum()),
        "prior_sim_s": float(routed[~trained].max()) if (~trained).any() else 0.0,
        "versions": len(set(result.array("versions")[keep].tolist())),
        "retrains": server["retrains"],
        "wall_s": result.wall_s,
    }
    for model in MODELS:
        row[model] = summarise(scored([result], model, warmup_s), quantile)["overall"]
        row[f"{model}_all_trained"] = summarise(scored([result], model, 0.0), quantile)["overall"]
    return row


def markdown(
    command: str, cfg: ReplayConfig, runs: list[dict[str, Any]], pooled: dict[str, dict[str, Any]],
    servers: list[dict[str, Any]], plot: Path | None, quantile: float, warmup_s: float,
) -> str:  # fmt: skip
    target = quantile * 100
    lines = [
        BEGIN,
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {len(runs)} run(s) of {cfg.duration_s:g} "
        f"simulated s at {cfg.rate_rps:g} requests/s (bursty) over {cfg.pods} pods, {cfg.routing} routing, "
        f"replayed at {cfg.speed:g}x real time. Training server flags: `{' '.join(TRAINING_FLAGS)}` "
        f"(all else default: p{target:g} quantile objective, 150 rounds, depth 6).",
        "",
        "Command:",
        "",
        "```",
        command,
        "```",
        "",
        f"Warm-up excluded: requests routed in the first {warmup_s:g} simulated seconds (the window has "
        "seen only a few bursts by then) and any request the prior answered (before the first trained "
        "version served). Per run:",
        "",
        "| seed | requests | warm-up (requests / sim s) | versions | TTFT coverage | TTFT pinball (x const) "
        "| TTFT MAPE | TPOT coverage | TPOT pinball (x const) | TPOT MAPE |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['seed']} | {r['requests']} | {r['warmup_requests']} / {r['warmup_sim_s']:.0f} "
            f"| {r['versions']} | " + " | ".join(_cells(r[m]) for m in MODELS) + " |"
        )
    med = {m: {k: statistics.median(r[m][k] for r in runs) for k in _KEYS} for m in MODELS}
    lines.append("| **median** | | | | " + " | ".join(_cells(med[m]) for m in MODELS) + " |")
    lines += [
        "",
        "Without the warm-up cut (every request a trained version answered, from the first one on):",
        "",
        "| seed | requests | prior answered (requests / sim s) | TTFT coverage | TTFT pinball (x const) "
        "| TTFT MAPE | TPOT coverage | TPOT pinball (x const) | TPOT MAPE |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        trained = {m: r[f"{m}_all_trained"] for m in MODELS}
        lines.append(
            f"| {r['seed']} | {trained['ttft']['samples']} | {r['prior_requests']} / "
            f"{r['prior_sim_s']:.0f} | " + " | ".join(_cells(trained[m]) for m in MODELS) + " |"
        )
    lines.append("")
    lines.append(f"Pooled over the runs ({pooled['ttft']['overall']['samples']} requests after warm-up):")
    lines.append("")
    for m in MODELS:
        o = pooled[m]["overall"]
        lines.append(
            f"- **{m.upper()}**: coverage {o['coverage'] * 100:.1f}% (target {target:g}%), pinball "
            f"{o['pinball_loss_ms']:.2f} ms = {o['pinball_vs_constant']:.2f}x the best constant in hindsight "
            f"({o['constant_pinball_loss_ms']:.2f} ms), MAPE {o['mape'] * 100:.1f}%"
        )
    lines += ["", "Coverage per bin (pooled; the training server's bins):", ""]
    lines.append("| bin | requests | TTFT coverage | TTFT MAPE | TPOT coverage | TPOT MAPE |")
    lines.append("|---|---|---|---|---|---|")
    for dim in ("waiting", "kv", "prefix"):
        for label, t in pooled["ttft"]["per_bin"][dim].items():
            p = pooled["tpot"]["per_bin"][dim].get(label, {"coverage": float("nan"), "mape": float("nan")})
            lines.append(
                f"| {label} | {t['samples']} | {t['coverage'] * 100:.1f}% | {t['mape'] * 100:.1f}% | "
                f"{p['coverage'] * 100:.1f}% | {p['mape'] * 100:.1f}% |"
            )
    lines += [
        "",
        f"Worst strata (full window strata with >= {MIN_REPORTED} requests, furthest from target):",
        "",
    ]
    for m in MODELS:
        strata = pooled[m]["per_stratum"]
        ranked = sum(1 for v in strata.values() if v["samples"] >= MIN_REPORTED)
        lines.append(f"- {m.upper()} ({ranked} strata ranked):")
        for label, v in worst(strata, quantile):
            lines.append(
                f"  - `{label}`: coverage {v['coverage'] * 100:.1f}%, MAPE {v['mape'] * 100:.1f}%, "
                f"{v['samples']} requests"
            )
    lines += ["", "Per model version (pooled): measured coverage vs the trainer's own held-out estimate:", ""]
    lines.append("| version | requests | TTFT measured / held-out | TPOT measured / held-out |")
    lines.append("|---|---|---|---|")
    held = {f"s{s['seed']}/{v}": c for s in servers for v, c in s["held_out_coverage"].items()}
    for version, t in pooled["ttft"]["per_version"].items():
        p = pooled["tpot"]["per_version"].get(version)
        h = held.get(version, {})
        lines.append(
            f"| {version} | {t['samples']} | {t['coverage'] * 100:.1f}% / {_pct(h.get('ttft'))} | "
            f"{_pct(p['coverage'] if p else None)} / {_pct(h.get('tpot'))} |"
        )
    spread = {
        m: [v["coverage"] for v in pooled[m]["per_version"].values() if v["samples"] >= 200] for m in MODELS
    }
    lines += [""]
    for m in MODELS:
        if spread[m]:
            lines.append(
                f"- {m.upper()} coverage per version (>= 200 requests): min {min(spread[m]) * 100:.1f}%, "
                f"max {max(spread[m]) * 100:.1f}%, sd {np.std(spread[m]) * 100:.1f} points"
            )
    if plot is not None:
        lines += ["", f"![calibration]({plot.name})"]
    lines.append(END)
    return "\n".join(lines)


_KEYS = ("coverage", "pinball_loss_ms", "pinball_vs_constant", "mape")


def _cells(o: dict[str, Any]) -> str:
    return (
        f"{o['coverage'] * 100:.1f}% | {o['pinball_loss_ms']:.2f} ({o['pinball_vs_constant']:.2f}x) | "
        f"{o['mape'] * 100:.1f}%"
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--duration-s", type=float, default=ReplayConfig.duration_s, help="simulated seconds")
    parser.add_argument("--rate-rps", type=float, default=ReplayConfig.rate_rps)
    parser.add_argument("--pods", type=int, default=ReplayConfig.pods)
    parser.add_argument("--routing", choices=["random", "round-robin"], default=ReplayConfig.routing)
    parser.add_argument("--speed", type=float, default=ReplayConfig.speed, help="simulated s per wall s")
    parser.add_argument("--quantile", type=float, default=0.9, help="the servers' default quantile")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=120.0,
        help="simulated seconds excluded at the start (and whatever the prior answered)",
    )
    parser.add_argument("--out", type=Path, help="Markdown file whose generated block is (re)written")
    parser.add_argument("--plot", type=Path, help="calibration figure (PNG)")
    parser.add_argument("--json", type=Path, help="also write the full summary as JSON")
    args = parser.parse_args(argv)
    command = ".venv/bin/python bench/accuracy_report.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    results: list[ReplayResult] = []
    servers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="accuracy-") as tmp:
        for seed in args.seeds:
            cfg = ReplayConfig(args.pods, args.rate_rps, args.duration_s, seed, args.routing, args.speed)
            started = time.monotonic()
            result, server = run_once(cfg, Path(tmp))
            results.append(result)
            servers.append(server)
            print(f"seed {seed}: {len(result.rows)} requests, {server['retrains']} retrains, "
                  f"{time.monotonic() - started:.0f} s wall", flush=True)  # fmt: skip
    runs = [per_run_row(r, s, args.quantile, args.warmup_s) for r, s in zip(results, servers, strict=True)]
    pooled = {m: summarise(scored(results, m, args.warmup_s), args.quantile) for m in MODELS}
    cfg = results[0].config
    if args.plot is not None:
        title = (
            f"p{args.quantile * 100:g} calibration, {len(results)} run(s) x {cfg.duration_s:g} simulated s, "
            f"{cfg.rate_rps:g} req/s over {cfg.pods} pods ({cfg.routing} routing), "
            f"first {args.warmup_s:g} s excluded"
        )
        timelines = {m: rolling(results[0], m) for m in MODELS}
        calibration_figure(pooled, timelines, version_times(results[0]), args.quantile, title, args.plot)
    block = markdown(command, cfg, runs, pooled, servers, args.plot, args.quantile, args.warmup_s)
    print(block)
    if args.out is not None:
        write_block(args.out, block, BEGIN, END)
    if args.json is not None:
        args.json.write_bytes(
            orjson.dumps({"runs": runs, "pooled": pooled, "servers": servers}, option=orjson.OPT_INDENT_2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
