"""Before/after table of accuracy runs, from their ``--json`` dumps.

    .venv/bin/python bench/accuracy_compare.py main=/tmp/main.json models=/tmp/models.json \
        --out docs/benchmarks-accuracy.md

Takes the dumps of ``bench/accuracy_evidence.py`` (over HTTP) and of
``bench/sim_calibration_replay.py`` (in process) alike. Per replay and model, and per run:
trained-model coverage overall and queued (``waiting>0``), the pinball loss and the ours/naive
ratio, the slowest recovery after a step, and how many targets passed. Below the table, per run:
the targets met per model, and on how many replays each model's pinball is lower than in the
first run. All of it goes into the ``accuracy-evidence-compare`` block of ``--out`` (``--block
NAME``: the ``accuracy-evidence-NAME`` block).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.accuracy_doc import MODELS, markers, write_block


def as_replays(dump: Any) -> list[dict[str, Any]]:
    """The replays of a ``--json`` dump: ``accuracy_evidence.py``'s list as it is, and
    ``sim_calibration_replay.py``'s mapping (replay name -> per model ``summary`` and ``checks``)
    in the same shape (``name``, ``summaries``, ``checks``)."""
    if isinstance(dump, list):
        return dump
    return [
        {
            "name": name,
            "summaries": {m: replay[m]["summary"] for m in MODELS},
            "checks": {m: replay[m]["checks"] for m in MODELS},
        }
        for name, replay in dump.items()
    ]


def _cells(replay: dict[str, Any] | None, model: str) -> str:
    if replay is None:
        return "- | - | - | - | - | -"
    s = replay["summaries"][model]
    checks = replay["checks"][model]
    o, q = s["overall"], s["regime"].get("waiting>0", {})
    cov = f"{o['coverage']:.3f}" if o.get("samples") else "-"
    queued = f"{q['coverage']:.3f} (n={q['samples']})" if q.get("samples") else "-"
    pinball = f"{o['pinball_ms']:.3g} ms" if o.get("samples") else "-"
    ratio = f"{o['ratio']:.2f}" if "ratio" in o else "-"
    recoveries = [st["recovery_s"] for st in s["steps"]]
    if not recoveries:
        rec = "-"
    elif any(r is None for r in recoveries):
        rec = "never"
    else:
        rec = f"{max(recoveries):.0f} s"
    passed = sum(c["pass"] for c in checks)
    return f"{cov} | {queued} | {pinball} | {ratio} | {rec} | {passed}/{len(checks)}"


def table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    names = list(dict.fromkeys(r["name"] for replays in runs.values() for r in replays))
    header = (
        "| replay | model | run | coverage | queued coverage | pinball | pinball / naive | recovery | met |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        for model in MODELS:
            for label, replays in runs.items():
                replay = next((r for r in replays if r["name"] == name), None)
                lines.append(f"| {name} | {model.upper()} | {label} | {_cells(replay, model)} |")
    return lines


def totals(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Per run: targets met per model (of those its replays checked); after the first run, on how
    many of the replays both runs have each model's pinball is lower than in the first run."""
    first_label, first = next(iter(runs.items()))
    by_name = {r["name"]: r for r in first}
    lines = []
    for label, replays in runs.items():
        parts = []
        for model in MODELS:
            checks = [c for r in replays for c in r["checks"][model]]
            part = f"{model.upper()} {sum(c['pass'] for c in checks)} of {len(checks)}"
            if label != first_label:
                overall = [
                    (r["summaries"][model]["overall"], by_name[r["name"]]["summaries"][model]["overall"])
                    for r in replays
                    if r["name"] in by_name
                ]
                pairs = [(o, b) for o, b in overall if o.get("samples") and b.get("samples")]
                lower = sum(o["pinball_ms"] < b["pinball_ms"] for o, b in pairs)
                part += f", pinball lower than {first_label}'s on {lower} of {len(pairs)}"
            parts.append(part)
        lines.append(f"- {label}: targets met {'; '.join(parts)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs",
        nargs="+",
        help="LABEL=PATH of an accuracy_evidence.py or a sim_calibration_replay.py --json dump",
    )
    parser.add_argument("--out", type=Path, help="Markdown file whose compare block is (re)written")
    parser.add_argument("--block", default="compare", help="name of the generated block (default: compare)")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {}
    for spec in args.runs:
        label, _, path = spec.partition("=")
        runs[label] = as_replays(orjson.loads(Path(path).read_bytes()))
    begin, end = markers(args.block)
    block = "\n".join([begin, *table(runs), "", *totals(runs), end])
    print(block)
    if args.out is not None:
        write_block(args.out, block, begin, end)
    return 0


if __name__ == "__main__":
    sys.exit(main())
