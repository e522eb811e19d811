"""How far a model of the routing-time features could go on a simulator scenario: reference points
for the accuracy evidence's targets.

The evidence judges our served p90 against a naive sliding-window baseline measured on the same
stream (``bench.accuracy_naive``). This asks what any predictor of the same features could reach on
the same requests (routed at random, as the evidence routes them), with three references that no
online predictor can be, fitted with the naive baseline's trees (``fit_quantile_trees``):

- ``other seed``: fitted on a whole replay of the same scenario with the next seed, so it knows the
  workload's every regime but not this replay's moments: a static model at its best, out of sample.
- ``in sample``: fitted on this replay itself (optimistic: it has seen every answer).
- ``in sample + arrivals``: that, plus two columns no routing-time row holds: the requests and the
  prompt tokens routed to the same pod per second while this request decoded. The gap between it
  and ``in sample`` is what the traffic arriving after routing costs a p90 (bursts).
- ``in sample + pool rate``: ``in sample`` plus the one context a server could know at routing time
  beyond the row: the samples the whole pool completed per second in the ``POOL_RATE_S`` before
  this request was routed (what the training server sees arrive). Its gap to ``in sample`` bounds
  what a model given the pool's recent load could gain.

The naive baseline runs online as in the evidence: samples posted at completion, in 1 s flushes,
each request predicted before any sample of it. Each reference is summarised as the evidence
summarises ours (``bench.accuracy_targets.summarise_stream``) on the requests the naive baseline
answered after the first 60 s: coverage overall, per queue depth and per stage, pinball and its
ratio to the naive baseline's. ``bench/sim_calibration_replay.py --naive`` gives ours on the same
stream (its naive baseline's pinball matches this one's to within the flush timing).

    OMP_NUM_THREADS=1 .venv/bin/python bench/accuracy_ceiling.py --scenarios episodes --seeds 0 1 2 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.accuracy_metrics import dimension_bins  # noqa: E402
from bench.accuracy_naive import SlidingWindowBaseline, fit_quantile_trees  # noqa: E402
from bench.accuracy_steps import Scenario, selected  # noqa: E402
from bench.accuracy_targets import Stream, summarise_stream  # noqa: E402
from shared.features import build_features  # noqa: E402
from shared.schemas import parse_rows  # noqa: E402
from stack.sim_pod import Completion  # noqa: E402

MODELS = ("ttft", "tpot")
SKIP_S = 60.0  # the first minute: the naive baseline's first fit, and ours, come during it
REFERENCES = ("other seed", "in sample", "in sample + arrivals", "in sample + pool rate")
POOL_RATE_S = 5.0  # the horizon of the pool's recent completion rate


def naive_online(done: list[Completion], quantile: float) -> np.ndarray:
    """The naive baseline's (TTFT, TPOT) answer per request of ``done``: at each whole second it
    predicts the requests routed since the last, then learns the samples of those completed."""
    baseline = SlidingWindowBaseline(quantile)
    routed = sorted(range(len(done)), key=lambda k: done[k].routed_at_s)
    finished = sorted(range(len(done)), key=lambda k: done[k].finished_s)
    out = np.full((len(done), 2), np.nan)
    i = j = 0
    t = 1.0
    while j < len(finished):
        batch = []
        while i < len(routed) and done[routed[i]].routed_at_s < t:
            batch.append(routed[i])
            i += 1
        if batch:
            guess = baseline.predict([done[k].features for k in batch])
            out[batch, 0], out[batch, 1] = guess["ttft"], guess["tpot"]
        learned = []
        while j < len(finished) and done[finished[j]].finished_s < t:
            c = done[finished[j]]
            learned.append({**c.features, "actual_ttft_ms": c.ttft_ms, "actual_tpot_ms": c.tpot_ms})
            j += 1
        baseline.learn(learned)
        t += 1.0
    return out


def arrivals_while_decoding(done: list[Completion]) -> np.ndarray:
    """Per request, the requests and prompt tokens per second routed to its pod between its first
    token and its completion."""
    times: dict[int, list[float]] = {}
    tokens: dict[int, list[int]] = {}
    for c in sorted(done, key=lambda c: c.routed_at_s):
        times.setdefault(c.pod, []).append(c.routed_at_s)
        tokens.setdefault(c.pod, []).append(c.request.prompt_tokens)
    cumulative = {p: np.concatenate([[0], np.cumsum(v)]) for p, v in tokens.items()}
    out = np.zeros((len(done), 2))
    for k, c in enumerate(done):
        start, end = c.routed_at_s + c.ttft_ms / 1000.0, c.finished_s
        lo, hi = np.searchsorted(times[c.pod], [start, end], side="right")
        span = max(end - start, 1e-3)
        out[k] = (hi - lo) / span, (cumulative[c.pod][hi] - cumulative[c.pod][lo]) / span
    return out


def pool_rate_before_routing(done: list[Completion], horizon_s: float = POOL_RATE_S) -> np.ndarray:
    """Per request, the requests of any pod completed per second in the ``horizon_s`` before it was
    routed, as a ``(rows, 1)`` column."""
    finished = np.sort([c.finished_s for c in done])
    routed = np.array([c.routed_at_s for c in done])
    lo, hi = np.searchsorted(finished, routed - horizon_s), np.searchsorted(finished, routed)
    return ((hi - lo) / horizon_s)[:, None]


def references(
    scenario: Scenario, seed: int, quantile: float
) -> tuple[list[Completion], np.ndarray, dict[str, np.ndarray]]:
    """``seed``'s requests, the naive baseline's answers, and each reference's ((rows, 2) TTFT, TPOT)."""
    done = scenario.simulate(seed)
    other = scenario.simulate(seed + 1)
    x = build_features(parse_rows([c.features for c in done]))
    x_other = build_features(parse_rows([c.features for c in other]))
    x_arrivals = np.hstack([x, arrivals_while_decoding(done)]).astype(np.float32)
    x_rate = np.hstack([x, pool_rate_before_routing(done)]).astype(np.float32)
    out = {name: np.full((len(done), 2), np.nan) for name in REFERENCES}
    for col, m in enumerate(MODELS):
        y, y_other = (np.array([getattr(c, f"{m}_ms") for c in cs]) for cs in (done, other))
        keep, keep_other = y > 0, y_other > 0
        fitted = {
            "other seed": (x_other[keep_other], y_other[keep_other], x),
            "in sample": (x[keep], y[keep], x),
            "in sample + arrivals": (x_arrivals[keep], y[keep], x_arrivals),
            "in sample + pool rate": (x_rate[keep], y[keep], x_rate),
        }
        for name, (fit_x, fit_y, served_x) in fitted.items():
            out[name][:, col] = fit_quantile_trees(fit_x, fit_y, quantile).inplace_predict(served_x)
    return done, naive_online(done, quantile), out


