"""Writes ``docs/benchmarks-routing.md`` from one ``bench.routing_compare`` run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.routing_report import TARGETS, paired_differences
from bench.routing_setup import HARD_LOADS
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


@dataclass(frozen=True)
class _Target:
    """One scenario's recommended policy, alone and with admission, against the best heuristic."""

    scenario: str
    hard: bool  # a high or bursty load: the issue's +2 / +5 targets apply
    heuristic: RunResult
    alone: RunResult
    need_alone: float  # points over the best heuristic routing alone must reach
    need_shed: float | None  # the same with admission (None: no target at this load)
    d_alone: float
    d_shed: float

    @property
    def ok_alone(self) -> bool:
        return self.d_alone >= self.need_alone

    @property
    def ok_shed(self) -> bool:
        return self.need_shed is not None and self.d_shed >= self.need_shed

    @property
    def shed_attainable(self) -> bool:
        """Whether the target with admission is reachable at all: attainment cannot pass 100 %."""
        return self.need_shed is None or 100 * self.heuristic.attainment + self.need_shed <= 100.0

    @property
    def tail_ok(self) -> bool:
        return self.alone.ttft_ms["p99"] <= self.heuristic.ttft_ms["p99"]

    @property
    def p99(self) -> str:
        return f"({self.alone.ttft_ms['p99']:.0f} vs {self.heuristic.ttft_ms['p99']:.0f} ms)"


def _targets(results: Sequence[RunResult], heuristics: set[str], noise: dict[str, float]) -> list[_Target]:
    out = []
    for scenario in dict.fromkeys(r.scenario for r in results):
        rows = {r.policy: r for r in results if r.scenario == scenario}
        h = max((r for r in rows.values() if r.policy in heuristics), key=lambda r: r.attainment)
        alone, shed = rows.get(TARGETS[0]), rows.get(TARGETS[1])
        if alone is None or shed is None:
            continue
        hard = scenario.endswith(HARD_LOADS)
        need_alone, need_shed = (2.0, 5.0) if hard else (-noise.get(scenario, 0.0), None)
        d_alone = 100 * (alone.attainment - h.attainment)
        d_shed = 100 * (shed.attainment - h.attainment)
        out.append(_Target(scenario, hard, h, alone, need_alone, need_shed, d_alone, d_shed))
    return out


def done_check(results: Sequence[RunResult], heuristics: set[str], noise: dict[str, float]) -> str:
    """The issue's targets, one row per scenario, each marked met or not met."""
    lines = [
        "| load | routing alone vs best heuristic | target | met | TTFT p99 no worse | with admission "
        "| target | met |",
        "|---|---:|---|---|---|---:|---|---|",
    ]
    for c in _targets(results, heuristics, noise):
        shed_cell = "" if c.need_shed is None else ("yes" if c.ok_shed else "**no**")
        shed_target = "" if c.need_shed is None else f">= +{c.need_shed:.0f}"
        lines.append(
            f"| {c.scenario} | {c.d_alone:+.1f} pts | >= {c.need_alone:+.1f} "
            f"| {'yes' if c.ok_alone else '**no**'} | {'yes' if c.tail_ok else '**no**'} {c.p99} "
            f"| {c.d_shed:+.1f} pts | {shed_target} | {shed_cell} |"
        )
    return "\n".join(lines)


def verdict(results: Sequence[RunResult], heuristics: set[str], noise: dict[str, float]) -> str:
    """The verdict of this run against the issue's targets, from its numbers."""
    checks = _targets(results, heuristics, noise)
    hard = [c for c in checks if c.hard]
    easy = [c for c in checks if not c.hard]

    def listing(rows: list[_Target], shed: bool = False) -> str:
        return ", ".join(f"{c.d_shed if shed else c.d_alone:+.1f} ({c.scenario})" for c in rows)

    below = [c.scenario for c in easy if not c.ok_alone]
    long_tail = [f"{c.scenario} {c.p99}" for c in checks if not c.tail_ok]
    tail = (
        "longer than the best heuristic's at " + ", ".join(long_tail)
        if long_tail
        else "no worse than the best heuristic's at every load"
    )
    floor = (
        "below the best heuristic by more than the noise floor at " + ", ".join(below)
        if below
        else "never below the best heuristic by more than the noise floor"
    )
    return (
        f"**Verdict of this run** (generated from the rows above). Routing alone, the recommended "
        f"policy meets the +2-point target at {sum(c.ok_alone for c in hard)} of {len(hard)} high and "
        f"bursty loads: {listing(hard)} points. At low and medium load it is {floor} ({listing(easy)}). "
        f"Its TTFT p99 is {tail}. With admission (sheddable requests only, shed ones counted as "
        f"misses) it meets the +5-point target at {sum(c.ok_shed for c in hard)} of {len(hard)}: "
        f"{listing(hard, shed=True)} points."
        + "".join(
            f" At {c.scenario} that target is out of reach by construction: the best heuristic's "
            f"{100 * c.heuristic.attainment:.1f}% + {c.need_shed:.0f} points is more than 100%."
            for c in hard
            if not c.shed_attainable and c.need_shed is not None
        )
    )


OVERHEAD = """## Decision overhead

`.venv/bin/python -m bench.routing_overhead --decisions 1000` (real training and prediction
servers on loopback, one prediction worker; model trained on simulated traffic; then 1000
routing decisions on chat / high pod states, each decided three times, rotating the order: by
`SloHeadroom("spread")` with today's 8 rows per call; by `default_policy()` (then the chance
objective, physics harm term and cache term; the harm comes from the rows, so 8 rows; the
expected-attainment objective of the current version sends the same rows and adds one `exp` and
two products per candidate); and by
`default_policy(harm="tpot", harm_weight=1)`, the model-based harm, with 8 + 8 rows in the same
single call). Measured on 2026-12-02 on the shared 2-core machine, once at nice 15 while other
engineers' tests ran (load average 2-3) and once pinned to one core (`taskset -c 1`, client and
both services on the same core, normal priority):

| | today (8 rows) | `default_policy()` (8 rows) | model-based harm rows (16 rows) |
|---|---:|---:|---:|
| wall time over HTTP, p50 (pinned) | 1.95 ms | 1.96 ms | 2.05 ms |
| wall time over HTTP, p99 (pinned) | 7.18 ms | 7.30 ms (+0.12 ms) | 7.34 ms (+0.15 ms) |
| wall time over HTTP, p99 (nice 15) | 7.57 ms | 9.49 ms (+1.92 ms) | 8.95 ms (+1.38 ms) |
| CPU time in process (validation, features, forests, policy), p50 (pinned) | 0.26 ms | 0.29 ms | 0.34 ms |
| CPU time in process, p99 (pinned) | 0.33 ms | 0.35 ms (+0.03 ms) | 0.42 ms (+0.10 ms) |
| paired CPU difference to today, p50 / p99 (pinned) | | +0.03 / +0.09 ms | +0.08 / +0.15 ms |

The target (<= 1 ms added at p99 at 8 pods) is met: the recommended policy sends the same 8
rows as today and its physics term adds 0.03 ms of CPU at p99 (0.09 ms paired); the 16-row
model-based harm call adds 0.10 ms (0.15 ms paired). The wall-time p99s over HTTP are the
machine's scheduling noise: unpinned at nice 15, the policy that sends exactly today's rows
came out 1.9 ms slower at p99; pinned, all three are within 0.15 ms (the paired wall p99,
about +5.4 ms for both, is two back-to-back calls of which one waited for the core).

Re-measured on 2026-12-05 with the expected-attainment objective (`taskset -c 1 .venv/bin/python
-m bench.routing_overhead --decisions 1000`, pinned as above): CPU in process p50 / p99 0.201 /
0.897 ms today, 0.220 / 0.920 ms `default_policy()`, 0.262 / 0.979 ms with the 16 model-based
harm rows; `default_policy()` adds +0.022 ms at p99 (paired p50 / p99 +0.019 / +0.077 ms). Over
HTTP its p99 was 6.2 ms against today's 6.7 ms, the core's scheduling noise again.

Re-measured on 2026-12-06 with the decode term and the prefill cost (the same command, three runs,
medians): CPU in process p50 / p99 0.204 / 0.863 ms today, 0.228 / 0.906 ms `default_policy()`,
which adds +0.044 ms at p99 (paired p50 / p99 +0.024 / +0.150 ms); over HTTP its p99 was 5.95 ms
against today's 6.59 ms. The two terms are a few arithmetic operations per candidate from the rows.

Re-measured on 2026-12-06 with the harm admission test, `default_policy(admission=True)` a fourth
policy in the rotation (the same command, three runs, medians): CPU in process p50 / p99 0.251 /
0.949 ms today, 0.279 / 1.022 ms `default_policy()`, 0.282 / 0.962 ms `default_policy(admission=True)`,
which adds +0.013 ms at p99 over today (paired p50 / p99 +0.030 / +0.199 ms); over HTTP its p99 was
5.76 ms against today's 7.56 ms. The test is one chance and one harm per candidate, from the rows and
predictions the policy already has.
"""


