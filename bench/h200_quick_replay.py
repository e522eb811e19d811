"""Quick in-process replay of the real H200 traces: does the model structure follow the load?

A small check for the trainer's model structure, not the evidence harness (that one replays through
real servers over HTTP): each trace is read in file order (= time), in chunks of ``--chunk``
entries; every chunk is predicted by the serving path (``prediction_server.predictor.Predictor``
on the store's current version) before it goes into the window, and the trainer retrains after
every ``--retrain-every`` new entries (the default trigger: 200 new samples at this window size).
Requests the prior answered are excluded. Reported per trace and configuration: TTFT and TPOT p90
coverage and pinball loss, overall and for queued rows (``num_request_waiting > 0``).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/h200_quick_replay.py
"""

from __future__ import annotations

import argparse
import lzma
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prediction_server.predictor import Predictor  # noqa: E402
from shared.artifacts import ModelStore  # noqa: E402
from shared.features import build_features  # noqa: E402
from shared.prior import publish_prior  # noqa: E402
from shared.schemas import parse_training_entries  # noqa: E402
from training_server.config import TrainingSettings  # noqa: E402
from training_server.trainer import Trainer  # noqa: E402
from training_server.window import StratifiedWindow  # noqa: E402

# ../shared beside the main checkout, ../../shared beside a worktree under wt/
TRACES = (
    next(
        (p for p in (REPO.parent / "shared", REPO.parent.parent / "shared") if (p / "data").is_dir()),
        REPO.parent / "shared",
    )
    / "data"
    / "llmd-h200-traces"
)
CONFIGS: dict[str, dict[str, Any]] = {
    "trees only": {"work_baseline": False, "monotone_constraints": False},
    "baseline + monotone": {"work_baseline": True, "monotone_constraints": True},
    "baseline, unconstrained trees": {"work_baseline": True, "monotone_constraints": False},
}


def replay(path: Path, overrides: dict[str, Any], chunk: int, retrain_every: int, q: float) -> dict[str, Any]:
    with lzma.open(path, "rt") as lines:
        entries = [orjson.loads(line) for line in lines]
    columns, _ = parse_training_entries(entries, now_s=time.time())
    n = len(entries)
    stamps = time.time() - n * 0.1 + np.arange(n) * 0.1  # file order is time
    with tempfile.TemporaryDirectory() as tmp:
        settings = TrainingSettings(data_dir=Path(tmp), quantile=q, **overrides)
        store = ModelStore(settings.store_dir)
        publish_prior(store, q)
        trainer = Trainer(store, settings)
        window = StratifiedWindow(settings.stratum_cap, settings.max_age_s)
        predicted = {"ttft": np.zeros(n), "tpot": np.zeros(n)}
        by_prior = np.zeros(n, dtype=bool)
        since = 0
        predictor = Predictor.from_model_set(store.load())
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            part = {k: v[lo:hi] for k, v in columns.items()}
            predicted["ttft"][lo:hi], predicted["tpot"][lo:hi] = predictor.predict(build_features(part))
            by_prior[lo:hi] = predictor.kind == "prior"
            window.insert(part, stamps[lo:hi])
            since += hi - lo
            if since >= retrain_every:
                since = 0
                outcome = trainer.run(window.snapshot(settings.max_train_samples), stamps[hi - 1])
                if outcome.outcome == "published":
                    predictor = Predictor.from_model_set(store.load())
    result: dict[str, Any] = {}
    queued = columns["num_request_waiting"] > 0
    for name in ("ttft", "tpot"):
        actual = columns[f"actual_{name}_ms"]
        for label, mask in (("all", np.ones(n, dtype=bool)), ("queued", queued)):
            rows = (actual > 0) & ~by_prior & mask
            diff = actual[rows] - predicted[name][rows]
            result[f"{name}_{label}"] = {
                "rows": int(rows.sum()),
                "coverage": float(np.mean(diff <= 0)) if rows.any() else None,
                "pinball_ms": float(np.mean(np.maximum(q * diff, (q - 1) * diff))) if rows.any() else None,
            }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--traces", nargs="+", default=["sharegpt-h200", "chatbot-synthetic-h200", "bimodal-h200"]
    )
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--retrain-every", type=int, default=200)
    parser.add_argument("--quantile", type=float, default=0.9)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {}
    print(
        "| trace | config | TTFT cov | TTFT pinball ms | queued TTFT cov / pinball "
        "| TPOT cov | TPOT pinball ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for trace in args.traces:
        for label in args.configs:
            overrides = CONFIGS[label]
            r = replay(TRACES / f"{trace}.jsonl.xz", overrides, args.chunk, args.retrain_every, args.quantile)
            report[f"{trace}/{label}"] = r
            t, tq, p = r["ttft_all"], r["ttft_queued"], r["tpot_all"]
            print(
                f"| {trace} | {label} | {t['coverage']:.3f} | {t['pinball_ms']:.1f} | "
                f"{tq['coverage']:.3f} / {tq['pinball_ms']:.1f} ({tq['rows']} rows) | "
                f"{p['coverage']:.3f} | {p['pinball_ms']:.2f} |",
                flush=True,
            )
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
