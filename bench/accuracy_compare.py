"""Before/after table of accuracy evidence runs, from their ``--json`` dumps.

    .venv/bin/python bench/accuracy_compare.py main=/tmp/main.json models=/tmp/models.json \
        --out docs/benchmarks-accuracy.md

Per replay and model, and per run: trained-model coverage overall and queued (``waiting>0``), the
ours/naive pinball ratio, the slowest recovery after a step, and how many targets passed. The table
goes into the ``accuracy-evidence-compare`` block of ``--out`` (``--block NAME``: the
``accuracy-evidence-NAME`` block).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.accuracy_doc import markers, write_block

MODELS = ("ttft", "tpot")


def _cells(replay: dict[str, Any] | None, model: str) -> str:
    if replay is None:
        return "- | - | - | - | -"
    s = replay["summaries"][model]
    checks = replay["checks"][model]
    o, q = s["overall"], s["regime"].get("waiting>0", {})
    cov = f"{o['coverage']:.3f}" if o.get("samples") else "-"
    queued = f"{q['coverage']:.3f} (n={q['samples']})" if q.get("samples") else "-"
    ratio = f"{o['ratio']:.2f}" if "ratio" in o else "-"
    recoveries = [st["recovery_s"] for st in s["steps"]]
    if not recoveries:
        rec = "-"
    elif any(r is None for r in recoveries):
        rec = "never"
    else:
        rec = f"{max(recoveries):.0f} s"
    passed = sum(c["pass"] for c in checks)
    return f"{cov} | {queued} | {ratio} | {rec} | {passed}/{len(checks)}"


def table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    names = list(dict.fromkeys(r["name"] for replays in runs.values() for r in replays))
    header = "| replay | model | run | coverage | queued coverage | pinball / naive | recovery | met |"
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for name in names:
        for model in MODELS:
            for label, replays in runs.items():
                replay = next((r for r in replays if r["name"] == name), None)
                lines.append(f"| {name} | {model.upper()} | {label} | {_cells(replay, model)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=PATH of an accuracy_evidence.py --json dump")
    parser.add_argument("--out", type=Path, help="Markdown file whose compare block is (re)written")
    parser.add_argument("--block", default="compare", help="name of the generated block (default: compare)")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {}
    for spec in args.runs:
        label, _, path = spec.partition("=")
        runs[label] = orjson.loads(Path(path).read_bytes())
    begin, end = markers(args.block)
    block = "\n".join([begin, *table(runs), end])
    print(block)
    if args.out is not None:
        write_block(args.out, block, begin, end)
    return 0


if __name__ == "__main__":
    sys.exit(main())