ROLLOUT = """## How much routing alone can gain here: a clairvoyant reference (`bench.routing_rollout`)

```
OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_rollout --seeds 7,8,9 --ttft-cost 0,1
```

The routing-alone target (+2 points at high and bursty loads, TTFT p99 no worse) has been missed at
two or more of the four loads by every variant tried so far (History, below). To tell a weak policy from a
small room, `bench.routing_rollout` routes the same scenarios and evaluation seeds with knowledge no
scheduler has: for each candidate pod it copies the pod's simulator state (queues, KV, prefix
cache, the seeded step jitter), places the request on the copy and runs it until every request there
has finished, with no further arrivals. It picks the pod where the placement adds the most requests
meeting both SLOs, the request itself and the pod's others (the exact version of the recommended
policy's own chance and harm terms), less a TTFT cost per second of the request's own TTFT (as the
recommended policy's TTFT term; ties: the shorter TTFT). It needs no model, so its rows are
deterministic, and composite's are the page's. Measured on 2026-12-06 (25 min on 2 cores), pooled
over seeds 7-9; the recommended policy's rows are this page's (a fresh model):

Attainment over composite's in points, TTFT p99 in brackets (ms):

| load | composite, % | recommended (this page) | rollout, no TTFT cost | rollout, TTFT cost 1/s |
|---|---:|---:|---:|---:|
| chat / high | 83.4 (858) | +1.7 (942) | +3.3 (2460) | +2.1 (860) |
| chat / bursty near-saturation | 64.3 (3233) | +3.1 (3138) | +9.9 (14328) | +2.4 (2997) |
| prefix-heavy / high | 95.5 (555) | +1.3 (352) | +1.7 (529) | +1.6 (500) |
| prefix-heavy / bursty near-saturation | 71.7 (3662) | +1.0 (3112) | +2.0 (8508) | +0.1 (3459) |

- Knowing each placement's exact consequence for the requests already on the pod, one request at a
  time, meets the target (+2 points and a TTFT p99 no longer than composite's) at chat / bursty only;
  at chat / high it gains +2.1 points with a p99 2 ms longer than composite's. At the prefix-heavy
  loads it gains +1.6 and +0.1 points, against the recommended policy's +1.3 and +1.0.
- Without the TTFT cost it gains more (+3.3, +9.9, +1.7, +2.0 points) by sending requests that
  will miss anyway behind long queues where they harm nobody: the "sacrifice" rule, with a TTFT p99
  2.3-4.4x composite's at three of the four loads.
- It is not an upper bound: it ignores the requests still to come (what it places now delays them,
  a prefix it caches now serves them). A router that anticipated them (say, kept prefix families on
  their pods for the requests that follow) could do better. But that is a decision about the future
  arrivals, which no prediction of the current request's TTFT and TPOT answers.
- So on this simulator the routing-alone target is at or beyond what choosing a pod per request can
  reach with a tail no worse than composite's. The recommended policy, with predictions instead of
  exact copies, is within 0.4 points of the reference at chat / high and prefix-heavy / high, and
  ahead of it at both bursty loads (+3.1 against +2.4, +1.0 against +0.1).
"""


