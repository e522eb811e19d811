"""The servers learn the simulator's latencies online, measured the way the accuracy report does.

A real training server and a real prediction server (reading its store) on loopback; the
built-in simulator's bursty workload is replayed through their HTTP API with random routing
(``bench.accuracy_replay``): every request is predicted at routing time, before its own sample
or any later one was sent, and completions are fed back every simulated second. After the
prior's warm-up, both the TTFT and the TPOT model must beat the best constant predictor in
hindsight (pinball loss) and stay roughly calibrated.

The full stack (coalescer, two replicas, routing by predicted TTFT) learning from the demo,
beating the best constant on TTFT and round-robin on routing, is asserted by
``tests/e2e/test_stack_launcher.py::test_demo_runs_through_the_stack_and_everything_stops``;
this test adds the TPOT model and an evaluation free of the routing feedback loop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.accuracy_metrics import Scored, dimension_bins, summarise
from bench.accuracy_replay import STREAMING, Feedback, ReplayConfig, replay
from tests.procs import get_json, start_service
from training_server.window import stratum_ids

pytestmark = pytest.mark.e2e

QUANTILE = 0.9
TRAINING_FLAGS = ["--min-new-samples", "1000", "--retrain-interval-s", "5", "--retrain-min-gap-s", "1"]


@pytest.mark.parametrize("feedback", ["completion", "first-token", "epp", "arrival"])
def test_both_models_beat_the_best_constant_on_requests_they_had_not_seen(
    tmp_path: Path, feedback: Feedback
) -> None:
    """Also with llm-d's streaming feedback (a TTFT-only sample at each first token and a
    TPOT-only one at completion, each sent exactly once; with ``epp`` each carries the prediction it
    was routed on and the TPOT sample the pod's load at the last token), and replaying a simulated
    record in arrival order (each request's sample right after its prediction)."""
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    with start_service(
        "training_server", ["--data-dir", str(data_dir), *TRAINING_FLAGS], log_dir=logs
    ) as training:
        store = ["--store", str(data_dir / "models"), "--poll-interval-s", "0.1"]
        with start_service("prediction_server", store, log_dir=logs, ready_path="/readyz") as prediction:
            cfg = ReplayConfig(duration_s=120.0, speed=10.0, seed=5, feedback=feedback)
            result = replay(cfg, prediction.url, training.url)
        accepted = get_json(training.url + "/status")["intake"]["accepted_samples"]
    n = len(result.rows)
    with_tpot = int(np.count_nonzero(result.array("actual_tpot_ms") > 0))
    assert result.samples_sent == accepted == (n + with_tpot if feedback in STREAMING else n)
    if feedback == "arrival":  # predicted, and so recorded, in arrival order
        assert np.all(np.diff(result.array("routed_at_s")) >= 0)
    for model in ("ttft", "tpot"):
        # per model: with streaming feedback TTFT trains before TPOT has samples enough
        trained = result.trained(model)
        assert (~trained).any(), f"the prior answered {model} first"
        assert len(set(result.array("versions")[trained].tolist())) >= 2, "several trained versions answered"
        assert trained.sum() >= 0.6 * len(trained)
        columns = {name: column[trained] for name, column in result.columns().items()}
        scored = Scored(
            predicted=result.array(f"predicted_{model}_ms")[trained],
            actual=result.array(f"actual_{model}_ms")[trained],
            strata=stratum_ids(columns),
            bins=dimension_bins(columns),
            versions=result.array("versions")[trained],
        )
        overall = summarise(scored, QUANTILE)["overall"]
        print(f"{model}: {overall}")
        assert overall["pinball_loss_ms"] < overall["constant_pinball_loss_ms"], (model, overall)
        assert 0.7 <= overall["coverage"] <= 0.99, (model, overall)
        assert np.isfinite(overall["mape"])
