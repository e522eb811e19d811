"""Secure defaults on real processes: the admin token comes from a file, a bare POST /flush is
refused, /docs and process ids are hidden unless --expose-internals asks for them, and each of the
four programs' --help shows defaults and choices under one naming scheme."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.procs import REPO_ROOT, start_service, wait_until

pytestmark = pytest.mark.e2e


def test_training_server_reads_its_token_from_a_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-from-a-file\n")
    args = ["--data-dir", str(tmp_path / "data"), "--auth-token-file", str(token_file)]
    with start_service("training_server", args, log_dir=tmp_path / "logs") as svc:
        assert httpx.post(svc.url + "/flush").status_code == 401
        assert httpx.post(svc.url + "/flush", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = httpx.post(svc.url + "/flush", headers={"Authorization": "Bearer s3cret-from-a-file"})
        assert ok.status_code == 200, ok.text
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert httpx.get(svc.url + path).status_code == 404
        cmdline = Path(f"/proc/{svc.proc.pid}/cmdline").read_bytes()
        assert b"s3cret" not in cmdline  # nothing in ps shows the token


def test_internals_are_shown_only_when_asked_for(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with start_service("prediction_server", ["--store", str(store)], log_dir=tmp_path / "logs") as svc:
        status = httpx.get(svc.url + "/status").json()
        assert "worker_pid" not in status
        assert str(store) not in httpx.get(svc.url + "/status").text
    args = ["--store", str(store), "--expose-internals"]
    with start_service("prediction_server", args, log_dir=tmp_path / "logs") as svc:
        status = httpx.get(svc.url + "/status").json()
        assert status["worker_pid"] == svc.proc.pid and status["store"] == str(store)
    args = ["--data-dir", str(tmp_path / "data"), "--expose-internals"]
    with start_service("training_server", args, log_dir=tmp_path / "logs") as svc:
        assert httpx.get(svc.url + "/docs").status_code == 200


def test_a_service_started_with_sigint_ignored_still_stops_on_sigint(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    from tests.procs import free_port

    port = free_port()
    argv = [sys.executable, "-m", "coalescer", "--port", str(port), "--prediction-urls", "http://127.0.0.1:9"]
    # As a shell's background job starts it: SIGINT ignored before exec.
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200, "up")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (
            "training_server",
            ["python -m training_server", "(default: 8000;", "{quantile,mean}", "import-trace"],
        ),
        (
            "prediction_server",
            ["python -m prediction_server", "(default: 8001;", "{debug,info,warning,error}"],
        ),
        ("coalescer", ["python -m coalescer", "(default: 8080;", "--auth-token-file"]),
        ("stack", ["python -m stack", "(default: 8000;", "python -m stack.demo"]),
    ],
)
def test_help_shows_defaults_choices_and_one_naming_scheme(module: str, expected: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    for text in expected:
        assert text in out.stdout, (text, out.stdout)


def test_an_unreadable_or_doubled_token_fails_at_start(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    base = [sys.executable, "-m", "training_server", "--data-dir", str(tmp_path), "--port", "0"]
    missing = subprocess.run(
        [*base, "--auth-token-file", str(tmp_path / "nope")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "--auth-token-file" in missing.stderr and "nope" in missing.stderr
    (tmp_path / "empty").write_text("\n")
    empty = subprocess.run(
        [*base, "--auth-token-file", str(tmp_path / "empty")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert empty.returncode == 2 and "is empty" in empty.stderr
    both = subprocess.run(
        [*base, "--auth-token", "a", "--auth-token-file", str(tmp_path / "empty")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert both.returncode == 2 and "only one of" in both.stderr