ONLINE = """## A second setting: a model learnt online, one SLO, slower pods (`bench.routing_online`)

Everything above routes with one frozen model on our default pods and three SLO classes. Issue #10
measured another setting: fresh servers learning while they route, 6 pods of a larger model, one
SLO for every request (2 s TTFT, 100 ms TPOT), half the requests sharing prefixes, a bursty trace.
`bench/routing_online.py` is that shape on our simulator: 6 pods at `PodConfig(slowdown=2.5)`
(TPOT p50 75-85 ms under load), `shared_prefix_prob=0.5`, burstiness 0.6, 8000 requests per run,
and the training server's own pieces in process from the prior on, fed every completion and
retrained on the service's default schedule (about 45 retrains per run); a predicted-latency
policy predicts with the version serving at that moment. Its validation seeds (2002-2004) chose the
structure of the default policy's decode term and prefill cost (History, below); its evaluation
seeds (7, 8, 9) are reported here.

### The default policy here (since 2026-12-06)

```
OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_online --rps 14|17|20|24 \\
    --variant 'previous default={"decode_equivalent_tokens": 0, "prefill_cost_per_ktoken": 0}'
```

Measured on 2026-12-06 (seeds 7, 8, 9; about 2.5 min per load on 2 cores), SLO attainment pooled
over the seeds; `recommended` is `default_policy()` with the decode term and the prefill cost,
`previous default` the same without them (the `recommended` of the subsections after this one):

| load | least-queue | least-kv | composite | recommended | previous default |
|---|---:|---:|---:|---:|---:|
| 14 req/s | 78.8% | 78.6% | 79.6% | 78.7% | 77.4% |
| 17 req/s | 64.9% | 67.7% | 65.9% | 64.9% | 64.8% |
| 20 req/s | 57.4% | 58.0% | 58.0% | 57.4% | 57.2% |
| 24 req/s | 47.3% | 50.4% | 48.0% | 48.3% | 48.0% |

The share of requests that missed their TPOT objective, at 14 / 17 / 20 / 24 req/s: least-queue
9.5 / 16.5 / 21.3 / 26.1%, least-kv 10.6 / 15.6 / 20.4 / 24.4%, composite 9.0 / 15.3 / 20.0 / 26.2%,
recommended 13.5 / 23.0 / 28.7 / 33.7%, previous default 15.0 / 22.9 / 29.4 / 34.5%. TTFT p99 (s,
mean over the seeds): least-queue 14.5 / 23.2 / 32.9 / 43.2, least-kv 22.6 / 39.3 / 42.7 / 67.1,
composite 14.2 / 22.2 / 32.9 / 43.8, recommended 12.5 / 21.3 / 30.6 / 41.8, previous default 13.7 /
23.2 / 32.7 / 46.3.

On these evaluation seeds the two terms gain little: +1.3,
+0.1, +0.2 and +0.3 points over the previous default (on the validation seeds 2002-2004, where they
were chosen: +1.4 at 17 and +0.9 at 20 req/s), and the recommended policy still does **not** beat
the heuristics here: -0.6 to -2.8 points against the best one (least-kv at 17-24 req/s). What they
do change is the TTFT tail: its p99 is now the shortest in the table at every load, 4-12% under
composite's (the previous default's was longer than composite's at 17 and 24 req/s). The TPOT
misses are still the gap (23.0% against 15.3-16.5% for the heuristics at 17 req/s): the decode term
of 4000 is what the main benchmark's tail criterion allowed; 8000 with the hopeless rule cut them
to 17.6% here (below), with the main benchmark's chat / bursty tail 2% over composite's.

### Before: the previous default at 20-24 req/s (2026-12-05)

The commands in this subsection and the next ran when `default_policy` had no prefill cost and no
decode term. To repeat them now, run the previous default as the variant of the first subsection
and add `"prefill_cost_per_ktoken": 0` to each variant here (and `"decode_equivalent_tokens": 0`
where it sets none).

```
OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_online --rps 20 \\
    --variant 'harm 0.02, TTFT 0.1/s={"harm_weight": 0.02, "ttft_cost_per_s": 0.1}' \\
    --variant 'decode 8000, hopeless 0.05={"decode_equivalent_tokens": 8000, "hopeless_chance": 0.05}'
```

Measured on 2026-12-05 (seeds 7, 8, 9; about 100 s per load on 2 cores), SLO attainment pooled over
the seeds, then the share of requests that missed their TTFT / TPOT objective:

| load | composite | least-kv | previous default | harm 0.02, TTFT 0.1/s | decode 8000, hopeless 0.05 |
|---|---:|---:|---:|---:|---:|
| 20 req/s | 58.0% | 58.0% | 57.2% | 60.6% | 58.1% |
| 22 req/s | 53.4% | 54.4% | 52.3% | 55.8% | 53.6% |
| 24 req/s | 48.0% | 50.4% | 48.0% | 51.6% | 48.9% |
| missed, 20 req/s | 31.4 / 20.0% | 31.8 / 20.4% | 30.9 / 29.4% | 28.5 / 25.6% | 30.4 / 21.7% |
| missed, 22 req/s | 35.0 / 22.9% | 33.3 / 23.0% | 34.6 / 31.9% | 31.5 / 29.6% | 33.6 / 26.3% |
| missed, 24 req/s | 39.9 / 26.2% | 38.0 / 24.4% | 39.2 / 34.5% | 34.5 / 31.1% | 38.7 / 27.4% |

TTFT p99 at 20 req/s: composite 32.9 s, previous default 32.7 s, harm 0.02 41.6 s, decode 8000 with
the hopeless rule 34.0 s; TPOT p90: every heuristic 105-107 ms, previous default 114-117 ms.

**What this says.** Here the previous default does **not** beat the heuristics: it ties composite
(0.0 to -1.1 points) and loses 0.8-2.4 points to least-kv. It misses fewer TTFT objectives and
many more TPOT ones, the pattern the issue reported: with TTFTs of many seconds, its TTFT cost of
0.25 per s outweighs the harm term (tuned where TTFTs are hundreds of ms), so it routes by its own
TTFT and puts prefill work next to decoding requests. Learning online is not the cause: in the same
harness with this page's pods, SLO classes and chat mix (90 req/s, burstiness 0.6, 8000 requests,
seeds 2002, 2003; exploratory) it had 57.6% against composite's 54.9% and least-kv's 57.4%.

A four times stronger harm term with a weaker TTFT cost wins here (+2.4 to +3.6 points over
composite) and on the validation seeds above (82.5% against 80.4%, exploratory), but its TTFT p99 is
up to twice composite's in both settings (7-9 s against 4.4 s at chat / bursty), which the tail
criterion rules out. Exploratory runs on seeds 2002, 2003 at 24 req/s (a lighter realisation:
composite 60.9%, least-kv 62.1%; made with an earlier copy of the harness whose first retrain came
with the first samples, not after the service's interval) found the same with every other tail guard
tried (a TTFT cost relative to the best pod's, its logarithm, a TTFT cost per SLO width instead of
per second, a gate of 0.5-2 s above the best pod, a KV-use term): the settings that won by 3.5-10
points over composite had a TTFT p99 1.5-2.3 times composite's (21.9 s). The best one within 12% of
that tail (a TTFT cost of 0.1 per SLO width with the decode term and the hopeless rule below: 63.5%,
p99 23.5 s) had a TTFT p99 24% above composite's at chat / bursty in the main benchmark (5465
against 4407 ms).

The closest to a setting that holds in both: `default_policy(decode_equivalent_tokens=8000,
hopeless_chance=0.05)`. The decode term adds 8000 prompt-token equivalents per placement to the
harm (0.04 per request on the pod at harm weight 0.005: it counts the request's own decode steps,
which lengthen every co-scheduled step, several times over); the hopeless rule sends a request that
no pod gives a 5% chance to the pod where it starts soonest, which keeps the TTFT tail. Here it
cut the TPOT misses from 29.4-34.5% to 21.7-27.4% and is within 1.5 points of the best heuristic
(+0.1, -0.8, -1.5 points, least-kv the best at 22 and 24 req/s; +0.1 to +0.9 over composite), with
composite's TTFT p99. In the main benchmark it
is slightly worse than the shipped setting (exploratory, same frozen model: 80.1% against 80.4% on
the validation seeds, 82.0% against 82.4% on seeds 3001-3004) and its TTFT p99 at chat / bursty was
2% above composite's on the validation seeds (4510 against 4407 ms), so by this page's tuning rule
it was not made the recommended setting. No setting found then won in both settings with the tail
kept.

### The previous default at the loads closest to the issue's (14 and 17 req/s), and why the TPOT misses

At 20-24 req/s the runs' TTFT p90 is 8-59 s. The issue's composite had a TTFT p90 of 2.5 s and
0.628 attainment; 17 req/s is the closest (composite 65.9%, TTFT p90 5.5-19.6 s per seed, and 2.4 s
on the lighter seeds 2002-2004). Measured on 2026-12-05 (seeds 7, 8, 9):

```
OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_online --rps 14|17 \\
    --variant 'decode 4000={"decode_equivalent_tokens": 4000}' \\
    --variant 'decode 8000, hopeless 0.05={"decode_equivalent_tokens": 8000, "hopeless_chance": 0.05}'
```

| load | composite | least-kv | previous default | decode 4000 | decode 8000, hopeless 0.05 |
|---|---:|---:|---:|---:|---:|
| 14 req/s | 79.6% | 78.6% | 77.4% | 80.5% | 80.9% |
| 17 req/s | 65.9% | 67.7% | 64.8% | 65.6% | 66.2% |
| missed, 14 req/s | 14.0 / 9.0% | 13.9 / 10.6% | 13.7 / 15.0% | 12.7 / 11.1% | 11.7 / 10.7% |
| missed, 17 req/s | 26.5 / 15.3% | 23.8 / 15.6% | 26.2 / 22.9% | 25.3 / 22.8% | 24.3 / 17.6% |

TTFT p99 at 14 / 17 req/s: composite 14.2 / 22.2 s, least-kv 22.6 / 39.3 s, previous default
13.7 / 23.2 s, decode 4000 13.9 / 23.4 s, decode 8000 with the hopeless rule 14.2 / 23.3 s.

Here too the previous default loses (-2.2 points to composite at 14 req/s, -2.9 to least-kv at
17), and its whole loss is TPOT: it misses 15.0% and 22.9% of the TPOT objectives, more than
random routing (9.4%, 16.7%). Exploratory runs on the validation seeds 2002-2004 at 20 req/s
(composite 72.7%, least-kv 74.0%, recommended 72.1%) ruled out three explanations:

- *Herding onto pods whose queued requests the TPOT model does not see* (the rows' waiting
  requests are not running yet): predicting each pod's TPOT on its row with the waiting requests and
  this one moved into the running batch (one extra row per candidate in the same call) gave 71.2%
  (TPOT misses 20.2%), half that 71.4%.
- *The chance's assumed TPOT spread*: 0.15, 0.2 and 0.45 instead of 0.3 gave 71.3-71.6%, TPOT
  misses 19.2-20.3%.
- *Prefix affinity and the cache term* (seeds 7-9, 14 req/s): without the affinity filter 76.6%,
  without it and with no cache term 77.2% (recommended 77.4%); TPOT misses 15.7-15.9%.

At 14 req/s its TTFT p50 is 135 ms, so the explanation above (its TTFT cost outweighing the harm
term) is not the whole story. What does work is a term per placement for the request's own decode
steps (`decode_equivalent_tokens`). Without it the physics harm is (requests on the pod) x (uncached prompt
tokens): a request whose prompt the pod holds in its prefix cache costs nothing there however many
requests are decoding on it, so requests sharing a prefix pile their decodes onto one pod. In the
simulator's step model a decoding sequence adds about 0.1 + 0.08 x (context in thousands) ms to
every co-scheduled step for each of its output tokens, as much as 12 prefill tokens per output token
at a 1,500-token context: a few thousand prompt-token equivalents per request. With 4000 it gained
0.8-3.1 points over the recommended setting at 14-20 req/s (74.5% against 72.1% on the validation
seeds at 20 req/s), is within the heuristics' range here (+0.9 over composite at 14 req/s, -2.1 to
least-kv at 17), and on this
page's validation seeds it has the best pooled attainment yet (81.0% against 80.4%; exploratory,
the frozen model of the exploration runs). But at chat / bursty its TTFT p99 is 5.3 s against
composite's 4.4 s (recommended 4.2 s). That tail comes from one overload burst (t = 28-35 s,
requests behind 85 waiting and 170,000 prompt tokens in flight), where no request has a chance and
the decode term, counting requests and not the prompt work ahead of them, sends some behind the
longest prefill queues. Every guard tried gives the gain back with the tail: the term only for
requests with a chance of at least 5%, 20% or 50% somewhere (80.7%, 80.6%, 80.1%; p99 4.8, 4.7,
4.4 s), a TTFT cost of 0.5 or 0.75 per s (80.7%, 80.1%; 4.9, 4.6 s), the hopeless rule at 2%
(80.2%, 4.3 s), counting only the running requests (80.9%, 5.8 s). A cost per prompt token the pod
must prefill before the request's first token does not, and with it the decode term became the
default (the first subsection, and History).

### A stronger harm term: more attainment here, bought with the TTFT tail (2026-12-06, exploratory)

```
OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_online --rps 17|20|24 --seeds 2003,2004,2005,2006 \\
    --variant 'harm 0.02={"harm_weight": 0.02}' --variant 'harm 0.04={"harm_weight": 0.04}'
```

Validation seeds 2003-2006 (every policy meets 96-100% on 2002, the lightest), about 2.5 min per
load on 2 cores:

| load | composite | least-kv | recommended | harm 0.02 | harm 0.04 |
|---|---:|---:|---:|---:|---:|
| 17 req/s | 81.0% | 81.4% | 80.2% | 84.6% | 87.4% |
| 20 req/s | 66.3% | 69.3% | 66.4% | 71.0% | 73.7% |
| 24 req/s | 52.8% | 54.8% | 53.1% | 57.7% | 61.4% |
| TTFT p99, 17 req/s | 10.2 s | 14.1 s | 8.1 s | 9.9 s | 14.0 s |
| TTFT p99, 20 req/s | 17.4 s | 29.2 s | 15.3 s | 18.9 s | 22.9 s |
| TTFT p99, 24 req/s | 24.1 s | 36.7 s | 22.3 s | 28.6 s | 35.4 s |

- Four times the shipped harm weight beats the best heuristic by 3.2, 1.7 and 2.9 points. Eight
  times beats it by 6.0, 4.4 and 6.6.
- Their TTFT p99 is within least-kv's (the best heuristic here), but up to 1.5x composite's.
- On this page's main benchmark the same weights raise attainment too. Validation seeds 2002-2005,
  the frozen model of the exploration runs, pooled: 81.6% and 82.3%, against 80.1% for the shipped
  setting and 78.4% for composite.
- But there the tail criterion rules them out, as it did harm 0.01 in the tuning above:
  - at chat / bursty their TTFT p99 is 6.0 and 8.3 s, against composite's 4.4 s (shipped: 4.0 s);
  - at chat / high it is 0.64 and 1.38 s, against composite's 0.48 s.

**The gain is where the tail is.** A chat / bursty burst on seed 2003 shows it:
- Harm 0.02's longest TTFTs (8-10 s) went to a pod with 41 running and 29-36 waiting requests. Its
  cache was 0.97 full, with 170,000-200,000 prompt tokens queued; its predicted TTFT was 10-18 s.
- Another pod predicted 0.2-1.1 s, with 140-180 running.
- About 100 more requests, times 7,000-12,000 prompt-token equivalents (the uncached prompt plus
  the decode term), outweighed the request's own chance, its TTFT cost and its prefill cost.
- That is a soft sacrifice.

**No guard tried kept the gain without the tail.** Main benchmark, same seeds and model, harm 0.02
or 0.04 with each guard; pooled attainment, then the chat / bursty TTFT p99:
- A gate on predicted TTFT, ruling out pods beyond the best pod's + max(0.5 s, 100%): 79.8%, 4.8 s
  (chat / bursty attainment 61.5%, composite 60.8%). Gates of 3x + 2 s or 2x + 1 s: 79.5-80.4%,
  4.9-5.2 s.
- A gate on prompt tokens ahead, 20,000 or 50,000 above the fewest: 79.5-80.6%, 4.2-4.5 s, but chat
  / high 0.56-1.34 s.
- A stronger TTFT cost (1 per s): 80.9%, 5.2 s. A stronger prefill cost (0.24 per 1000 tokens):
  79.9%, 3.9 s, but chat / high 0.51 s.
- A cost that grows with the square of the predicted TTFT above the best pod's (0.05-1 per s²):
  80.3-81.3%, 4.6-5.9 s.
- Counting only the running requests in the harm: 82.5%, 6.8 s.
- Each pod's harm scaled by how close its predicted TPOT is to the objective (the density of the
  request's TPOT at its SLO): 79.1-81.1%, 6.3-15.6 s.
- Composite's score plus the chance of meeting the SLO, in the second setting (seeds 2003, 2004):
  76.7-77.5%, against composite's 78.0%.
- Not a guard, but tried on the same tail: the hopeless rule (`hopeless_chance` 0.02-0.1) with the
  shipped weights. It gave 79.5-79.7%, and a longer chat / bursty p99 (4.2-4.4 s, shipped: 4.0 s).

So in both settings, what a stronger harm term adds comes from requests sent behind long queues.
The shipped setting keeps the tail, and in this setting it does not beat the heuristics.

### The shipped policy's tail terms cost most of its attainment in this setting (2026-12-06, exploratory)

```
OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_online --rps 17|20|24 --seeds 2003,2004,2005,2006 \\
    --variant 'no tail terms={"ttft_cost_per_s": 0, "prefill_cost_per_ktoken": 0, "cache_weight": 0}'
```

"No tail terms" is the shipped policy without its TTFT cost, its prefill cost and its cache term:
the request's chance of meeting its SLO and the harm to the pod's requests (shipped weight, with
the decode term), inside the same prefix-affinity filter. Validation seeds 2003-2006:

| load | best heuristic (least-kv) | composite | recommended | no tail terms |
|---|---:|---:|---:|---:|
| 17 req/s | 81.4% | 81.0% | 80.2% | **88.2%** |
| 20 req/s | 69.3% | 66.3% | 66.4% | **75.6%** |
| 24 req/s | 54.8% | 52.8% | 53.1% | **60.7%** |
| TTFT p90 / p99, 17 req/s | 3.6 / 14.1 s | 3.9 / 10.2 s | 2.8 / 8.1 s | 1.1 / 19.3 s |
| TTFT p90 / p99, 20 req/s | 9.5 / 29.2 s | 8.4 / 17.4 s | 7.2 / 15.3 s | 5.3 / 28.0 s |
| TTFT p90 / p99, 24 req/s | 17.8 / 36.7 s | 15.5 / 24.1 s | 14.0 / 22.3 s | 15.5 / 35.6 s |
| missed TTFT / TPOT, 20 req/s | 20.3% / 13.8% | 23.5% / 14.7% | 21.6% / 19.7% | 14.1% / 13.7% |

- Without those three terms the policy beats the best heuristic by 6.8, 6.3 and 5.9 points. At 20
  and 24 req/s its TTFT p99 is also within least-kv's, so there it meets #10's routing-alone target
  against the best heuristic. At 17 req/s its p99 is 1.4x least-kv's, and at every load it is
  1.5-1.9x composite's.
- The shipped terms are what keeps the tail short here too (p99 8.1-22.3 s), and they cost 7.6-9.2
  points. Together they also raise the TPOT misses from 13.7% to 19.7% at 20 req/s. Removing one of
  them does not lower those (without the TTFT cost, the prefill cost, the cache term, or the TTFT
  cost and the cache term: 65.8-67.8%, TPOT missed 19.5-22.3%); removing the harm instead gives
  65.8% (TPOT missed 15.2%, but TTFT 23.8%).
- On this page's main benchmark (validation seeds 2002-2005, a frozen model built the same day),
  "no tail terms" fails the tail criterion: pooled 81.7% against 80.0% shipped and 78.4% composite,
  but chat / bursty TTFT p99 5.2 s against composite's 4.4 s. Removing only the prefill cost (80.8%,
  5.2 s) or keeping only the TTFT cost (80.9%, 5.5 s) fails it too; removing only the TTFT cost
  (80.4%) or only the cache term (80.2%) keeps it, within the 0.3-point re-run noise of the tuning.

So the frontier between attainment and tail of the section above holds here as well, and it is
wider: in the issue-shaped setting the policy gains 7.6-9.2 points by giving up composite's tail.
The default stays as chosen, under the rule it was chosen by (tail no worse than composite's at
every load of the main benchmark).

Also tried, none of which moved the second setting (20 req/s, the same seeds; shipped 66.4%):
- the own term as the log-chance (65.4%) or the relative headroom (65.7%);
- in a scratch copy (not committed): no prefix affinity (exploration always on: 66.2%; also without
  the cache term 66.3%); a term on the pod's KV occupancy, 0.1-1 per full cache (65.2-66.2%; main
  benchmark 80.0-80.2%); the model without its online calibration (66.1%) or without per-regime
  offsets (66.8%).
On the main benchmark only, also in a scratch copy: harm scaled by the chance that the
pod's requests miss their TPOT (78.3-78.5%, chat / high p99 1.7-2.5 s), or by its predicted TPOT
over the objective, linear or squared (80.5-81.5%, chat / bursty p99 4.8-7.7 s); and a gate ruling
out pods predicted beyond the 99th percentile of the recent decisions' soonest predicted TTFT, which
kept the tail but gave 78.8-79.0% (harm 0 to 0.02), below the shipped 80.0%.

### Admission here: the harm test and the SLO test (2026-12-06)

```
OMP_NUM_THREADS=1 .venv/bin/python -m bench.routing_online --rps 17|20 --seeds 2003,2004,2005,2006 \
    --variant 'admission, harm test={"admission": true}' \
    --variant 'admission, SLO test={"admission": true, "admission_rule": "slo"}'
```

The harm test (`default_policy(admission=True)` since 2026-12-06) was chosen on the main
benchmark's validation seeds; this setting was not used to choose it. 30% of the requests are
sheddable here too, and a shed request counts as a miss. Validation seeds 2003-2006, about 3.5 min
per load on 2 cores:

| load | least-kv | composite | recommended | + admission, harm test (shed) | + SLO test (shed) |
|---|---:|---:|---:|---:|---:|
| 17 req/s | 81.4% | 81.0% | 80.2% | 90.9% (8.0%) | 90.8% (6.9%) |
| 20 req/s | 69.3% | 66.3% | 66.4% | 85.7% (10.8%) | 82.1% (11.0%) |

On this setting's evaluation seeds 7, 8, 9 (the same command without `--seeds`, also at 14 and 24
req/s; about 2-3 min per load):

| load | best heuristic | recommended | + admission, harm test (shed) | + SLO test (shed) |
|---|---:|---:|---:|---:|
| 14 req/s | composite 79.6% | 78.7% | 89.3% (7.2%) | 88.7% (6.9%) |
| 17 req/s | least-kv 67.7% | 64.9% | 80.2% (10.1%) | 77.2% (10.1%) |
| 20 req/s | least-kv, composite 58.0% | 57.4% | 72.0% (12.6%) | 66.9% (12.6%) |
| 24 req/s | least-kv 50.4% | 48.3% | 61.6% (14.2%) | 56.4% (14.8%) |

With admission the policy gains 9.5 and 16.4 points over the best heuristic on the validation
seeds, and 9.7, 12.5, 14.0 and 11.2 on the evaluation seeds. The harm test is ahead of the SLO test
at every load, by 0.1 to 5.2 points, and sheds about as many requests (within 1.1 points of each
other). On the validation seeds at 17 / 20 req/s, TTFT p99 of the completed requests: 570 / 1,250
ms (harm test) against 1,055 / 2,071 ms (SLO test) and least-kv's 14.1 / 29.2 s; TPOT misses 1.1% /
3.0% against 2.0% / 5.9%. Per seed, with admission it was below composite on the lightest seeds
(2006 at 17 req/s: 94.7% against 96.6%; 8 at 14 req/s: 95.8% against 96.3%): it sheds a little
when routing alone would have met the objectives.
"""

