"""``python -m training_server import-trace``: recorded traces into the window, offline and online,
through ingestion's validation, and a started server trains on them."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pandas as pd
import pytest

from tests.procs import REPO_ROOT, get_json, start_service, wait_until

pytestmark = pytest.mark.e2e

TRACES = sorted(Path(REPO_ROOT.parent, "shared", "data", "llmd-h200-traces").glob("*.jsonl.xz"))
if not TRACES:
    TRACES = sorted(Path("/work/shared/data/llmd-h200-traces").glob("*.jsonl.xz"))


def run_import(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "training_server", "import-trace", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def trace_lines() -> int:
    total = 0
    for path in TRACES:
        with lzma.open(path, "rt") as f:
            total += sum(1 for line in f if line.strip())
    return total


def wait_status(url: str, predicate, timeout_s: float) -> dict:  # type: ignore[no-untyped-def]
    """The training server's /status once ``predicate`` holds for it."""
    return wait_until(  # type: ignore[no-any-return]
        lambda: status if predicate(status := get_json(url + "/status")) else None,
        lambda: f"a status like that: {get_json(url + '/status')}",
        timeout_s,
        poll_s=0.2,
    )


def test_the_three_traces_load_offline_and_a_started_server_trains_on_them(tmp_path: Path) -> None:
    assert len(TRACES) == 3, TRACES
    data = tmp_path / "data"
    done = run_import(*map(str, TRACES), "--data-dir", str(data), "--stratum-cap", "20000")
    assert done.returncode == 0, done.stderr
    expected = trace_lines()  # every entry of these traces is valid
    assert f"{expected} of {expected} entries valid" in done.stdout, done.stdout
    args = ["--data-dir", str(data), "--stratum-cap", "20000"]
    with start_service("training_server", args, log_dir=tmp_path / "logs") as svc:
        status = httpx.get(svc.url + "/status").json()
        assert status["window"]["samples"] == expected
        trained = wait_status(svc.url, lambda s: s["is_prior"] is False, 180)
        assert trained["current_version"].endswith("-trained")
        assert trained["current_training_samples"], trained


def test_online_import_skips_invalid_entries_and_honours_429(tmp_path: Path) -> None:
    with lzma.open(TRACES[0], "rt") as f:
        rows = [json.loads(line) for _, line in zip(range(3000), f, strict=False)]
    rows[10]["actual_ttft_ms"] = -5  # invalid: refused by validation, the other 2,999 load
    rows[20]["kv_cache_percentage"] = 7.0  # invalid: a share above 1
    csv = tmp_path / "trace.csv.gz"
    pd.DataFrame(rows).to_csv(csv, index=False)
    # A small intake so the importer meets 429 Retry-After and must wait and resend.
    args = [
        "--data-dir", str(tmp_path / "data"), "--max-pending-samples", "500",
        "--max-entries-per-request", "500", "--stratum-cap", "20000",
    ]  # fmt: skip
    with start_service("training_server", args, log_dir=tmp_path / "logs") as svc:
        done = run_import(str(csv), "--url", svc.url, "--batch-size", "500")
        assert done.returncode == 0, done.stderr
        assert "2998 of 3000 entries valid" in done.stdout, done.stdout
        assert "2998 entries accepted" in done.stdout, done.stdout
        wait_status(svc.url, lambda s: s["window"]["samples"] == 2998, 30)
        status = httpx.get(svc.url + "/status").json()
        assert status["intake"]["accepted_samples"] == 2998
        assert "invalid_input" not in status["intake"]["rejected_requests"]


def test_unreadable_files_fail_with_a_message(tmp_path: Path) -> None:
    bad = tmp_path / "trace.txt"
    bad.write_text("x")
    done = run_import(str(bad), "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 1 and "unknown trace format" in done.stderr
    parquet = tmp_path / "trace.parquet"
    parquet.write_bytes(b"not parquet")
    done = run_import(str(parquet), "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 1 and "cannot read" in done.stderr
    assert not (tmp_path / "data" / "window.npz").exists()
