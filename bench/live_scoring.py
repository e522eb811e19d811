"""Benchmark: what live scoring and online calibration cost, and how fast replicas take offsets.

1. Ingestion throughput (bulk requests of 1,000) of a real training server pinned to one core
   (``taskset``) serving a trained model (default model settings: 150 trees, depth 6), with live
   scoring on (the default) and off (``--no-live-scoring``), as medians over repeated runs, and
   how many of the ingested samples the scoring thread scored or skipped.
2. The scoring thread's own capacity: ``LiveScorer.process`` + ``maybe_publish`` on batches of
   1,000 against that model, in process on one thread (samples per second of CPU).
3. The switch time of a prediction-server ``Predictor`` to a new version of that model: a full
   compile (``Predictor.from_model_set``, a retrained version) against an offsets-only swap
   (``Predictor.recalibrated``, a calibration version with the same files), in process.

Not a test: the machine may be shared, so read medians.

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python bench/live_scoring.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.training_ingest import Server, blast, make_bodies  # noqa: E402
from prediction_server.predictor import Predictor  # noqa: E402
from shared.model_store import ModelStore  # noqa: E402
from shared.regimes import DEFAULT_SCHEME, RegimeOffsets  # noqa: E402
from training_server import synthetic  # noqa: E402
from training_server.config import TrainingSettings  # noqa: E402
from training_server.live_scoring import LiveScorer  # noqa: E402
from training_server.metrics import TrainingMetrics  # noqa: E402

# No automatic retrain during the measurement: this isolates the cost of scoring.
QUIET = ["--min-new-samples", "100000000", "--retrain-interval-s", "36000"]


def ingest(tmp: Path, bodies: list[bytes], args: argparse.Namespace, live: bool) -> dict[str, object]:
    data = tmp / f"data-{'live' if live else 'off'}"
    server = Server(data, args.server_core, [*QUIET, "--live-scoring" if live else "--no-live-scoring"])
    try:
        blast(server, bodies, 20, args.concurrency)
        httpx.post(server.url + "/retrain", params={"wait": "true"}, timeout=300).raise_for_status()
        rates = [blast(server, bodies, args.requests, args.concurrency) for _ in range(args.repeats)]
        deadline = time.monotonic() + 60
        while live and server.status()["live"]["pending_samples"] and time.monotonic() < deadline:
            time.sleep(0.1)
        status = server.status()
    finally:
        server.stop()
    result: dict[str, object] = {
        "samples_per_s": round(statistics.median(r["samples_per_s"] for r in rates)),
        "all": [round(r["samples_per_s"]) for r in rates],
        "server_cpu_us_per_sample": round(statistics.median(r["server_cpu_us_per_sample"] for r in rates), 2),
        "rejected": sum(r["rejected"] for r in rates),
    }
    if live:
        result["scored"] = status["live"]["scored_samples"]
        result["skipped"] = status["live"]["skipped_samples"]
        result["store"] = data / "models"
    return result


def switch_times(store_dir: Path, repeats: int) -> dict[str, float]:
    store = ModelStore(store_dir)
    trained = next(v for v in reversed(store.versions()) if v.endswith("-trained"))
    model_set = store.load(trained)
    compile_s, swap_s = [], []
    predictor = Predictor.from_model_set(model_set)
    offsets = RegimeOffsets.of(DEFAULT_SCHEME, np.linspace(-0.1, 0.2, DEFAULT_SCHEME.size))
    calibrated = store.publish_calibrated(store.current_version() or "", {"ttft": offsets}, {})
    assert calibrated is not None
    calibrated_set = store.load(calibrated.version)
    for _ in range(repeats):
        started = time.perf_counter()
        Predictor.from_model_set(model_set)
        compile_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        predictor.recalibrated(calibrated_set)
        swap_s.append(time.perf_counter() - started)
    return {
        "compile_ms": round(1000 * statistics.median(compile_s), 2),
        "offsets_swap_ms": round(1000 * statistics.median(swap_s), 3),
    }


def scoring_capacity(store_dir: Path, batches: int) -> dict[str, float]:
    settings = TrainingSettings(data_dir=store_dir.parent)
    store = ModelStore(store_dir)
    scorer = LiveScorer(store, settings, TrainingMetrics(CollectorRegistry()), lambda e: None, lambda m: None)
    scorer.set_current(store.read_manifest(store.current_version() or ""))
    rng = np.random.default_rng(4)
    data = []
    for _ in range(batches):
        columns = synthetic.samples(1000, rng)
        columns["predicted_ttft_ms"] = columns["predicted_tpot_ms"] = np.zeros(1000)
        data.append((columns, np.full(1000, time.time())))
    cpu0 = time.thread_time()
    for columns, stamps in data:
        scorer.process(columns, stamps)
        scorer.maybe_publish()
    cpu = time.thread_time() - cpu0
    return {
        "samples_per_cpu_s": round(batches * 1000 / cpu),
        "us_per_sample": round(1e6 * cpu / batches / 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300, help="bulk requests of 1,000 per run")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--server-core", type=int, default=0)
    args = parser.parse_args()
    bodies = make_bodies(60, seed=3)
    with tempfile.TemporaryDirectory() as tmp:
        off = ingest(Path(tmp), bodies, args, live=False)
        print(f"ingestion, live scoring off: {off}", flush=True)
        live = ingest(Path(tmp), bodies, args, live=True)
        store = live.pop("store")
        print(f"ingestion, live scoring on:  {live}", flush=True)
        print(f"scoring capacity: {scoring_capacity(Path(str(store)), 100)}", flush=True)
        print(f"prediction-server switch: {switch_times(Path(str(store)), 5)}", flush=True)


if __name__ == "__main__":
    main()
