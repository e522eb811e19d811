"""Benchmark: retrain wall time of the training server's trainer on one core.

Builds a stratified window of N synthetic samples (``training_server.synthetic``), then times
``Trainer.run`` -- thinning, features, fitting TTFT and TPOT, conformal calibration, held-out
evaluation of candidate and current version, and the atomic publish -- with the server's
default model settings, XGBoost ``nthread=1`` and this process pinned to one CPU core.
Prints the median over repeated runs (not a test; the machine may be shared).

    OMP_NUM_THREADS=1 .venv/bin/python bench/training_retrain.py --samples 50000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.model_store import ModelStore
from shared.prior import publish_prior
from training_server import synthetic
from training_server.config import TrainingSettings
from training_server.trainer import Trainer
from training_server.window import StratifiedWindow


@dataclass
class RetrainResult:
    samples: int
    runs_s: list[float]
    cpu_s: list[float]  # process CPU time per run: robust to other load on a shared machine
    outcomes: list[str]
    coverage: dict[str, float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s)

    @property
    def median_cpu_s(self) -> float:
        return statistics.median(self.cpu_s)


def retrain_times(samples: int, repeats: int, core: int | None) -> RetrainResult:
    """Seconds per ``Trainer.run`` on a window of ``samples`` samples (first run replaces the prior)."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    with tempfile.TemporaryDirectory() as tmp:
        settings = TrainingSettings(data_dir=Path(tmp), training_threads=1)
        store = ModelStore(settings.store_dir)
        publish_prior(store, settings.quantile)
        window = StratifiedWindow(stratum_cap=1_000_000, max_age_s=settings.max_age_s)
        rng = np.random.default_rng(0)
        now = time.time()
        window.insert(synthetic.samples(samples, rng), now - 600 + np.linspace(0, 599, samples))
        snapshot = window.snapshot()
        trainer = Trainer(store, settings)
        result = RetrainResult(len(snapshot), [], [], [], {})
        for _ in range(repeats):
            started, cpu_started = time.perf_counter(), time.process_time()
            outcome = trainer.run(snapshot, time.time())
            result.runs_s.append(time.perf_counter() - started)
            result.cpu_s.append(time.process_time() - cpu_started)
            result.outcomes.append(outcome.outcome)
            result.coverage = {name: m["candidate"]["coverage"] for name, m in outcome.models.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--core", type=int, default=0, help="CPU core to pin to (-1: no pinning)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = retrain_times(args.samples, args.repeats, None if args.core < 0 else args.core)
    print(
        f"retrain of a {result.samples:,}-sample window on 1 core: median {result.median_s:.2f} s wall, "
        f"{result.median_cpu_s:.2f} s CPU"
    )
    print(f"runs: {', '.join(f'{t:.2f}' for t in result.runs_s)} s; outcomes {result.outcomes}")
    print(f"held-out coverage: {result.coverage}")


if __name__ == "__main__":
    main()