def summaries(scenario: Scenario, seed: int, quantile: float) -> dict[str, dict[str, Any]]:
    """Per model and reference, ``summarise_stream``'s figures against the naive baseline."""
    done, naive, refs = references(scenario, seed, quantile)
    routed = np.array([c.routed_at_s for c in done])
    stage = np.array([scenario.phase(t) for t in routed.tolist()], dtype=object)
    waiting = np.array([c.features["num_request_waiting"] for c in done], float)
    bins = dimension_bins(parse_rows([c.features for c in done]))["waiting"]
    trained = np.ones(len(done), bool)  # no prior: every reference is a fitted model
    out: dict[str, dict[str, Any]] = {}
    for col, m in enumerate(MODELS):
        actual = np.array([getattr(c, f"{m}_ms") for c in done])
        keep = (actual > 0) & ~np.isnan(naive[:, col]) & (routed >= SKIP_S)
        out[m] = {}
        for name, predicted in refs.items():
            stream = Stream(routed, stage, waiting, bins, predicted[:, col], naive[:, col], actual, trained)
            out[m][name] = summarise_stream(stream.subset(keep), quantile)
    return out


def describe(label: str, s: dict[str, Any]) -> str:
    o = s["overall"]
    judged = {k.removeprefix("waiting="): v["coverage"] for k, v in s["depth"].items() if v["samples"] >= 50}
    depth = " ".join(f"{k}:{v:.2f}" for k, v in judged.items())
    stages = {k: v["coverage"] for k, v in s["stage"].items() if v["samples"] >= 50}
    worst = min(stages, key=lambda k: stages[k])
    return (
        f"{label}: coverage {o['coverage']:.3f} pinball {o['pinball_ms']:.3g} ms"
        f" (naive {o['naive_coverage']:.3f}, {o['naive_pinball_ms']:.3g} ms; ratio {o['ratio']:.2f})"
        f" by waiting {depth} worst stage {stages[worst]:.3f} ({worst})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", nargs="+", help="default: #9's three of bench.accuracy_steps")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--quantile", type=float, default=0.9)
    args = parser.parse_args(argv)
    for scenario in selected(args.scenarios):
        for seed in args.seeds:
            for m, refs in summaries(scenario, seed, args.quantile).items():
                for name, s in refs.items():
                    print(describe(f"{scenario.name} seed {seed} {m.upper()} {name}", s), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
