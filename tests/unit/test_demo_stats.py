"""The demo's bookkeeping: rolling coverage/MAPE, percentiles, the summary and the live view."""

from __future__ import annotations

import io

import numpy as np
import pytest

from stack.dashboard import DemoSnapshot, LiveView, render_line
from stack.demo_report import DemoRun, build_summary, format_summary
from stack.demo_stats import LatencyWindow, Outcome, RollingAccuracy, accuracy_report


def test_coverage_and_mape_over_the_window() -> None:
    acc = RollingAccuracy(window=4)
    assert acc.recent().coverage is None and acc.overall().count == 0
    # predicted, actual: covered, covered, missed, covered
    for predicted, actual in [(110.0, 100.0), (50.0, 50.0), (80.0, 100.0), (200.0, 100.0)]:
        acc.add(predicted, actual)
    recent = acc.recent()
    assert recent.count == 4
    assert recent.coverage == pytest.approx(0.75)
    assert recent.mape == pytest.approx((0.1 + 0.0 + 0.2 + 1.0) / 4)


def test_window_forgets_the_oldest_but_overall_keeps_everything() -> None:
    acc = RollingAccuracy(window=2)
    acc.add(50.0, 100.0)  # missed, APE 0.5: leaves the window below
    acc.add(100.0, 100.0)
    acc.add(120.0, 100.0)
    assert acc.recent().count == 2
    assert acc.recent().coverage == 1.0
    assert acc.recent().mape == pytest.approx(0.1)
    assert acc.overall().count == 3
    assert acc.overall().coverage == pytest.approx(2 / 3)
    assert acc.overall().mape == pytest.approx(0.7 / 3)


def test_pairs_without_a_measurement_are_ignored() -> None:
    acc = RollingAccuracy(window=10)
    acc.add(12.0, 0.0)  # 0 means "no TPOT" on the wire
    assert acc.recent().count == 0
    acc.add(12.0, 10.0)
    assert acc.recent().count == 1 and acc.recent().coverage == 1.0


def test_long_stream_matches_exact_recomputation() -> None:
    rng = np.random.default_rng(1)
    predicted = rng.lognormal(4, 0.5, 5000)
    actual = rng.lognormal(4, 0.5, 5000)
    acc = RollingAccuracy(window=300)
    for p, a in zip(predicted, actual, strict=True):
        acc.add(float(p), float(a))
    p, a = predicted[-300:], actual[-300:]
    assert acc.recent().coverage == pytest.approx(np.mean(a <= p))
    assert acc.recent().mape == pytest.approx(np.mean(np.abs(p - a) / a), rel=1e-9)


def test_latency_percentiles() -> None:
    lat = LatencyWindow(size=100)
    assert lat.percentile(50) is None
    for v in range(1, 201):  # only the last 100 (101..200) are kept
        lat.add(float(v))
    assert len(lat) == 100
    assert lat.percentile(50) == pytest.approx(150.5)
    assert lat.percentile(99) == pytest.approx(199.01)


def test_pinball_loss_and_constant_baseline() -> None:
    actual = np.array([10.0, 20.0, 30.0, 40.0])
    assert accuracy_report(actual, actual, 0.9)["pinball"] == 0.0
    # Under-prediction costs q per ms, over-prediction (1 - q) per ms.
    assert accuracy_report(np.array([0.0]), np.array([10.0]), 0.9)["pinball"] == pytest.approx(9.0)
    assert accuracy_report(np.array([20.0]), np.array([10.0]), 0.9)["pinball"] == pytest.approx(1.0)
    report = accuracy_report(actual * 1.05, actual, 0.9)
    assert report["count"] == 4 and report["coverage"] == 1.0
    assert report["mape"] == pytest.approx(0.05)
    assert report["pinball"] < report["constant_pinball"]  # type: ignore[operator]
    empty = accuracy_report(np.array([1.0]), np.array([0.0]), 0.9)
    assert empty["count"] == 0 and empty["coverage"] is None


