"""Writes ``docs/benchmarks-routing.md`` from one ``bench.routing_compare`` run."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.routing_report import TARGETS, paired_differences
from bench.routing_sim import SHEDDABLE_SHARE, SLO_CLASSES, RunResult


def verdicts(
    results: Sequence[RunResult],
    per_seed: Sequence[tuple[int, RunResult]],
    heuristics: set[str],
    noise: dict[str, float],
) -> list[str]:
    """Per scenario: the recommended policy, alone and with admission, against the best heuristic."""
    lines = []
    for scenario in dict.fromkeys(r.scenario for r in results):
        rows = {r.policy: r for r in results if r.scenario == scenario}
        h = max((r for r in rows.values() if r.policy in heuristics), key=lambda r: r.attainment)
        parts = []
        for name in TARGETS:
            p = rows.get(name)
            if p is None:
                continue
            diffs = paired_differences(per_seed, scenario, name, h.policy)
            parts.append(
                f"{name} {100 * p.attainment:.1f}% ({_pts(p, h)}; per seed "
                + ", ".join(f"{d:+.1f}" for d in diffs)
                + f"; TTFT p99 {p.ttft_ms['p99']:.0f} ms)"
            )
        lines.append(
            f"- **{scenario}**: best heuristic {h.policy} {100 * h.attainment:.1f}% "
            f"(TTFT p99 {h.ttft_ms['p99']:.0f} ms); " + "; ".join(parts) + f"; noise floor "
            f"{noise.get(scenario, float('nan')):.1f} pts."
        )
    return lines


def _pts(a: RunResult, b: RunResult) -> str:
    return f"{100 * (a.attainment - b.attainment):+.1f} pts"


def done_check(results: Sequence[RunResult], heuristics: set[str], noise: dict[str, float]) -> str:
    """The issue's targets, one row per scenario, each marked met or not met."""
    lines = [
        "| load | routing alone vs best heuristic | target | met | TTFT p99 no worse | with admission "
        "| target | met |",
        "|---|---:|---|---|---|---:|---|---|",
    ]
    for scenario in dict.fromkeys(r.scenario for r in results):
        rows = {r.policy: r for r in results if r.scenario == scenario}
        h = max((r for r in rows.values() if r.policy in heuristics), key=lambda r: r.attainment)
        alone, shed = rows.get(TARGETS[0]), rows.get(TARGETS[1])
        if alone is None or shed is None:
            continue
        hard = scenario.endswith(("high", "near-saturation"))
        d_alone = 100 * (alone.attainment - h.attainment)
        d_shed = 100 * (shed.attainment - h.attainment)
        floor = noise.get(scenario, 0.0)
        need_alone, need_shed = (2.0, 5.0) if hard else (-floor, None)
        ok_alone = d_alone >= need_alone
        tail_ok = alone.ttft_ms["p99"] <= h.ttft_ms["p99"]
        shed_cell = "" if need_shed is None else ("yes" if d_shed >= need_shed else "**no**")
        lines.append(
            f"| {scenario} | {d_alone:+.1f} pts | >= {need_alone:+.1f} | {'yes' if ok_alone else '**no**'} "
            f"| {'yes' if tail_ok else '**no**'} ({alone.ttft_ms['p99']:.0f} vs {h.ttft_ms['p99']:.0f} ms) "
            f"| {d_shed:+.1f} pts | {'' if need_shed is None else f'>= +{need_shed:.0f}'} | {shed_cell} |"
        )
    return "\n".join(lines)


OVERHEAD = """## Decision overhead

`.venv/bin/python -m bench.routing_overhead --decisions 1000` (real training and prediction
servers on loopback, one prediction worker; model trained on simulated traffic; then 1000
routing decisions on chat / high pod states, each decided twice, alternating the order: by
`SloHeadroom("spread")` with today's 8 rows per call, and by the placement-cost policy,
`default_policy(harm_weight=1)`, with 8 + 8 rows in the same single call). Measured on the
shared 2-core machine while seven other engineers ran tests and benchmarks (load average 12-16):

| | today (8 rows) | placement cost (16 rows) | added |
|---|---:|---:|---:|
| wall time over HTTP, p50 | 67.5 ms | 67.1 ms | paired p50 +1.06 ms |
| wall time over HTTP, p99 | 169.7 ms | 170.9 ms | +1.2 ms |
| CPU time in process (validation, features, forests, policy), p50 | 0.90 ms | 1.05 ms | paired p50 +0.16 ms |
| CPU time in process, p99 | 1.43 ms | 1.64 ms | +0.21 ms (paired p99 +0.61 ms) |

On this machine a decision's wall time is almost all waiting for a core (p50 67 ms, where an
idle machine answers a 10-row call in about a millisecond), so the wall-time difference is
within its noise and does not show whether the target (<= 1 ms p99 added at 8 pods) is met; the
CPU the extra rows cost is 0.2 ms at p99 (0.6 ms paired p99). `default_policy()` itself sends
no extra rows (its harm weight is 0), so it adds nothing.
"""


