"""Per-call latency of the JIT and numpy evaluators against XGBoost's own predictors, single-threaded.

Run from the repository root:

    OMP_NUM_THREADS=1 taskset -c 1 python bench/tree_eval.py [--trees 200 --depth 6 --features 20]

Trains a TTFT-like (quantile, alpha 0.9) and a TPOT-like (squared error) model on random data,
checks that the margins agree, then times one call on n rows for
  jit       JitForests.predict_margins(ndarray), the served evaluator (numba), this model alone
  compiled  CompiledForest.predict_margin(ndarray), the numpy fallback
  inplace   Booster.inplace_predict(ndarray, predict_type="margin") with nthread=1
  pandas    XGBRegressor(n_jobs=1).predict(DataFrame), the naive reference (DataFrame prebuilt)
Each cell is the median over `--runs` runs of the median per-call time within a run; the three
methods alternate within each run so drift hits them alike.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # must precede xgboost's import, which starts OpenMP

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xgboost as xgb

# `python bench/tree_eval.py` puts bench/ (not the repository root) on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prediction_server.jit_forest import JitForests
from prediction_server.trees import CompiledForest

MODELS: dict[str, dict[str, Any]] = {
    "ttft": {"objective": "reg:quantileerror", "quantile_alpha": 0.9},
    "tpot": {"objective": "reg:squarederror"},
}


def _train(params: dict[str, Any], args: argparse.Namespace) -> tuple[xgb.XGBRegressor, pd.DataFrame]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, args.features)).astype(np.float32)
    y = 3 * X[:, 0] + np.sin(2 * X[:, 1]) + X[:, 2] * X[:, 3] + rng.exponential(size=X.shape[0])
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(args.features)])
    model = xgb.XGBRegressor(
        n_estimators=args.trees, max_depth=args.depth, tree_method="hist", n_jobs=1, **params
    )
    model.fit(frame, y)
    model.get_booster().set_param({"nthread": 1})
    return model, frame


def _timings_us(methods: dict[str, Callable[[], object]], runs: int, run_seconds: float) -> dict[str, float]:
    calls = {}
    for name, fn in methods.items():
        fn()  # warm caches and lazy initialisation
        start = time.perf_counter()
        fn()
        calls[name] = max(3, min(20_000, int(run_seconds / max(time.perf_counter() - start, 1e-7))))
    medians: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(runs):
        for name, fn in methods.items():
            samples = []
            for _ in range(calls[name]):
                start = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - start)
            medians[name].append(statistics.median(samples))
    return {name: statistics.median(values) * 1e6 for name, values in medians.items()}


def _bench_model(name: str, args: argparse.Namespace, rows: list[int], rng: np.random.Generator) -> None:
    model, frame = _train(MODELS[name], args)
    booster = model.get_booster()
    forest = CompiledForest.from_booster(booster)
    jit = JitForests.from_boosters([booster])
    print(
        f"\n{name}: {MODELS[name]['objective']}, {forest.num_trees} trees, max depth "
        f"{forest.max_depth}, {forest.num_features} features"
    )
    print(
        f"{'rows':>6} {'jit_us':>8} {'compiled_us':>12} {'inplace_us':>11} {'pandas_us':>10}"
        f" {'compiled/jit':>13} {'inplace/jit':>12} {'pandas/jit':>11} {'jit_us/row':>11}"
    )
    for n in rows:
        X = np.ascontiguousarray(rng.normal(size=(n, args.features)).astype(np.float32) * 1.5)
        query = pd.DataFrame(X, columns=frame.columns)
        reference = booster.inplace_predict(X, predict_type="margin")
        if not np.array_equal(jit.predict_margins(X)[0], reference):
            raise SystemExit(f"{name}: JIT margins differ from XGBoost at n={n}")
        if not np.allclose(forest.predict_margin(X), reference, rtol=1e-5, atol=1e-5):
            raise SystemExit(f"{name}: margins differ from XGBoost at n={n}")
        if not np.allclose(model.predict(query, output_margin=True), reference, rtol=1e-5, atol=1e-5):
            raise SystemExit(f"{name}: XGBRegressor.predict differs from inplace_predict at n={n}")
        us = _timings_us(
            {
                "jit": partial(jit.predict_margins, X),
                "compiled": partial(forest.predict_margin, X),
                "inplace": partial(booster.inplace_predict, X, predict_type="margin"),
                "pandas": partial(model.predict, query),
            },
            args.runs,
            args.run_seconds,
        )
        print(
            f"{n:>6} {us['jit']:>8.1f} {us['compiled']:>12.1f} {us['inplace']:>11.1f} {us['pandas']:>10.1f}"
            f" {us['compiled'] / us['jit']:>13.2f} {us['inplace'] / us['jit']:>12.2f}"
            f" {us['pandas'] / us['jit']:>11.2f} {us['jit'] / n:>11.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--rows", default="1,10,100,1000,10000", help="comma-separated batch sizes")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--run-seconds", type=float, default=0.2, help="time budget per method per run")
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    args = parser.parse_args()
    rows = [int(n) for n in args.rows.split(",")]

    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "n/a"
    print(
        f"xgboost {xgb.__version__}, numpy {np.__version__}, OMP_NUM_THREADS="
        f"{os.environ['OMP_NUM_THREADS']}, cpus {affinity}; {args.runs} runs, median of per-run medians"
    )
    rng = np.random.default_rng(1)
    for name in args.models.split(","):
        _bench_model(name, args, rows, rng)


if __name__ == "__main__":
    main()
