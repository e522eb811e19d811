"""One real prediction replica's memory under steady load while new versions keep coming.

A replica loads a version about every second for as long as it runs (calibration versions: new
offsets only; trained versions: new trees), so anything it kept per version would grow without
bound. This publishes versions into a local model store, starts ``python -m prediction_server`` on
it (pinned to core 0), posts 8-row bulk calls in a loop from this process (core 1), and prints the
replica's resident memory every ``--every-s`` seconds:

- ``--versions calibration``: a calibration version every 0.5 s (random regime offsets on one
  trained version);
- ``--versions trained``: a retrain on 2,000 new synthetic samples every 3 s after the last one
  ended (``bench.inprocess_training``, the training server's own trainer), each published when the
  guard takes it.

    OMP_NUM_THREADS=1 python -m bench.replica_memory [--versions calibration|trained --minutes 10]

Linux only (``/proc``, ``taskset``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.inprocess_training import InProcessTraining
from bench.soak import process_tree
from shared.regimes import DEFAULT_SCHEME, RegimeOffsets
from shared.wire_fields import Columns
from training_server import synthetic

ROWS = [
    {
        "kv_cache_percentage": 0.3,
        "input_token_length": 500 + i,
        "num_request_waiting": i % 5,
        "num_request_running": 10,
        "num_tokens_generated": 1,
        "prefix_cache_score": 0.2,
    }
    for i in range(8)
]


def samples(n: int, seed: int, scale: float = 1.0) -> Columns:
    """``n`` of ``training_server.synthetic``'s samples, TTFT times ``scale`` (retrains differ)."""
    columns = synthetic.samples(n, np.random.default_rng(seed))
    columns["actual_ttft_ms"] = scale * columns["actual_ttft_ms"]
    columns["predicted_ttft_ms"] = columns["predicted_tpot_ms"] = np.zeros(n)  # none sent
    return columns


def publish_forever(training: InProcessTraining, versions: str, stop: threading.Event) -> None:
    rng, k = np.random.default_rng(1), 1
    while not stop.is_set():
        if versions == "calibration":
            offsets = {
                name: RegimeOffsets.of(DEFAULT_SCHEME, np.round(rng.normal(0, 0.1, DEFAULT_SCHEME.size), 6))
                for name in ("ttft", "tpot")
            }
            training.store.publish_calibrated(training.store.current_version(), offsets, {})
            stop.wait(0.5)
        else:
            now = time.time()
            training.ingest(samples(2000, 100 + k, 1 + 0.05 * (k % 3)), np.full(2000, now))
            training.retrain(now)
            k += 1
            stop.wait(3.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", choices=("calibration", "trained"), default="calibration")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every-s", type=float, default=30.0)
    parser.add_argument("--port", type=int, default=8811)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {1})
    training = InProcessTraining(Path(tempfile.mkdtemp(prefix="replica-memory-")), 0.9)
    now = time.time()
    training.ingest(samples(5000, 0), np.full(5000, now))
    training.retrain(now)
    argv_ = [sys.executable, "-m", "prediction_server", "--port", str(args.port)]
    argv_ += ["--store", str(training.settings.store_dir)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    replica = subprocess.Popen(
        ["taskset", "-c", "0", *argv_], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{args.port}"
    stop = threading.Event()
    try:
        with httpx.Client(timeout=10.0) as client:
            deadline = time.monotonic() + 60
            while not _ready(client, url):
                if time.monotonic() > deadline or replica.poll() is not None:
                    raise SystemExit("the replica did not become ready")
                time.sleep(0.2)
            threading.Thread(
                target=publish_forever, args=(training, args.versions, stop), daemon=True
            ).start()
            start = time.monotonic()
            next_print, calls = start, 0
            while time.monotonic() - start < args.minutes * 60:
                client.post(url + "/predict/bulk/strict", json={"requests": ROWS}).raise_for_status()
                calls += 1
                if time.monotonic() >= next_print:
                    print(
                        f"{time.monotonic() - start:5.0f} s: {calls} calls, replica RSS "
                        f"{_rss_mb(replica.pid):.1f} MB, store at {training.store.current_version()}",
                        flush=True,
                    )
                    next_print += args.every_s
    finally:
        stop.set()
        replica.terminate()
        replica.wait()
    return 0


def _rss_mb(pid: int) -> float:
    tree = process_tree(pid)
    if tree is None:
        raise SystemExit("the replica exited")
    return tree.rss_mb


def _ready(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url + "/readyz").status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