VERDICT = """**Verdict** (on the 2026-12-01 run; rewrite after a re-run). Routing alone, the recommended
policy does **not** beat the best heuristic: it is within -1.4 and +0.3 points of the best
heuristic everywhere, and at high and bursty loads 0.4 to 1.4 points *below* it, which is more
than the noise floor at three of those four loads. Its TTFT p99 is lower than the best
heuristic's at six of eight loads and 6% and 5% higher at the two bursty ones. With admission
(sheddable requests only, shed ones counted as misses) it is +8.1 points at chat bursty, but
+2.9, +2.5 and +0.1 at the other high and bursty loads, short of the +5 target; its TTFT p99 is
shorter than the best heuristic's at every load (1060 vs 3233 ms at chat bursty)."""


HISTORY = """## History of this benchmark

- Until this version the benchmark ran one evaluation seed (7) with 12000 requests per run and
  twelve policies; the best predicted-latency policy *by routing alone* tied the heuristics or
  lost to least-kv (chat / bursty: -6.3 points), and the large wins came from admission and
  from the "sacrifice" rule, which wrecks the TTFT tail. Those policies are still in
  `bench/routing_setup.py` (`--all-policies` evaluates slo-spread, prefix-affinity and
  slo-spread+admission too).
- This version evaluates the recommended policy (`scheduler_client.default_policy`) on three
  evaluation seeds, with shorter runs (4000 requests) so that a full run fits in the time a
  shared 2-core machine allows; the predictions come from the frozen model evaluated in process
  (the prediction server's code), which made the run about 4x cheaper than over HTTP.
- The placement-cost term (`PlacementCost`) was built for this version. On the validation seeds
  its harm weight made things slightly worse at every weight tried (0.1, 0.3, 1; see "How the
  settings were chosen"), so `default_policy` ships with weight 0. Why, as far as we can tell:
  the TPOT model's answer to "one more running request and this prompt in flight" is a step of
  a tree ensemble, often 0 or even negative for a single added request, so the harm estimate is
  noisy per decision; where it is not, it mostly repeats what the queue-depth term of the
  composite score already does.
- Also tried on validation seed 2002 only (4000 requests, high and bursty loads): the
  recommended shape plus 0.2 or 0.5 x the composite score as an extra term. Against composite
  alone: chat high -0.1 / +0.7, chat bursty +1.5 / +0.4, prefix-heavy high +0.1 / -0.3,
  prefix-heavy bursty -0.7 / -1.9 points (beta 0.5 / 0.2): ties within the noise, not evaluated.
"""