TRADEOFF = """The harm weight is where the trade-off lies. The tuning takes the best attainment among
the settings whose TTFT p99 is no longer than composite's at every validation load. With the
previous objective (-ln P; this paragraph and the next are about that version), by attainment
alone it picked weight 1 (80.8% vs composite's 78.4% on the validation seeds in the first tuning
run, but TTFT p99 7.7 s vs 4.4 s at chat / bursty): the first full run of that version,
identical except that tuning rule, chose weight 1 and admission slack 0 and gave
routing alone +1.0, +3.9, +1.3 and +1.4 points at the four high and bursty loads, with TTFT p99
1328 vs 858 ms (chat / high) and 5419 vs 3233 ms (chat / bursty). At that weight the harm
(hundreds of units in a burst) outweighs the request's own -ln P and sends requests that cannot
make their TTFT anyway to a pod stuck behind ~200k tokens of queued prefill because it holds a
few fewer requests: a soft version of the "sacrifice" rule, with its TTFT tail. (That tuning
rule was changed after seeing that run's evaluation rows; the tail problem was equally visible
in its validation table.) The version before the harm term (harm weight 0) gave +0.0, -0.1,
+1.0 and +0.4.

Re-runs move these rows: each trains a fresh model, and the validation rows of neighbouring
harm weights (0.003, 0.01) and admission slacks (0, -0.1) are within 0.3 points of each other,
so the tuning flipped between them (the runs so far are listed under History) until it was made
to keep the shipped setting unless another beats it by more than 0.3 points. How much a fresh
model moves the evaluation rows (up to 1.5 points at chat / bursty) is as large as the gains
that are missing."""


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
- The placement-cost term (`PlacementCost`) was built two versions ago, from the models: one
  extra "pod with this request" row per candidate in the same bulk call (`harm="tpot"`). On the
  validation seeds its harm weight made things worse at every weight tried (0.1, 0.3, 1 on the
  headroom objective, 0.1 and 0.3 on the chance objective), so `default_policy` shipped with
  weight 0 in the previous version (why: "Why the predicted policies lost", below).
