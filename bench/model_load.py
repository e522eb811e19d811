"""Model load and switch time of the prediction server: ``Predictor.from_model_set``, timed.

Run from the repository root, pinned to one core:

    OMP_NUM_THREADS=1 taskset -c 1 python bench/model_load.py [--sizes 200x6,150x6] [--code DIR]

For each size, publishes a trained version (bench/prediction_load.py's model, with a baseline)
into a temporary store, then in a fresh interpreter per measurement (``--processes`` of them)
times the first ``Predictor.from_model_set`` of the process (what a worker pays at start-up:
imports of XGBoost and numba, loading or compiling the JIT kernel, laying out the trees,
checking them on the probe matrix: until the process has loaded the JIT kernel, a version is
served by the numpy/XGBoost fallback while the kernel loads in the background), the time until
the JIT serves that first version, and the median of ``--switches`` more loads (what a running
worker pays to switch to a new version) and of as many recalibrations (a calibration version:
the same trees with new offsets, ``Predictor.recalibrated``). ``--cold`` gives each process an
empty numba cache (``NUMBA_CACHE_DIR``), as on a new machine, so the kernel is compiled. ``--code DIR`` takes
prediction_server and shared from another checkout (e.g. main, for a before/after comparison);
the store is always written by this one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = """
import sys, time, statistics
t = time.perf_counter()
from prediction_server.predictor import Predictor
from shared.model_store import ModelStore
imported = time.perf_counter() - t
model_set = ModelStore(sys.argv[1]).load()
t = time.perf_counter()
predictor = Predictor.from_model_set(model_set)
first = time.perf_counter() - t
first_evaluator = predictor.evaluator
wait = getattr(predictor.forests, "wait", None)  # a first version switching to the JIT
if wait is not None:
    wait(120)
jit_after = time.perf_counter() - t
import prediction_server.jit_forest as jit_forest
warm_served = getattr(jit_forest, "warm_served_kernel", None)  # the fused kernel, where it exists
if warm_served is not None:
    warm_served()  # blocks until the background warm-up (or this call) has loaded it
served_after = time.perf_counter() - t
switches = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    Predictor.from_model_set(model_set)
    switches.append(time.perf_counter() - t)
recalibrations = []  # a calibration version: same trees, new offsets
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    predictor.recalibrated(model_set)
    recalibrations.append(time.perf_counter() - t)
print(imported, first, jit_after, served_after, statistics.median(switches),
      statistics.median(recalibrations), first_evaluator, predictor.evaluator)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200x6,150x6")
    parser.add_argument("--code", type=Path, default=REPO, help="checkout whose prediction_server is timed")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--switches", type=int, default=5)
    parser.add_argument(
        "--cold",
        action="store_true",
        help="an empty numba cache per process (a new machine)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    from prediction_load import publish_benchmark_model

    from shared.model_store import ModelStore

    env = {**os.environ, "PYTHONPATH": str(args.code.resolve()), "OMP_NUM_THREADS": "1"}
    cache = "an empty numba cache per process" if args.cold else "numba's cache as it is"
    print(f"code {args.code.resolve()}; {args.processes} processes; {cache}; medians")
    print(
        "| model | first served by | then | import s | first load s | JIT serving after s "
        "| fused kernel after s | switch s | recalibration switch ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        trees, depth = (int(v) for v in size.split("x"))
        root = Path(tempfile.mkdtemp(prefix="model-load-"))
        publish_benchmark_model(ModelStore(root), trees, depth)
        runs = []
        for _ in range(args.processes):
            if args.cold:
                env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cache-")
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, str(root), str(args.switches)],
                env=env,
                cwd=tempfile.gettempdir(),  # not a checkout: PYTHONPATH alone decides the code
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            runs.append(out)
        imported, first, jit_after, served_after, switch, recalibration = (
            statistics.median(float(r[i]) for r in runs) for i in range(6)
        )
        print(
            f"| {size} | {runs[0][6]} | {runs[0][7]} | {imported:.2f} | {first:.2f} | {jit_after:.2f} "
            f"| {served_after:.2f} | {switch:.2f} | {recalibration * 1e3:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