def write_report(
    path: Path,
    plot_path: Path,
    *,
    results: Sequence[RunResult],
    per_seed: Sequence[tuple[int, RunResult]],
    heuristics: set[str],
    noise: dict[str, float],
    seeds: Sequence[int],
    tuning: str,
    summary: str,
    table: str,
    model_status: dict[str, Any],
    version: str,
    mixes: Sequence[Any],
    policies: dict[str, str],
    argv: list[str],
    elapsed_s: float,
    requests: int,
    warmup_requests: int,
) -> None:
    metrics = model_status.get("current_metrics", {})
    samples = model_status.get("current_training_samples", {})
    slo_rows = "\n".join(
        f"| {name} | {100 * share:.0f}% | {ttft:.0f} | {tpot:.0f} |"
        for name, share, ttft, tpot in SLO_CLASSES
    )
    mix_rows = "\n".join(
        f"- **{mix.name}**: {mix.description}. Loads: "
        + ", ".join(
            f"{load.name} {load.offered_rps:g} req/s (burstiness {load.burstiness:g})" for load in mix.loads
        )
        + "."
        for mix in mixes
    )
    model_rows = "\n".join(
        f"| {name} | {m.get('samples')} | {100 * m.get('coverage', float('nan')):.1f}% "
        f"| {m.get('pinball_loss_ms', float('nan')):.2f} | {100 * m.get('mape', float('nan')):.1f}% "
        f"| {samples.get(name)} |"
        for name, m in metrics.items()
        if isinstance(m, dict)
    )
    policy_rows = "\n".join(f"| {name} | {text} |" for name, text in policies.items())
    command = " ".join([".venv/bin/python -m bench.routing_compare", *argv]).strip()
    text = f"""# Routing benchmark: predicted-latency policies vs heuristics

Generated by `{command}` on {datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} in {elapsed_s / 60:.0f} min.
Every number below comes from that one run: evaluation seeds {", ".join(str(x) for x in seeds)}
(workload, SLO classes and pod jitter), each policy's attainment pooled over them. The
simulator, the workloads and the policies' random draws are seeded; the model is trained afresh
by the training server on every run, so a re-run (or a change to the training server) can move
individual results a little.

## Summary

{summary}

{chr(10).join(verdicts(results, per_seed, heuristics, noise))}

### Against the issue's targets

Routing alone must beat the best heuristic by >= 2 points at high and bursty loads and never
fall below it by more than the noise floor; with admission, by >= 5 points at high and bursty
loads; TTFT p99 no worse than the best heuristic's.

{done_check(results, heuristics, noise)}

{VERDICT}

"SLO attainment" is the share of **all** arriving requests that completed within both their
TTFT and their TPOT SLO; a request shed by admission control counts as a miss.

![SLO attainment and TTFT p90 per load and policy]({plot_path.name})

## Setup

- **Pods**: 8 simulated vLLM-like pods (`stack/sim_pod.py` defaults: 2048-token steps, 131k-token
  KV cache, 65k-token prefix cache, chunked prefill, FIFO admission, preemption).
- **Workloads** ({requests} requests per run and seed; per seed, the same request sequence and
  pod seed for every policy; each load is the same sequence scaled in time to exactly the
  stated mean arrival rate; bursts are a two-state Markov-modulated Poisson process, 20% of
  the time in bursts):
{mix_rows}
- **SLO classes** (drawn per request from a seeded stream, independent of routing);
  {100 * SHEDDABLE_SHARE:.0f}% of requests are *sheddable*, whatever their class:

| class | share | TTFT SLO (ms) | TPOT SLO (ms) |
|---|---:|---:|---:|
{slo_rows}

### Policies

| policy | what it does |
|---|---|
{policy_rows}

### Predictions: the real services, one frozen model

1. A real `training_server` and `prediction_server` (2 worker processes) run on loopback ports;
   the training server's automatic retraining is off so the benchmark decides when models change.
2. Warm-up on the same mixes and loads but a **different seed** ({warmup_requests} requests per
   scenario): first routed by the heuristics, then by the predicted-latency policies on the model
   trained from that (so the model also sees the pod states those policies create). Every
   completed request is fed to the training server through `scheduler_client`'s `SampleFeeder`;
   after each round `POST /retrain?wait=true` trains and publishes.
3. Both services are then **stopped**, freezing the model at **`{version}`**; the evaluation
   predicts with that version in process, with the prediction server's own code (validation,
   features, compiled forests: `bench/routing_local.py`); every prediction reports that version
   (checked). Simulated time stands still during a prediction, so over HTTP or in process the
   simulated outcome is the same; in process there are no failed calls, so the "fallback
   decisions" column is 0 by construction here (the client's fallback is tested in
   `tests/unit/test_scheduler_client_*` and `tests/e2e/test_scheduler_client_e2e.py`).
4. The decision latency over HTTP, with and without the placement rows, is measured separately
   (`bench.routing_overhead`, below).

Model `{version}` on its held-out recent samples (the training server's own evaluation):

| target | held-out samples | p90 coverage | pinball loss (ms) | MAPE | training samples |
|---|---:|---:|---:|---:|---:|
{model_rows}

## How the settings were chosen

{tuning}

## All results

Pooled over the evaluation seeds. Best heuristic and best predicted-latency policy of each
scenario in bold. Latency percentiles are over completed requests (TPOT over those with more
than one output token), the mean over the seeds of each seed's percentile. Throughput and
goodput (completions within SLO) are per second of simulated time. "Fallback decisions" is the
share of decisions made by the composite fallback because predictions were missing.

{table}

## Reading it honestly

- **Machine**: a shared 2-core machine, busy with seven other engineers' tests and benchmarks
  while this ran; the wall-clock latencies of prediction calls do not change any simulated
  outcome (simulated time stands still during a call), but they limited how many requests
  and seeds fit in the run.
- **Noise**: the noise floor column is the largest change of composite's attainment when only
  its random tie-breaks change (per evaluation seed); the per-seed differences show how much
  the comparison moves between workload seeds, which is usually more. Runs are short
  ({requests} requests), so a burst or two decides much of a high-load run.
- The simulator's pods are identical and the wire features do not identify a pod, so the
  models learn a state-to-latency map shared by all pods; gains can only come from reading that
  state better than the heuristics do.
- Admission control sheds requests; its attainment counts them as misses, and the "rejected"
  column shows how many.

{OVERHEAD}
{HISTORY}"""
    path.write_text(text)