- **This version: the physics harm term** (`harm="physics"`, in `default_policy`): the work
  the placement adds to a pod, (running + waiting requests) x (uncached prompt tokens) / 1000,
  what the simulator says a prefill costs the others (each chunk lengthens every co-scheduled
  decode step in proportion to its tokens); zero on an idle pod, no extra rows. Exploratory
  runs on the validation seeds (pooled attainment over the four high and bursty loads, one model
  trained as in this benchmark, seeds 2002, 2003): composite 83.1%, the previous recommended
  policy (cache 1, harm 0) 83.6%; physics harm weight 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10:
  84.4, 84.8, 84.8, 84.9, 85.1, 85.4, 85.2, 85.1%. On seeds 2004, 2005 as well (four seeds):
  composite 78.4%, previous policy 78.7%, physics weight 1: 81.1%; times a TPOT-sensitivity
  factor, 1 + the log-normal density of the pod's predicted TPOT at 30 ms (how many of its
  requests a small increase tips over the tightest objective), 81.3%, but a much longer TTFT
  tail (mean p99 6.1 s vs composite's 3.0 s in this version's first tuning run). Tried and not
  adopted: the model-based harm as expected
  extra misses, (requests on the pod) x the drop of P(TPOT <= SLO) between the pod's row and its
  "with this request" row (weight 1: 73.2%, 3: 69.2%: the same saturation problem as below);
  the physics harm weighted *only* by the pod's closeness to the 30 ms objective, no flat part
  (83.8-84.1%: chat up 2-4 points, prefix-heavy down 2-4); a decode term (+500 or +1000
  prompt-token equivalents per placement for the request's own decode steps: 84.7-84.9%);
  affinity off, threshold 0.5 or no exploration with the physics term (85.0, 85.1, 85.1%); a
  sharper TPOT spread for the chance (0.2, 0.15; four seeds: 80.6, 81.0% vs 81.1%). The
  weights were then chosen by this run's own tuning (below) on four validation seeds.
- **The TTFT tail of the harm term** (exploratory, four validation seeds, harm weight 1 unless
  stated; composite 78.4%, mean TTFT p99 3007 ms): gating the candidates to pods within
  max(50 ms, 25%, 50% or 100%) of the best predicted TTFT: 78.4, 79.1, 79.5% (the gain is gone:
  it came from the pods with longer predicted TTFT); gating only when the best pod misses the
  TTFT SLO: 79.3-79.8%, TTFT p99 about composite's; a linear TTFT / SLO term next to the chance:
  81.2-81.3% but TTFT p99 4064-4131 ms; the harm relative to the candidates' mean (weight 0.3 to
  10): 79.3-79.6% with TTFT p99 2669-2776 ms, within the noise of weight 0.003 (79.4%, 2839 ms),
  so not adopted.
