"""bench.soak: the growth slope, the summary and the verdict; the /proc sampling of a real process tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.soak import ProcessTree, Sample, Soak, children, sample, slope_per_hour, summarise, verdict


def _demo(errors: int = 0, accepted: int = 500, dropped: int = 0) -> dict[str, object]:
    """The fields of the demo's own summary (``demo-summary.json``) that the soak reads."""
    samples = {
        "sent": 500,
        "accepted": accepted,
        "rejected": 0,
        "throttled": 2,
        "dropped": dropped,
        "unsent": 0,
    }
    return {
        "requests": 500,
        "prediction_errors": errors,
        "call_latency_ms": {"p50": 2.6, "p99": 8.1},
        "samples": samples,
        "training_server": {"retrains": 40},
        "final_model_version": "000900-calibrated",
    }


def _soak(rss_of_training: list[float], demo: dict | None = None, returncode: int = 0) -> Soak:
    samples = [
        Sample(
            t_s=60.0 * i,
            services={
                "training_server:10": ProcessTree(rss, 20 + i % 2, 16),
                "prediction_server:11": ProcessTree(200.0, 15, 6),
                "prediction_server:12": ProcessTree(201.0, 15, 6),
                "coalescer:13": ProcessTree(66.0, 12, 3),
            },
            window_samples=1000 * i,
            disk_mb={"models": 5.0, "training": 1.0 + i},
            versions=5,
        )
        for i, rss in enumerate(rss_of_training)
    ]
    return Soak(samples, returncode, _demo() if demo is None else demo)


def test_slope_is_per_hour_and_zero_without_spread():
    assert slope_per_hour([0.0, 1800.0, 3600.0], [100.0, 110.0, 120.0]) == pytest.approx(20.0)
    assert slope_per_hour([0.0], [5.0]) == 0.0
    assert slope_per_hour([7.0, 7.0], [1.0, 2.0]) == 0.0


def test_summary_tells_a_level_memory_from_one_that_keeps_growing():
    # First half grows (the window filling), second half flat: no growth reported.
    level = summarise(_soak([200, 220, 240, 250, 250, 250, 250]))["services"]["training_server:10"]
    assert level["rss_mb_first"] == 200 and level["rss_mb_last"] == 250
    assert level["rss_mb_per_hour_second_half"] == 0.0
    # Growing by 10 MB a minute to the end: 600 MB per hour.
    leak = summarise(_soak([200, 210, 220, 230, 240, 250, 260]))["services"]["training_server:10"]
    assert leak["rss_mb_per_hour_second_half"] == pytest.approx(600.0)
    assert leak["fds_max"] == 21


def test_summary_keeps_the_largest_disk_use_and_window():
    s = summarise(_soak([200, 200, 200]))
    assert s["disk_mb_max"] == {"models": 5.0, "training": 3.0}
    assert s["window_samples_max"] == 2000 and s["versions_max"] == 5


def test_verdict_passes_a_clean_run_and_names_each_failure():
    assert verdict(summarise(_soak([200, 200])), replicas=2) == []
    lost = _demo(errors=3, accepted=490, dropped=10)
    failures = verdict(summarise(_soak([200, 200], demo=lost, returncode=1)), replicas=2)
    assert failures == [
        "the stack exited with 1",
        "3 failed prediction calls",
        "10 samples not accepted",
        "samples lost: {'dropped': 10}",
    ]
    assert verdict(summarise(_soak([200, 200])), replicas=3) == [
        "2 prediction_server processes seen, 3 expected (one restarted or died)"
    ]
    no_demo = _soak([200])
    no_demo.demo = None
    assert verdict(summarise(no_demo), replicas=2) == ["the demo wrote no summary"]


def test_sample_reads_each_service_tree_from_proc(tmp_path: Path):
    # A parent with one child whose command line says ``-m coalescer`` (it only sleeps): found, named,
    # measured; the data dir's subdirectories are sized, a hard-linked file once (as a calibration
    # version links its base's model files); nothing answers the training URL.
    child = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '-m', 'coalescer']); "
        "time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", child])
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "journal").write_bytes(b"x" * 2**20)
    os.link(tmp_path / "training" / "journal", tmp_path / "training" / "linked")  # counted once
    try:
        deadline = time.monotonic() + 20
        while True:
            s = sample(parent.pid, tmp_path, "http://127.0.0.1:9", 1.0)
            if s.services or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(s.services) == 1
        (key, tree), *_ = s.services.items()
        assert key.startswith("coalescer:") and tree.rss_mb > 1 and tree.fds >= 3 and tree.threads >= 1
        assert s.disk_mb == {"training": 1.0} and s.window_samples is None and s.versions == 0
    finally:
        for pid in children(parent.pid):
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()
