"""The generated Markdown block of the accuracy evidence (docs/benchmarks-accuracy.md)."""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.accuracy_targets import MIN_GROUP, RECOVERY_LIMIT_S, SLACK

BEGIN, END = "<!-- accuracy-evidence:begin -->", "<!-- accuracy-evidence:end -->"


def markers(block: str) -> tuple[str, str]:
    """The begin/end markers of a named generated block ("" = the main one)."""
    if not block:
        return BEGIN, END
    return f"<!-- accuracy-evidence-{block}:begin -->", f"<!-- accuracy-evidence-{block}:end -->"


MODELS = ("ttft", "tpot")


def _slack_summary(replays: list[dict[str, Any]]) -> list[str]:
    """The what-if of ``accuracy_targets.judge(slack=True)``: rows and targets met when coverage is
    judged with a tolerance in the prediction's units (not #9's targets)."""
    rows = [(r, m) for r in replays for m in MODELS if "checks_slack" in r]
    if not rows:
        return []
    strict = [c for r, m in rows for c in r["checks"][m]]
    loose = [c for r, m in rows for c in r["checks_slack"][m]]
    passing = [f"{r['name']} {m.upper()}" for r, m in rows if all(c["pass"] for c in r["checks_slack"][m])]
    return [
        f"Not #9's targets, a what-if for its owner: with the coverage checks judged within {SLACK:.0%} of "
        f"the prediction (the prediction x {1 + SLACK:g} covers at least the floor in every group and "
        f"overall, x {1 - SLACK:g} at most the band's top overall; every other target as above), "
        f"{len(passing)} of {len(rows)} rows pass every target and {sum(c['pass'] for c in loose)} of "
        f"{len(loose)} targets are met (against {sum(c['pass'] for c in strict)} of {len(strict)})"
        + (f": {', '.join(passing)}." if passing else ".")
    ]