- **Why the predicted policies lost, per decision** (previous version; validation seed 2002, model
  trained as in this benchmark, chat / high, 4000 decisions, every candidate's
  "with this request" row predicted at every decision): the TPOT model's answer to "one more
  request and its uncached prompt in flight" is *largest on lightly loaded pods* (mean +4.1 ms
  per decision) and small or flat on the busiest ones (correlation between a pod's queue depth
  and that predicted increase: -0.15 under harm weight 0, -0.64 under harm weight 1, where
  the states it creates are more extreme). The model predicts the TPOT of a request *arriving*
  in a state, which saturates once the pod is busy; it is not the marginal TPOT of the requests
  already running there, which in the simulator grows with every decoding sequence a prefill
  chunk is co-scheduled with. So the harm term sent requests to pods with 31.7 more requests
  than the least loaded one (5.7 with weight 0): with weight 1 the pooled validation attainment
  fell from 84.2% to 67.7% (exploratory run). A harm term that helps needs a model of the
  running requests' TPOT over the next steps (a model-side change), not one more row of today's
  model.
- Where the misses are (validation seeds 2002, 2003, high and bursty loads, 4000 requests):
  in chat, most misses are *interactive requests missing their 30 ms TPOT* (e.g. chat / high
  seed 2003: 490 of 665 misses under composite); in prefix-heavy, the previous recommended
  policy lost on prefix-cache reuse: 38-42% of prompt tokens came from a pod's cache against
  composite's 43-46% (least-queue: 27-30%), so more prefill work and longer decode steps for
  everyone. Two changes address these and are in `default_policy` now:
  1. the own term ranks by the **chance of meeting both SLOs** (`scheduler_client.odds`: the p90
     read as a log-normal with spreads 0.5 TTFT / 0.3 TPOT) instead of the average of the two
     relative headrooms, which ranked an interactive request by its wide TTFT margin while its
     thin TPOT margin is what it misses;
  2. a **cache term**, cache weight x the share of the prompt the pod must prefill: the work the
     placement adds to that pod, which every request there pays for (own predicted TTFT sees
     only the request's own share of it).
  In the exploratory runs on the validation seeds (pooled over the four high and bursty loads,
  one model trained the same way): composite 83.1%, the previous recommended policy 82.3%,
  headroom + cache term 83.5%, chance objective + cache weight 2: 84.2%. This run's own tuning
  on the same seeds then chose cache weight 1 (84.0%; 2: 83.8%; none: 82.0%).
- Also tried on the validation seeds in exploratory runs, not adopted (pooled attainment, same
  loads): affinity
  threshold 0.5 or 0.3 instead of 0.8 (82.5%, 82.6% on the headroom objective; 83.7-84.2% with
  the chance objective and cache term, within the noise of 0.8); a wider TTFT gate, 100 ms / 50%
  (82.1%); no exploration (82.5%; 83.9% with chance + cache); the minimum of the two relative
  headrooms as the objective (83.5%); "pack" (least positive headroom above a 0.3 or 0.5
  margin) for every request or only for 60 ms-TPOT requests, to keep light pods for tight-TPOT
  requests (83.1-83.7%); a hard split of the pods by SLO class with composite inside each part
  (4 of 8 pods for interactive: 81.8%; 3 or 5: 77.5%, 60.4%); the composite score as an extra
  term (previous version: ties).
- Runs of the physics-harm version, all with the same seeds and procedure, each with a freshly
  trained model (routing alone / with admission, at chat high, chat bursty, prefix-heavy high,
  prefix-heavy bursty):
  - 2026-12-02 03:33, tuning chose harm weight 0.003, admission slack -0.1: +1.1, +0.7, +1.2,
    +1.0 / +3.6, +14.1, +0.5, +6.7; TTFT p99 at chat high 890 vs 858 ms;
  - its repeat the same day, chose 0.01, 0: +1.1, +2.2, +1.1, +1.2 / +5.0, +14.4, +1.9, +6.1;
    TTFT p99 at chat high 879 vs 858 ms;
  - 2026-12-02 09:57, after TPOT was calibrated online and the prior too (training server), chose
    0.01, 0: +1.4, +2.1, +1.3, +0.7 / +4.7, +13.9, +2.0, +6.2; TTFT p99 at chat high 877 vs 858 ms;
  - its repeat, chose 0.01, -0.1 (shipped since; from then on the tuning keeps the shipped
    setting unless another beats it by more than 0.3 points): +0.9, +1.3, +1.2, +1.1 / +4.7,
    +14.5, +0.9, +6.6; TTFT p99 at chat high 961 vs 858 ms.
  - 2026-12-02 13:38, after the recency-weighted conformal offset (training server), kept 0.01,
    -0.1: +0.8, +1.5, +1.2, +1.1 / +4.6, +14.5, +0.6, +7.0; TTFT p99 at chat high 852 vs 858 ms
    (the page until 2026-12-05);
  - 2026-12-05 14:10, main at 29880c1 (after the training server's KV-scaled TTFT terms, TPOT's
    bend judged on all the newest rows and the out-of-sample publish guard), on an idle host,
    kept 0.01, -0.1: +0.9, +1.0, +1.2, +1.0 / +3.8, +14.2, +1.0, +6.9; TTFT p99 at chat high
    929 vs 858 ms, a miss of the tail criterion there;
  - 2026-12-05 15:52, main at f90df08 (after the training server serves a queue bin without
    enough samples of its own at least the offset of the bin below), idle host, kept 0.01, -0.1:
    +1.5, +1.3, +1.5, +0.6 / +3.7, +13.2, +0.6, +6.6; TTFT p99 at chat high 836 vs 858 ms, at
    chat bursty 3244 vs 3233 ms (a miss by 11 ms);
  - its repeat, 2026-12-05 16:03 (the page until the next version), whose tuning chose harm weight 0.003 and
    admission slack 0 (harm weight 0.01 missed the tail criterion on the validation seeds; with
    0.003, slack 0 beat -0.1 by 0.3 points): +1.0, +0.6, +1.2, +1.0 / +4.8, +13.3, +1.9, +7.0; TTFT
    p99 at chat high 871 vs 858 ms. Within the run-to-run spread of the earlier runs: the training
    server's change did not move routing measurably. The shipped setting was not changed to this
    run's choice, as the generated line above asks: the run before it, on the same code, kept the
    shipped setting, and harm weight 0.01 lost to 0.003 here on the tail criterion of the validation
    seeds, not on attainment (79.7 % against 79.4 %); following each re-run's choice would change
    the default with every run.

- 2026-12-05, exploratory (validation seeds 2002-2005 only, the four high and bursty loads, 4000
  requests, one frozen model trained as in this benchmark, in process; not committed): a
  *stateful* harm term from the scheduler's own record of what it placed where and what has
  completed: the requests in flight on each pod, each weighted by how tight its TPOT objective is
  (30 ms / its TPOT SLO), times the prompt tokens the pod must prefill / 1000, in place of the
  rows' running + waiting. Pooled attainment: composite 78.4%, recommended 79.7%; stateful weight
  0.01 / 0.03 / 0.1: 79.7 / 80.0 / 80.7%, but TTFT p99 at chat / bursty 4.3 / 4.4 / 6.9 s against
  composite's 4.4 s, and at prefix-heavy / bursty 5.7 / 6.1 / 6.3 s against 6.1 s. Gated to pods
  whose predicted TTFT is within 2x or 3x of the best pod's (or within the SLO), weights 0.1 and
  0.3: 79.9-80.4%, and prefix-heavy / bursty p99 6.5-7.5 s. Interactive requests only (weight 0.1,
  gate 2x): 76.9%. The same trade-off as the physics term: what it gains comes from requests sent
  behind longer queues. Confirmed the other way round: restricted to the pods predicted to meet
  the request's TTFT SLO, and sending a request no pod is predicted to serve in time to the lowest
  predicted TTFT (no sacrifice), the physics term at weights 0.01 / 0.1 / 1 and the stateful one at
  0.1 / 1 gave 78.8-79.1% pooled, below the recommended policy's 79.7%. Separated: the
  recommended policy itself, except that a request no pod is predicted to serve in time goes to
  the lowest predicted TTFT, gave 79.1%, and a longer TTFT p99 at chat / bursty (4.8 s against
  4.2 s). So about half of its +1.3-point gain over composite on these seeds comes from where it
  sends the requests that will miss anyway, and sending those to the shortest predicted TTFT does
  not shorten the tail. Not adopted.
- **The expected-attainment objective** (`objective="expected"` in `default_policy`,
  chosen 2026-12-05 on validation seeds 2002-2005, checked on seeds 3001-3004, which are neither
  validation nor evaluation seeds; the four high and bursty loads, 4000 requests, one frozen model
  trained as in this benchmark, in process). The own term is -P(meeting both SLOs) instead of
  -ln P, plus a cost per second of the request's own predicted TTFT. -ln P pays a large price for
  a slightly better chance of a request that misses anyway; -P does not, so such a request goes
  where the harm and cache terms say it costs the others least, and the TTFT term keeps it from
  being sent behind the longest queue. Pooled attainment on seeds 2002-2005 (3001-3004): composite
  78.4% (80.7%), the previous recommended policy 79.7% (81.7%). -P without a TTFT term gained more
  but with the tail of the sacrifice rule: 79.6-82.1% with TTFT p99 at chat / bursty 4.9-9.3 s
  against composite's 4.4 s. Gating the candidates to pods within 1.5x, 2x or 3x of the best
  predicted TTFT instead kept the tail and lost the gain (78.9-80.6%, as with -ln P above). With a
  TTFT cost of 0.35 per s (cache weight 0.15, harm weight 0.005, on -P's scale): 80.0% (82.3%),
  TTFT p99 no longer than composite's at any of the eight load x seed-set cells (chat / bursty 4.3
  s vs 4.4 s, and 2.8 vs 2.8 s on 3001-3004, where the previous policy's 3.2 s was longer); per
  load against composite +1.5 / +2.5 / +1.4 / +1.3 points (+0.9 / +2.9 / +0.9 / +1.6). Larger harm
  weights or smaller TTFT costs reached 80.4-81.5% with a longer chat / bursty tail (4.7-6.6 s);
  the TTFT cost as a share of the request's TTFT SLO instead of per second: 80.3-81.8% with the
  same tail trade-off. So it is better than the previous policy on both seed sets at the same or a
  shorter tail, by 0.3 and 0.65 points pooled, mostly at chat / bursty; it does not reach +2 at
  the high loads either. The tuning grid of this benchmark now holds the previous policy's chance
  settings and the expected objective around 0.35 per s. Its first run (2026-12-05 20:04, main at
  d550e76 with this change) chose a TTFT cost of 0.25 per s (80.3% against 80.0% at 0.35 on the
  validation seeds, TTFT p99 no longer than composite's) and admission slack 0 (84.5%, tied with
  -0.1), which `scheduler_client.recommended` shipped until the next version; on the evaluation
  seeds that run gave routing alone +2.4, +3.1, +1.6, +1.7 / with admission +5.2, +13.9, +1.9,
  +6.7, with TTFT p99 at chat high 1139 vs 858 ms. The page's run then was its repeat with the shipped setting
  (2026-12-05 20:08; the tuning kept it): +2.3, +3.6, +1.3, +1.7 / +5.5, +13.9, +2.0, +7.1, TTFT
  p99 at chat high 1029 vs 858 ms (its p90 266 vs 406 ms, p50 57 vs 63 ms): the tail criterion is
  missed there, by 171 ms.
- **The decode term and the prefill cost** (2026-12-06; `decode_equivalent_tokens`
  4000 and `prefill_cost_per_ktoken` 0.04 in `default_policy`). In the second setting (below) the
  previous default lost 0.8-2.9 points to the best heuristic, all of it on TPOT: the physics harm
  counted a request whose prompt a pod holds in its prefix cache as almost free there, however
  many requests were decoding on it. The decode term counts its own decode steps as 4000 prompt
  tokens per request on the pod; alone it cost the TTFT tail in overload bursts here (chat / bursty
  p99 5.3 s against composite's 4.4 s, exploratory), because it counts requests, not the prompt
  work queued ahead of them, so the prefill cost (0.04 per 1000 prompt tokens the pod must prefill
  before the request's first token, read from the row) was added to guard it. The structure (both
  terms) was chosen on the second setting's validation seeds 2002-2004 (at 17 and 20 req/s: 84.6%
  and 73.0% against the previous default's 83.2% and 72.1%); the tuning grid here now holds only
  settings with both terms, around the shipped values, and shows the previous default beside them
  as a reference. Two more changes to the tuning: warm-up 2 routes with the recommended policy at
  the reference setting instead of the shipped one (with the shipped one, each change of the
  shipped setting changed the warm-up, the model and then the tuning's choice: three successive
  runs chose decode 4000 / prefill 0.04, then the previous default, then 2000 / 0.02, the
  validation rows being within 0.5 points of each other and the TTFT-tail verdicts flipping
  between models), and the grid has six fields. On the model of this page the previous default
  scores 80.2% on the validation seeds with a TTFT p99 above composite's at one hard load, the
  shipped setting 80.0% within it; on the evaluation seeds routing alone gives +1.7, +3.8, +1.3 and
  +0.9 points at the four high and bursty loads (the previous page, with the previous default and
  another model: +2.3, +3.6, +1.3, +1.7), with admission +4.6, +14.1, +1.9, +6.4 (previous: +5.5,
  +13.9, +2.0, +7.1); the TTFT p99 is no longer than composite's at chat / high (851 against 858 ms;
  the previous page: 1029) and 8% longer at chat / bursty (3479 against 3233 ms). The same code
  and settings run a minute earlier (another fresh model) gave +1.7, +3.1, +1.2, +0.9, with admission
  +5.0 at chat / high, and a chat / bursty p99 1% longer than composite's (3265 ms): differences of
  that size are noise. So that version traded up to 0.8 points here for 0.1-1.4 points in the
  second setting and a shorter TTFT tail there.
- **This version: the harm admission test** (2026-12-06; `admission_rule="harm"` and
  `admission_harm_weight` 0.003 in `default_policy(admission=True)`, `HarmAdmission`). The SLO test
  sheds a sheddable request only when no pod's p90 is within its SLO, whatever admitting it costs
  the requests already running: under load it sheds requests a quiet pod would have served and
  admits ones whose prefill and decode slow down every decode on a busy pod. The harm test sheds a
  sheddable request when on every pod its chance of meeting its SLO (what admitting it adds to the
  expected attainment) is smaller than 0.003 x the physics harm of placing it there (the cost's
  harm with its decode term: what admitting it takes from the others); never while a pod is idle.
  Exploratory runs first (one frozen model built as in this benchmark, the four high and bursty
  loads, in process, not committed), pooled attainment and share shed on validation seeds
  2002-2005: the SLO test (slack 0) 84.6%, 6.0% shed; the harm test at weights 0.001, 0.0015,
  0.002, 0.0025, 0.003, 0.004, 0.005: 83.2, 84.1, 84.9, 85.6, 85.9, 85.5, 84.6% (shed 2.8-9.7%); at
  0.003 per load 93.3 / 73.5 / 97.7 / 79.1% against the SLO test's 92.3 / 71.6 / 96.6 / 78.1%
  (chat high, chat bursty, prefix-heavy high, prefix-heavy bursty), TTFT p99 shorter at three of
  the four. On seeds 3001-3004 (neither validation nor evaluation seeds): the SLO test 85.6% (5.6%
  shed), the harm test at 0.0025 / 0.003 / 0.004: 86.3 / 86.6 / 86.7%; checked after the choice on
  seeds 10-13 (the shipped 0.003): 82.7% against the SLO test's 81.3%, more at each of the four loads
  (by 1.0-1.8 points), and +5.1 / +15.6 / +2.3 / +9.2 points over composite. Not better: shedding by the
  best pod's chance alone (below 0.3, 0.5, 0.7 or 0.8: 81.9-84.2%), by either test (85.4% at
  0.0025), or with a margin at weight 0.005 (the chance below the harm plus 0.1, 0.2, 0.3: 84.3,
  83.3, 82.3%, shedding 11-13%; minus 0.2: 85.7%).
  The tuning grid now holds both tests (the slacks as before, the harm test at 0.002, 0.003, 0.004).
  This page's run chose the harm test at 0.003 (85.8% against the SLO test's 84.5% at slack 0 on the
  validation seeds; all within composite's TTFT p99). On the evaluation seeds, with admission:
  +6.5, +16.4, +2.6 and +6.7 points at the four high and bursty loads (the previous page, SLO test:
  +4.6, +14.1, +1.9, +6.4), so the +5-point target is met at three of the four; at prefix-heavy /
  high it is out of reach (95.5% + 5 > 100%). It decides in about 8 microseconds more per decision
  at 8 pods (in process, pinned: 39.9 against 32.3 us without admission, 32.8 with the SLO test),
  and sends the same rows. Routing alone did not change; this run's fresh model gave +1.7, +3.1,
  +1.3 and +1.0 points (previous page +1.7, +3.8, +1.3, +0.9), with a TTFT p99 at chat / high of 942
  against composite's 858 ms (previous page 851) and at chat / bursty 3138 against 3233 ms
  (previous page 3479): the same policy and settings on another fresh model, the noise between
  re-runs. In the second setting (section "Admission here", above; not used to choose it) the harm
  test was ahead of the SLO test at every load measured, by 0.1 to 5.2 points.
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

{verdict(results, heuristics, noise)}

{TRADEOFF}

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

- **Machine**: a shared 2-core machine, busy with other engineers' tests and benchmarks while
  this ran; the wall-clock latencies of prediction calls do not change any simulated
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
- These runs use one frozen model, our default pods and three SLO classes. With a model learnt
  online, one SLO and slower pods, the recommended policy trails the best heuristic by 0.6-2.8
  points, with the shortest TTFT tail (section "A second setting", below).

{ROLLOUT}
{OVERHEAD}
{ONLINE}
{HISTORY}"""
    path.write_text(text)