def _run() -> DemoRun:
    outcomes = [
        Outcome(0, 100.0, 10.0, 120.0, 12.0, "prior"),
        Outcome(1, 100.0, 10.0, 90.0, 11.0, "v2"),
        Outcome(0, 50.0, 0.0, 60.0, 9.0, "v2"),
        Outcome(1, 70.0, 8.0, None, None, None),  # its prediction call failed
    ]
    return DemoRun(
        duration_s=10.0,
        pods=2,
        rate_rps=1.0,
        window=2,
        wall_s=2.0,
        sim_s=10.5,
        requests=4,
        rows=6,
        prediction_errors=1,
        last_error="HTTP 503",
        call_latencies_ms=[1.0, 2.0, 3.0],
        versions={"prior": 0.0, "v2": 1.0},
        final_version="v2",
        quantile=0.9,
        outcomes=outcomes,
        samples={"sent": 4, "accepted": 4, "rejected": 0, "throttled": 0, "dropped": 0, "unsent": 0},
        round_robin_ttft_ms=[100.0, 200.0, 300.0],
        round_robin_tpot_ms=[10.0, 0.0, 20.0],
    )


def test_summary_reports_accuracy_overall_recent_and_per_version() -> None:
    s = build_summary(_run())
    assert s["speedup"] == pytest.approx(5.25)
    assert s["ttft"]["overall"]["count"] == 3  # the unpredicted completion is not scored
    assert s["ttft"]["overall"]["coverage"] == pytest.approx(2 / 3)
    assert s["ttft"]["recent"]["count"] == 2
    assert s["tpot"]["overall"]["count"] == 2  # a 0 TPOT carries no measurement
    versions = {v["version"]: v for v in s["model_versions"]}
    assert versions["prior"]["ttft_coverage"] == 1.0
    assert versions["v2"]["count"] == 2 and versions["v2"]["ttft_coverage"] == 0.5
    assert s["routing"]["round_robin_ttft_p50_ms"] == 200.0
    text = format_summary(s)
    assert "demo summary" in text and "v2" in text and "round-robin" in text


def _snapshot(**overrides: object) -> DemoSnapshot:
    fields: dict[str, object] = dict(
        wall_s=2.0,
        sim_s=20.0,
        duration_s=60.0,
        requests=100,
        rows=800,
        prediction_errors=0,
        call_p50_ms=1.5,
        call_p99_ms=4.0,
        model_version="v3",
        versions_seen=2,
        quantile=0.9,
        ttft=RollingAccuracy(5).recent(),
        tpot=RollingAccuracy(5).recent(),
        samples_sent=90,
        samples_accepted=80,
        samples_queued=10,
        samples_throttled=0,
        samples_rejected=0,
    )
    fields.update(overrides)
    return DemoSnapshot(**fields)  # type: ignore[arg-type]


def test_live_view_redraws_in_place_on_a_terminal() -> None:
    out = io.StringIO()
    view = LiveView(out, tty=True)
    view.update(_snapshot())
    first = out.getvalue()
    assert first.startswith("\x1b[2K")  # the first frame does not move the cursor up
    assert "v3" in first and "10.0x real time" in first
    view.update(_snapshot(wall_s=3.0, requests=150, rows=1200))
    second = out.getvalue()[len(first) :]
    assert second.startswith(f"\x1b[{first.count(chr(10))}F")  # back to the top of the block
    assert "50.0 req/s" in second and "400.0 rows/s" in second


def test_live_view_logs_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    view = LiveView(out, log_every_s=5.0)  # StringIO is not a TTY
    view.update(_snapshot(wall_s=1.0))
    view.update(_snapshot(wall_s=2.0))  # within 5 s of the last line: not logged
    view.update(_snapshot(wall_s=6.5, done=True))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert all(line.startswith("demo ") and "\x1b" not in line for line in lines)
    assert "model=v3" in lines[0] and "samples_accepted=80/90" in lines[0]
    assert "ttft_cov=-" in render_line(_snapshot(), 0.0, 0.0)
