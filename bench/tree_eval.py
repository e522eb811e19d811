"""Per-call latency of the JIT and numpy evaluators against XGBoost's and onnxruntime's, one thread.

Run from the repository root:

    OMP_NUM_THREADS=1 taskset -c 1 python bench/tree_eval.py [--trees 200 --depth 6 --features 20]

Trains a TTFT-like (quantile, alpha 0.9) and a TPOT-like (squared error) model on random data,
checks that the margins agree, then times one call on n rows for
  jit       JitForests.predict_margins(ndarray), the served evaluator (numba), this model alone
  compiled  CompiledForest.predict_margin(ndarray), the numpy fallback
  inplace   Booster.inplace_predict(ndarray, predict_type="margin") with nthread=1
  pandas    XGBRegressor(n_jobs=1).predict(DataFrame), the naive reference (DataFrame prebuilt)
  onnx      onnxruntime TreeEnsembleRegressor, one thread (bench/onnx_forest.py), this model alone
then, for both models together (ttft and tpot):
  jit       JitForests.predict_margins(ndarray) of both models, one call
  onnx      one onnxruntime session, both models, one run call (two outputs)
  onnx_2run one session per model, two run calls
Each cell is the median over `--runs` runs of the median per-call time within a run; the
methods alternate within each run so drift hits them alike. By default every call gets the same
rows, which lets the CPU's branch predictor learn onnxruntime's branchy walk on small batches
(measured: 1 row 7.8 against 14 µs); `--pool-rows 2000` gives each call other rows, the served
case (the other methods' times did not move beyond noise). The onnx arms need the optional
extra, `.venv/bin/pip install -e '.[onnx]'` (not a runtime dependency); without it they are skipped.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # must precede xgboost's import, which starts OpenMP

import argparse
import itertools
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


def _onnx_forests() -> Any:
    """``bench.onnx_forest.OnnxForests``, or None (with a note) when onnx/onnxruntime do not import."""
    try:
        import onnxruntime

        from bench.onnx_forest import OnnxForests
    except ImportError as exc:
        print(f"onnx arms skipped: {exc} (.venv/bin/pip install -e '.[onnx]')")
        return None
    print(f"onnxruntime {onnxruntime.__version__}: onnx margins must equal inplace_predict's bit for bit")
    return OnnxForests


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


def _print_header(names: list[str]) -> None:
    ratios = "".join(f"{name + '/jit':>14}" for name in names if name != "jit")
    print(f"{'rows':>6}" + "".join(f"{name + '_us':>13}" for name in names) + ratios + f"{'jit_us/row':>11}")


def _print_row(n: int, us: dict[str, float]) -> None:
    times = "".join(f"{value:>13.1f}" for value in us.values())
    ratios = "".join(f"{us[name] / us['jit']:>14.2f}" for name in us if name != "jit")
    print(f"{n:>6}{times}{ratios}{us['jit'] / n:>11.2f}")


def _inputs(n: int, args: argparse.Namespace, rng: np.random.Generator) -> list[np.ndarray]:
    """The row matrices that the calls on n rows cycle through: one, or ~`--pool-rows` rows."""
    return [
        np.ascontiguousarray(rng.normal(size=(n, args.features)).astype(np.float32) * 1.5)
        for _ in range(max(1, args.pool_rows // n))
    ]


def _cycling(fn: Callable[[Any], object], inputs: list[Any]) -> Callable[[], object]:
    """A call of `fn` on the next of `inputs`, round robin."""
    following = itertools.cycle(inputs)
    return lambda: fn(next(following))


def _bench_model(
    name: str,
    trained: tuple[xgb.XGBRegressor, pd.DataFrame],
    args: argparse.Namespace,
    rows: list[int],
    rng: np.random.Generator,
    onnx_forests: Any,
) -> None:
    model, frame = trained
    booster = model.get_booster()
    forest = CompiledForest.from_booster(booster)
    jit = JitForests.from_boosters([booster])
    onnx = onnx_forests.from_boosters([booster]) if onnx_forests else None
    print(
        f"\n{name}: {MODELS[name]['objective']}, {forest.num_trees} trees, max depth "
        f"{forest.max_depth}, {forest.num_features} features"
    )
    _print_header(["jit", "compiled", "inplace", "pandas"] + (["onnx"] if onnx else []))
    for n in rows:
        inputs = _inputs(n, args, rng)
        X = inputs[0]
        queries = [pd.DataFrame(matrix, columns=frame.columns) for matrix in inputs]
        query = queries[0]
        reference = booster.inplace_predict(X, predict_type="margin")
        if not np.array_equal(jit.predict_margins(X)[0], reference):
            raise SystemExit(f"{name}: JIT margins differ from XGBoost at n={n}")
        if not np.allclose(forest.predict_margin(X), reference, rtol=1e-5, atol=1e-5):
            raise SystemExit(f"{name}: margins differ from XGBoost at n={n}")
        if not np.allclose(model.predict(query, output_margin=True), reference, rtol=1e-5, atol=1e-5):
            raise SystemExit(f"{name}: XGBRegressor.predict differs from inplace_predict at n={n}")
        methods = {
            "jit": _cycling(jit.predict_margins, inputs),
            "compiled": _cycling(forest.predict_margin, inputs),
            "inplace": _cycling(partial(booster.inplace_predict, predict_type="margin"), inputs),
            "pandas": _cycling(model.predict, queries),
        }
        if onnx is not None:
            if not np.array_equal(onnx.predict_margins(X)[0], reference):
                raise SystemExit(f"{name}: onnxruntime margins differ from XGBoost at n={n}")
            methods["onnx"] = _cycling(onnx.predict_margins, inputs)
        _print_row(n, _timings_us(methods, args.runs, args.run_seconds))


def _predict_each(forests: list[Any], X: np.ndarray) -> list[Any]:
    """One run call per model: what two separate onnxruntime sessions cost."""
    return [forest.predict_margins(X) for forest in forests]


def _bench_both(
    boosters: list[xgb.Booster],
    args: argparse.Namespace,
    rows: list[int],
    rng: np.random.Generator,
    onnx_forests: Any,
) -> None:
    """Both models per call: the JIT's one pass against one onnxruntime run and against two."""
    jit = JitForests.from_boosters(boosters)
    both = onnx_forests.from_boosters(boosters)
    each = [onnx_forests.from_boosters([booster]) for booster in boosters]
    print("\nboth models (ttft, tpot) per call")
    _print_header(["jit", "onnx", "onnx_2run"])
    for n in rows:
        inputs = _inputs(n, args, rng)
        X = inputs[0]
        reference = [booster.inplace_predict(X, predict_type="margin") for booster in boosters]
        for margins in (list(jit.predict_margins(X)), both.predict_margins(X)):
            if not all(map(np.array_equal, margins, reference)):
                raise SystemExit(f"both models: margins differ from XGBoost at n={n}")
        methods = {
            "jit": _cycling(jit.predict_margins, inputs),
            "onnx": _cycling(both.predict_margins, inputs),
            "onnx_2run": _cycling(partial(_predict_each, each), inputs),
        }
        _print_row(n, _timings_us(methods, args.runs, args.run_seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--rows", default="1,10,100,1000,10000", help="comma-separated batch sizes")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--run-seconds", type=float, default=0.2, help="time budget per method per run")
    parser.add_argument(
        "--pool-rows",
        type=int,
        default=0,
        help="0: every call on the same rows; R: calls cycle through distinct matrices of ~R rows in all",
    )
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    args = parser.parse_args()
    rows = [int(n) for n in args.rows.split(",")]

    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "n/a"
    print(
        f"xgboost {xgb.__version__}, numpy {np.__version__}, OMP_NUM_THREADS="
        f"{os.environ['OMP_NUM_THREADS']}, cpus {affinity}; {args.runs} runs, median of per-run medians; "
        f"pool rows {args.pool_rows}"
    )
    onnx_forests = _onnx_forests()
    trained = {name: _train(MODELS[name], args) for name in args.models.split(",")}
    rng = np.random.default_rng(1)
    for name, model in trained.items():
        _bench_model(name, model, args, rows, rng, onnx_forests)
    if onnx_forests and set(trained) == set(MODELS):
        _bench_both([trained[name][0].get_booster() for name in MODELS], args, rows, rng, onnx_forests)


if __name__ == "__main__":
    main()
