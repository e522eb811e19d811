"""In-process replay of the real H200 traces with the online calibration: TPOT/TTFT coverage per stage.

A development check, minutes cheaper than ``bench/accuracy_evidence.py`` (which replays through
real servers over HTTP): each trace is read in file order (= time) in chunks of ``--chunk``
entries; every chunk is predicted by the serving path (``prediction_server.predictor.Predictor``
on the store's current version, regime offsets included) before its samples go to the window and
to the training server's own live scorer (``training_server.live_scoring.LiveScorer``: the online
calibration, publishing calibration versions with no minimum interval); the trainer retrains after
every ``--retrain-every`` entries with the live scorer's offsets, as the service does. Requests a
model answered with the prior's trees are left out (and counted in a second coverage and pinball,
what a client sees from the start). Per trace and model: coverage and pinball overall, coverage per
load stage and per running-request bin (``RUNNING_EDGES``: what TPOT's decode batch grows with),
each with its median log ratio of prediction to actual (over-prediction > 0).
``--history-stages K`` starts from history instead of cold: the trace's first K load stages go into
the window first, as ``python -m training_server import-trace`` loads a recorded trace (not scored),
the trainer retrains on them, and only the later stages are replayed and judged: a server restarted
(or given a recorded trace) partway up the trace's ramp.
``--shifts S [S ...]`` also reports, per model, the coverage of the served predictions scaled by
``1 + s`` for each ``s`` (overall and per stage): how precisely a prediction must sit for its
coverage to stay in #9's band of 0.88-0.92 (on a saturated TPOT, whose top tenth lies within a few
per cent of its p90, 1 % moves it by 3-7 points).
``--setting KEY=VALUE`` changes a ``TrainingSettings`` field, e.g. the
model structure (``work_baseline=false``, ``monotone_constraints=false``: trees only) or
``live_scoring=false`` (no online calibration).

    OMP_NUM_THREADS=1 .venv/bin/python bench/h200_calibration_replay.py [--code CHECKOUT] [--setting K=V]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.code_path import add_arguments, use_services  # noqa: E402 (no service imported)

RUNNING_EDGES = (10, 20, 40, 80, 160)  # bins of num_request_running: 0-9, 10-19, ..., 160+
MIN_CELL_ROWS = 30  # a stage or bin with fewer trained-model rows is not reported


def replay(
    name: str,
    directory: Path,
    chunk: int,
    retrain_every: int,
    q: float,
    overrides: dict[str, Any],
    history_stages: int = 0,
    shifts: tuple[float, ...] = (),
) -> dict[str, Any]:
    from bench.accuracy_trace import load_trace, recover_stages
    from bench.inprocess_training import InProcessTraining
    from shared.features import build_features
    from shared.schemas import parse_training_entries
    from training_server.evaluation import pinball_loss

    trace = load_trace(name, directory)
    entries = trace.entries
    stages = recover_stages(trace.load(), trace.rates_qps, trace.durations_s)
    columns, _ = parse_training_entries(entries, now_s=time.time())
    n = len(entries)
    stamps = time.time() - n * 0.1 + np.arange(n) * 0.1  # file order is time
    predicted = {"ttft": np.zeros(n), "tpot": np.zeros(n)}
    trained = {"ttft": np.zeros(n, dtype=bool), "tpot": np.zeros(n, dtype=bool)}
    bounds = [*stages, n]
    start = bounds[min(history_stages, len(stages))]  # the first entry replayed; before it: history
    with tempfile.TemporaryDirectory() as tmp:
        training = InProcessTraining(Path(tmp), q, calibration_publish_interval_s=0, **overrides)
        if start:  # as ``import-trace`` loads a recorded trace: into the window, not scored; then a retrain
            training.window.insert({k: v[:start] for k, v in columns.items()}, stamps[:start])
            training.retrain(stamps[start - 1])
        predictor = training.predictor()
        since = 0
        for lo in range(start, n, chunk):
            hi = min(n, lo + chunk)
            part = {k: v[lo:hi] for k, v in columns.items()}
            predicted["ttft"][lo:hi], predicted["tpot"][lo:hi] = predictor.predict(build_features(part))
            for name in predicted:
                trained[name][lo:hi] = predictor.manifest.model_kind(name) != "prior"
            training.ingest(part, stamps[lo:hi])
            changed = training.publish_calibration() is not None
            since += hi - lo
            if since >= retrain_every:
                since = 0
                changed |= training.retrain(stamps[hi - 1]).outcome == "published"
            if changed:
                predictor = training.predictor()
    result: dict[str, Any] = {}
    at = np.arange(n)
    for name in predicted:
        actual = columns[f"actual_{name}_ms"]
        rows = (actual > 0) & trained[name]
        covered = actual <= predicted[name]
        loss = pinball_loss(actual, predicted[name], q)
        answered = (actual > 0) & (at >= start)  # the prior's answers too: what a client sees from the start
        cells: dict[str, Any] = {
            "rows": int(rows.sum()),
            "coverage": float(covered[rows].mean()) if rows.any() else None,
            "pinball_ms": float(loss[rows].mean()) if rows.any() else None,
            "with_prior": {
                "rows": int(answered.sum()),
                "coverage": float(covered[answered].mean()),
                "pinball_ms": float(loss[answered].mean()),
            },
        }
        groups = {f"stage {k + 1}": (at >= bounds[k]) & (at < bounds[k + 1]) for k in range(len(stages))}
        running = np.digitize(columns["num_request_running"], RUNNING_EDGES)
        lows = (0, *RUNNING_EDGES)
        for b, low in enumerate(lows):
            label = f"{low}+" if b == len(RUNNING_EDGES) else f"{low}-{lows[b + 1] - 1}"
            groups[f"running {label}"] = running == b
        for label, group in groups.items():
            m = rows & group
            if m.sum() >= MIN_CELL_ROWS:
                cells[label] = {
                    "rows": int(m.sum()),
                    "coverage": float(covered[m].mean()),
                    "log_ratio": float(np.median(np.log(predicted[name][m] / actual[m]))),
                }
        if shifts:
            stage_groups = {k: v for k, v in groups.items() if k.startswith("stage")}
            cells["shifts"] = coverage_under_shifts(actual, predicted[name], rows, stage_groups, shifts)
        result[name] = cells
    return result


def coverage_under_shifts(
    actual: np.ndarray,
    predicted: np.ndarray,
    rows: np.ndarray,
    groups: dict[str, np.ndarray],
    shifts: tuple[float, ...],
) -> dict[str, dict[str, float]]:
    """Per shift ``s`` (keyed ``f"{s:+.3f}"``): the coverage of ``predicted * (1 + s)`` over ``rows``
    and over each group's rows (groups with fewer than ``MIN_CELL_ROWS`` left out)."""
    out: dict[str, dict[str, float]] = {}
    for s in shifts:
        covered = actual <= predicted * (1.0 + s)
        cell = {"overall": float(covered[rows].mean())} if rows.any() else {}
        for label, group in groups.items():
            m = rows & group
            if m.sum() >= MIN_CELL_ROWS:
                cell[label] = float(covered[m].mean())
        out[f"{s:+.3f}"] = cell
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces-dir", type=Path, help="default: bench.accuracy_trace.DEFAULT_DIR")
    parser.add_argument("--traces", nargs="+", help="default: bench.accuracy_trace.TRACES")
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--retrain-every", type=int, default=200)
    parser.add_argument(
        "--history-stages",
        type=int,
        default=0,
        help="load the first K load stages into the window first (as import-trace does, not scored), "
        "retrain on them, and replay the rest (default 0: cold)",
    )
    parser.add_argument(
        "--shifts",
        type=float,
        nargs="+",
        default=[],
        metavar="S",
        help="also report the coverage of the served predictions scaled by 1 + S (e.g. -0.01 0 0.01)",
    )
    parser.add_argument("--json", type=Path)
    add_arguments(parser, "work_baseline=false, live_scoring=false")
    args = parser.parse_args(argv)
    overrides = use_services(args)  # nothing of the services is imported before this
    from bench.accuracy_trace import DEFAULT_DIR, TRACES

    directory = args.traces_dir or DEFAULT_DIR
    report: dict[str, Any] = {}
    for trace in args.traces or TRACES:
        r = report[trace] = replay(
            trace,
            directory,
            args.chunk,
            args.retrain_every,
            args.quantile,
            overrides,
            args.history_stages,
            tuple(args.shifts),
        )
        for name, cells in r.items():
            groups = " ".join(
                f"{k}: {v['coverage']:.3f} (n={v['rows']}, {v['log_ratio']:+.3f})"
                for k, v in cells.items()
                if k.startswith(("stage", "running"))
            )
            every = cells["with_prior"]
            print(
                f"{trace} {name.upper()} coverage {cells['coverage']:.3f} (n={cells['rows']}), "
                f"pinball {cells['pinball_ms']:.2f} ms; with the prior's answers {every['coverage']:.3f} "
                f"(n={every['rows']}), {every['pinball_ms']:.2f} ms; {groups}",
                flush=True,
            )
            for shift, cell in cells.get("shifts", {}).items():
                by_group = " ".join(f"{k}: {v:.3f}" for k, v in cell.items())
                print(f"  {trace} {name.upper()} served x (1 {shift[0]} {shift[1:]}): {by_group}", flush=True)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
