"""The in-process H200 trace replay started from history: only the stages after the history are judged."""

from __future__ import annotations

import numpy as np

from bench.accuracy_trace import DEFAULT_DIR, load_trace, recover_stages
from bench.h200_calibration_replay import coverage_under_shifts, replay

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


def test_coverage_under_shifts_scales_the_served_predictions_overall_and_per_group() -> None:
    actual = np.array([100.0, 101.0, 102.0, 103.0] * 10 + [50.0] * 40)
    predicted = np.full(80, 101.0)
    rows = np.ones(80, dtype=bool)
    rows[-1] = False  # a request the prior answered: not judged
    groups = {"stage 1": np.arange(80) < 40, "stage 2": np.arange(80) >= 40, "tiny": np.arange(80) < 5}
    out = coverage_under_shifts(actual, predicted, rows, groups, (-0.02, 0.0, 0.02))
    assert list(out) == ["-0.020", "+0.000", "+0.020"]
    # 101 x 0.98 = 98.98 covers none of stage 1; 101 covers 100 and 101; 103.02 covers all of it
    assert [out[k]["stage 1"] for k in out] == [0.0, 0.5, 1.0]
    assert all(out[k]["stage 2"] == 1.0 for k in out)  # 39 judged rows of 50 ms: covered at every shift
    assert out["+0.000"]["overall"] == (20 + 39) / 79
    assert all("tiny" not in cell for cell in out.values())  # under MIN_CELL_ROWS rows