def markdown(
    command: str,
    args: argparse.Namespace,
    replays: list[dict[str, Any]],
    pngs: dict[str, Path],
    wall_s: float,
) -> str:
    q = args.quantile
    flags = " ".join(args.training_flag) or "none (all defaults)"
    begin, end = markers(args.block)
    lines = [
        begin,
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC{' on ' + args.label if args.label else ''}, "
        f"on a shared, busy 2-core machine; {wall_s / 60:.1f} min wall in all. Training-server flags: "
        f"{flags}. Traces at {args.trace_speed:g}x their recorded pace; simulator at {args.sim_speed:g} "
        f"simulated s per wall s, seeds {' '.join(map(str, args.seeds))}; samples "
        + (
            "carry"
            if args.send_predictions
            else "do not carry"
            if args.feedback != "epp"
            else "of the traces do not carry (the simulator's do)"
        )
        + " the predicted_*_ms fields; the "
        "simulator posts a request's samples "
        + (
            "as llm-d's EPP streams: TTFT at the first token, TPOT at completion."
            if args.feedback == "first-token"
            else "as today's EPP fills them: TTFT at the first token, TPOT at completion with the pod's load "
            "at the last token, each with the prediction it was routed on."
            if args.feedback == "epp"
            else "right after their prediction (simulated first, replayed in arrival order: a replay of "
            "recorded requests)."
            if args.feedback == "arrival"
            else "once it completed (TTFT and TPOT together)."
        )
        + (
            " Each simulator replay starts from history: the same scenario's replay with the next seed, "
            "loaded with `python -m training_server import-trace` before its servers start, and given to "
            "the naive baseline."
            if args.history
            else ""
        ),
        "",
        "```",
        command,
        "```",
        "",
        "### PASS/FAIL against the targets of issue #9",
        "",
        f"Coverage and pinball on the requests a trained model answered (the prior's are counted "
        f"separately below); groups with fewer than {MIN_GROUP} requests are not judged; pinball ratios "
        "on the requests both we and the naive baseline answered. The next column, not judged, is the "
        "coverage of every request, the prior's answers included (what a client sees from the start).",
        "",
        "| replay | model | coverage overall (0.88-0.92) | incl. the prior's answers "
        "| min per queue regime (>= 0.88) "
        "| min per depth bin (>= 0.88) | min per stage (>= 0.88) | pinball / naive (<= 0.7) "
        "| queued pinball / naive (<= 0.6) "
        f"| slowest recovery (<= {RECOVERY_LIMIT_S:g} s) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    passed = failed = 0
    for r in replays:
        for m in MODELS:
            checks = r["checks"][m]
            cells = [
                _cell(checks, "coverage overall"),
                _pct(r["summaries"][m]["with_prior"]),
                _cell(checks, "per regime"),
                _cell(checks, "per depth"),
                _cell(checks, "per stage"),
                _cell(checks, "naive overall"),
                _cell(checks, "naive queued"),
                _recovery_cell(checks),
            ]
            ok = all(c["pass"] for c in checks)
            passed, failed = passed + ok, failed + (not ok)
            lines.append(
                f"| {r['name']} | {m.upper()} | " + " | ".join(cells) + f" | **{'PASS' if ok else 'FAIL'}** |"
            )
    lines += ["", f"{passed} of {passed + failed} replay x model rows pass every target.", ""]
    lines += [*_slack_summary(replays), ""]
    for key, title in (
        ("traces", "real traces"),
        ("sim", "simulator scenarios, seeds pooled"),
        ("steps", "coverage around the step changes, first seed"),
    ):
        if key in pngs:
            lines += [f"![{title}]({pngs[key].name})", ""]
    for r in replays:
        lines += _details(r, q)
    lines.append(end)
    return "\n".join(lines)


def _cell(checks: list[dict[str, Any]], key: str) -> str:
    if key == "coverage overall" and checks and checks[0]["target"] == "a trained model answered":
        return "no trained model answered ✗"
    for c in checks:
        if key in c["target"]:
            name = c["target"].split("(", 1)[1].rstrip(")") if "(" in c["target"] else ""
            mark = "" if c["pass"] else " ✗"
            return f"{c['value']:.3f}{' ' + name if name else ''}{mark}"
    return "-"


def _recovery_cell(checks: list[dict[str, Any]]) -> str:
    rec = [c for c in checks if c["target"].startswith("recovery")]
    if not rec:
        return "-"
    if any(c["value"] is None for c in rec):
        return "never ✗"
    worst = max(c["value"] for c in rec)
    return f"{worst:.0f} s{'' if all(c['pass'] for c in rec) else ' ✗'}"


def _details(r: dict[str, Any], q: float) -> list[str]:
    s = {m: r["summaries"][m] for m in MODELS}
    lines = [f"#### {r['name']}", ""]
    extra = f"; stage starts at entries {r['starts']}" if r.get("starts") else ""
    lines.append(
        f"{r['retrains']} retrains by the training server, {r['naive_fits']} naive fits, "
        f"{r['wall_s']:.0f} s wall{_pace(r)}{extra}. "
        f"Answered by the prior: TTFT {s['ttft']['prior_requests']}, "
        f"TPOT {s['tpot']['prior_requests']} requests; coverage including them: TTFT "
        f"{_pct(s['ttft']['with_prior'])}, TPOT {_pct(s['tpot']['with_prior'])}."
    )
    stages = [
        f"{label} {v['samples']} ({v['samples'] - s['ttft']['stage'].get(label, {}).get('samples', 0)} prior)"
        for label, v in s["ttft"]["stage_with_prior"].items()
    ]
    lines.append(f"TTFT requests per stage, including the prior's: {', '.join(stages)}.")
    lines += [
        "",
        "| group | TTFT n | TTFT coverage [95% CI] | TTFT pinball ours / naive ms (ratio) | naive cov. "
        "| TPOT n | TPOT coverage [95% CI] | TPOT pinball ours / naive ms (ratio) | naive cov. |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("**overall**", s["ttft"]["overall"], s["tpot"]["overall"])
    ]
    for kind in ("regime", "depth", "stage"):
        labels = list(dict.fromkeys([*s["ttft"][kind], *s["tpot"][kind]]))
        groups += [
            (f"{kind}: {label}", s["ttft"][kind].get(label, {}), s["tpot"][kind].get(label, {}))
            for label in labels
        ]
    for label, t, p in groups:
        lines.append(f"| {label} | " + _row(t) + " | " + _row(p) + " |")
    steps = [(a, b) for a, b in zip(s["ttft"]["steps"], s["tpot"]["steps"], strict=True)]
    if steps:
        lines += [
            "",
            "| step change | at (sim s) | TTFT recovery ours / naive | TTFT coverage next 60 s | "
            "TPOT recovery ours / naive | TPOT coverage next 60 s |",
            "|---|---|---|---|---|---|",
        ]
        for a, b in steps:
            lines.append(
                f"| {a['name']} | {a['at_s']:.0f} | {_s(a['recovery_s'])} / {_s(a['naive_recovery_s'])} | "
                f"{_pct(a['first_60s'])} | {_s(b['recovery_s'])} / {_s(b['naive_recovery_s'])} | "
                f"{_pct(b['first_60s'])} |"
            )
        steady = [_s(s[m].get("steady_recovery_s")) for m in ("ttft", "tpot")]
        lines.append(f"| (no change: the same rule on the steady stage) | | {steady[0]} | | {steady[1]} | |")
    lines.append("")
    return lines


def _pace(r: dict[str, Any]) -> str:
    if r["kind"] != "sim" or not r["wall_s"]:
        return ""
    return f" ({r['sim_s']:.0f} simulated s: {r['sim_s'] / r['wall_s']:.1f}x effective pace)"


def _row(m: dict[str, Any]) -> str:
    if not m.get("samples"):
        return "0 | - | - | -"
    ci = f"[{m['coverage_lo']:.3f}, {m['coverage_hi']:.3f}]"
    pin = _ms(m["pinball_ms"])
    if "ratio" in m:
        pin = f"{_ms(m['ours_pinball_compared_ms'])} / {_ms(m['naive_pinball_ms'])} ({m['ratio']:.2f})"
    naive = f"{m['naive_coverage']:.3f}" if "naive_coverage" in m else "-"
    return f"{m['samples']} | {m['coverage']:.3f} {ci} | {pin} | {naive}"


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def _pct(m: dict[str, Any]) -> str:
    return f"{m['coverage']:.3f} (n={m['samples']})" if m.get("samples") else "-"


def _s(value: float | None) -> str:
    return "never" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.0f} s"


def write_block(path: Path, block: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace the generated block (``begin`` to ``end``) of ``path`` or append it, keeping the rest."""
    text = path.read_text() if path.exists() else "# Accuracy benchmark\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
