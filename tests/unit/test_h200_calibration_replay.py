"""The in-process H200 trace replay started from history: only the stages after the history are judged."""

from __future__ import annotations

import numpy as np

from bench.accuracy_trace import DEFAULT_DIR, load_trace, recover_stages
from bench.h200_calibration_replay import replay

TRACE = "sharegpt-h200"


def test_history_stages_go_into_the_window_first_and_only_the_later_stages_are_judged() -> None:
    trace = load_trace(TRACE, DEFAULT_DIR)
    stages = recover_stages(trace.load(), trace.rates_qps, trace.durations_s)
    later = stages[-1]  # the last stage is replayed, the ones before it are history
    actual = {
        m: np.array([e[f"actual_{m}_ms"] for e in trace.entries], dtype=float) for m in ("ttft", "tpot")
    }
    r = replay(
        TRACE, DEFAULT_DIR, chunk=10, retrain_every=200, q=0.9, overrides={}, history_stages=len(stages) - 1
    )
    for model in ("ttft", "tpot"):
        cells = r[model]
        # what a client sees: every replayed request with a latency, none of the history's
        assert cells["with_prior"]["rows"] == int(np.count_nonzero(actual[model][later:] > 0))
        # the trees trained on the history answer from the first replayed entry: nothing is left to the prior
        assert cells["rows"] == cells["with_prior"]["rows"], cells
        assert [k for k in cells if k.startswith("stage")] == [f"stage {len(stages)}"], cells
