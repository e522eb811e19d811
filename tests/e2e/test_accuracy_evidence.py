"""The accuracy evidence harness against real servers: a real H200 trace, predicted before it is sent.

A real training server and a real prediction server on loopback; the first 1,500 entries of the
real ``sharegpt-h200`` trace are replayed at 40x their recorded pace (``bench.accuracy_trace``),
with the naive baseline on the same stream, each sample carrying the prediction made for it
(``predicted_ttft_ms`` / ``predicted_tpot_ms``, which the training server accepts). The
user-visible promises of the harness: every entry is predicted and then sent exactly once, the
servers learn during the replay (the prior answers the first entries, trained versions the later
ones), and the baseline answers nothing before its first fit and a prediction for every entry
after it.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.accuracy_naive import SlidingWindowBaseline
from bench.accuracy_trace import DEFAULT_DIR, Trace, load_trace, replay_trace
from tests.procs import start_service

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not (DEFAULT_DIR / "sharegpt-h200.jsonl.xz").exists(), reason="H200 traces absent"),
]

FAST = [
    "--min-train-samples",
    "100",
    "--min-train-samples-tpot",
    "100",
    "--min-new-samples",
    "300",
    "--retrain-interval-s",
    "2",
    "--retrain-min-gap-s",
    "1",
]


def test_a_real_trace_is_predicted_entry_by_entry_while_the_servers_learn(tmp_path: Path) -> None:
    full = load_trace("sharegpt-h200")
    trace = Trace(full.name, full.entries[:1500], full.rates_qps, full.durations_s)
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    baseline = SlidingWindowBaseline(0.9, retrain_every=1000, rounds=30)
    with start_service("training_server", ["--data-dir", str(data_dir), *FAST], log_dir=logs) as training:
        store = ["--store", str(data_dir / "models")]
        with start_service("prediction_server", store, log_dir=logs, ready_path="/readyz") as prediction:
            result = replay_trace(
                trace, prediction.url, training.url, speed=40.0, baseline=baseline, send_predictions=True
            )
        status = httpx.get(training.url + "/status", timeout=10).json()
    n = len(trace.entries)
    assert result.samples_sent == n and status["intake"]["accepted_samples"] == n
    assert np.isfinite(result.predicted_ttft_ms).all() and np.isfinite(result.predicted_tpot_ms).all()
    for model in ("ttft", "tpot"):  # each entry carries one of the two: they train apart
        kinds = np.array(result.kinds[model])
        assert kinds[0] == "prior", "nothing was trained before the first entry was sent"
        trained = np.flatnonzero(kinds != "prior")
        assert len(trained) > 0.3 * n, "trained versions answered while the replay went on"
        assert (kinds[trained[0] :] != "prior").all(), "once trained, the prior never answers again"
        assert len(set(np.array(result.versions)[trained].tolist())) >= 2
    assert result.wall_s < 600 / 40 * 1.5 + 10, "the pace follows the trace clock, not the trainer"
    assert baseline.fits == 1
    assert np.isnan(result.naive_ttft_ms[:1000]).all() and np.isfinite(result.naive_ttft_ms[-300:]).all()
