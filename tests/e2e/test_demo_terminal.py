"""The demo as a person sees it: ``python -m stack --demo`` in a pseudo-terminal at 80 and 200
columns, its screen rebuilt by a terminal emulator with autowrap. Then ``python -m stack`` in the
same directory starts from an empty window and the prior: the demo kept to ``var/demo``."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import pytest

from tests.procs import REPO_ROOT, free_base_port, wait_until
from tests.terminal_screen import Screen

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def run_in_terminal(argv: list[str], cwd: Path, columns: int, timeout_s: float) -> tuple[int, str]:
    """Run ``argv`` on a pty of ``columns`` x 50; return its exit code and everything it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "TERM": "xterm"}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, start_new_session=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def demo(cwd: Path, columns: int) -> tuple[int, list[str], str]:
    argv = [
        sys.executable, "-m", "stack", "--demo", "--fast", "--demo-duration-s", "20", "--replicas", "1",
        "--base-port", str(free_base_port(3)),
    ]  # fmt: skip
    code, raw = run_in_terminal(argv, cwd, columns, timeout_s=240)
    screen = Screen(columns)
    screen.feed(raw)
    return code, screen.lines(), raw


@pytest.mark.parametrize("columns", [80, 200])
def test_demo_panel_fits_the_terminal_and_redraws_in_place(tmp_path: Path, columns: int) -> None:
    code, lines, raw = demo(tmp_path, columns)
    assert code == 0, raw[-3000:]
    text = "\n".join(lines)
    # The banner comes first; the launcher's and services' logs are in files, not on the screen.
    assert lines[0].startswith("latency-stack: starting the demo"), lines[:3]
    assert '{"ts"' not in raw
    # One panel, redrawn in place: its title is on the screen once, each line where it belongs.
    titles = [i for i, line in enumerate(lines) if line.startswith("latency-stack demo (")]
    assert len(titles) == 1, text
    panel = lines[titles[0] : titles[0] + 10]
    assert "(done)" in panel[0]
    assert panel[1].startswith("  traffic") and panel[2].startswith("  model")
    assert panel[3].startswith("  TTFT p90") and panel[5].startswith("  TPOT p90")
    assert panel[7].startswith("  samples")
    assert "within prediction (target 90%)" in panel[3] and "MAPE" in panel[4]
    assert all(len(line) < columns for line in panel), panel
    summary = text.index("=== demo summary ===")
    assert summary > text.index(panel[7])
    assert "What these mean: coverage is the share of requests" in text
    end = next(i for i, line in enumerate(lines) if line.startswith("(summary saved to"))
    start = lines.index("=== demo summary ===")
    assert all(len(line) < columns for line in lines[start:end]), lines[start:end]  # wrapped, not cut
    assert "latency-stack: all 3 services stopped cleanly." in text
    assert (tmp_path / "var" / "demo" / "demo-summary.json").is_file()
    assert not (tmp_path / "var" / "training").exists() and not (tmp_path / "var" / "models").exists()


def test_the_stack_after_the_demo_starts_from_an_empty_window_and_the_prior(tmp_path: Path) -> None:
    code, _, raw = demo(tmp_path, 100)
    assert code == 0, raw[-3000:]
    base = free_base_port(3)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "stack", "--replicas", "1", "--base-port", str(base)]
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url, replica_url = f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 2}"
        wait_until(
            lambda: httpx.get(replica_url + "/readyz", timeout=1).status_code == 200,
            "the stack to start",
            timeout_s=120,
            poll_s=0.2,
        )
        status = httpx.get(url + "/status", timeout=5).json()
        replica = httpx.get(replica_url + "/status", timeout=5).json()
        assert status["window"]["samples"] == 0
        assert status["is_prior"] is True
        assert replica["model_kind"] == "prior"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
