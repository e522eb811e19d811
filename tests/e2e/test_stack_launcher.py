"""``python -m stack`` as a user runs it: ready, URLs that work, a demo that learns, and no
process left behind however it stops (SIGINT, SIGTERM, a dead child, even SIGKILL).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from stack.config import StackSettings
from stack.launcher import Child, ChildSpec, Launcher
from tests.procs import REPO_ROOT, free_base_port, wait_until
from training_server.config import TrainingSettings

pytestmark = pytest.mark.e2e

ROW = {
    "kv_cache_percentage": 0.2,
    "input_token_length": 500,
    "num_request_waiting": 1,
    "num_request_running": 3,
    "num_tokens_generated": 1,
    "prefix_cache_score": 0.5,
}


@dataclass
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str


def processes() -> dict[int, ProcInfo]:
    out: dict[int, ProcInfo] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        out[int(entry.name)] = ProcInfo(
            int(entry.name), int(fields[1]), int(fields[2]), int(fields[3]), fields[0]
        )
    return out


def descendants(root: int) -> set[int]:
    procs = processes()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        children = {p.pid for p in procs.values() if p.ppid in frontier} - found
        found |= children
        frontier = children
    return found


def alive(pids: set[int], sessions: set[int]) -> set[int]:
    """PIDs (or members of the given sessions) still running; zombies count as gone."""
    return {p.pid for p in processes().values() if (p.pid in pids or p.sid in sessions) and p.state != "Z"}


def wait_gone(pids: set[int], sessions: set[int], timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    left = alive(pids, sessions)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(pids, sessions)
    return left


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    data_dir: Path

    def out(self) -> str:
        return self.stdout.read_text(errors="replace")

    def err(self) -> str:
        return self.stderr.read_text(errors="replace")

    def wait_for_output(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = re.search(pattern, self.out())
            if match:
                return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(
            f"{pattern!r} not printed (exit {self.proc.poll()}):\n{self.out()[-3000:]}\n{self.err()[-4000:]}"
        )

    def urls(self) -> tuple[str, str]:
        match = self.wait_for_output(r"TRAINING_SERVER_URL=(\S+)\n\s*PREDICTION_SERVER_URL=(\S+)", 90)
        return match.group(1), match.group(2)

    def services(self) -> set[int]:
        """PIDs of everything the launcher started (services and their workers)."""
        return descendants(self.proc.pid)


StartStack = Callable[..., Stack]


@pytest.fixture
def start_stack(tmp_path: Path) -> Iterator[StartStack]:
    started: list[Stack] = []

    def start(*args: str, replicas: int = 2) -> Stack:
        data_dir = tmp_path / f"stack{len(started)}"
        data_dir.mkdir()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        stdout, stderr = data_dir / "stdout.txt", data_dir / "stderr.txt"
        argv = [
            sys.executable, "-m", "stack", "--data-dir", str(data_dir), "--replicas", str(replicas),
            "--base-port", str(free_base_port(replicas + 2)), *args,
        ]  # fmt: skip
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=err, env=env, cwd=REPO_ROOT, start_new_session=True
            )
        stack = Stack(proc, stdout, stderr, data_dir)
        started.append(stack)
        return stack

    yield start
    for stack in started:  # never leave anything behind, even when a test failed
        pids = stack.services() if stack.proc.poll() is None else set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(stack.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        stack.proc.wait()


def test_demo_runs_through_the_stack_and_everything_stops(start_stack: StartStack) -> None:
    # The README's demo (8 pods, 60 requests/s), shorter; --demo-speed caps the pace so the stack
    # stays up long enough to be called from outside and to retrain at least once.
    stack = start_stack("--demo", "--demo-duration-s", "90", "--demo-speed", "5")
    training_url, prediction_url = stack.urls()
    services = stack.services()
    assert len(services) >= 4, "training server, two replicas and the coalescer"
    with httpx.Client(timeout=5.0) as client:
        assert client.get(training_url + "/readyz").status_code == 200
        # The demo shows the training server as it runs by default: it retrains on as few new
        # samples as the defaults say (a slower demo-only cadence once hid the defaults' freshness).
        status = client.get(training_url + "/status").json()
        defaults = TrainingSettings()
        window = status["window"]["samples"]
        due = max(defaults.min_new_samples, math.ceil(defaults.min_new_fraction * window))
        assert status["training"]["due_new_samples"] == due, status["training"]
        resp = client.post(prediction_url + "/predict/bulk/strict", json={"requests": [ROW, ROW]})
        assert resp.status_code == 200, resp.text
        predictions = resp.json()["predictions"]
        assert len(predictions) == 2 and all(p["ttft_ms"] > 0 and p["model_version"] for p in predictions)
        # The container health check (compose.yaml) against live and dead endpoints.
        for url, expected in [(prediction_url + "/readyz", 0), (training_url + "/nope", 1)]:
            probe = [sys.executable, "-m", "stack.healthcheck", url]
            assert subprocess.run(probe, cwd=REPO_ROOT, timeout=30).returncode == expected, url
        entry = {**ROW, "actual_ttft_ms": 80.0, "actual_tpot_ms": 12.0}
        resp = client.post(training_url + "/add_training_data_bulk", json={"entries": [entry]})
        assert resp.status_code == 202

    # The demo replays 90 simulated s at 5x, writes its report and stops: about 40 s on a quiet
    # machine, more when the CI runs other tests beside it (a 60 s deadline expired once there).
    assert stack.proc.wait(timeout=180) == 0, stack.err()[-4000:]
    out = stack.out()
    assert "=== demo summary ===" in out
    summary = orjson.loads((stack.data_dir / "demo-summary.json").read_bytes())
    assert summary["requests"] > 3000
    assert summary["prediction_errors"] == 0
    assert summary["rows_predicted"] == 8 * summary["requests"]
    assert summary["completions"] == summary["requests"]
    # The drain after the arrivals stop is not scored (an emptying pool is not the demo's traffic).
    scored = summary["scored_completions"]
    assert (
        summary["ttft"]["overall"]["count"] == scored
        and 0.9 * summary["requests"] < scored < summary["requests"]
    )
    samples = summary["samples"]
    assert samples["accepted"] == samples["sent"] == summary["completions"]
    assert samples["rejected"] == samples["unsent"] == 0
    # It learnt: a model trained on the demo's samples replaced the prior and serves, and it
    # predicts better than the best constant would have, and routing on it beats round-robin.
    # Two replicas pick up each version on their own, so the last call may come from one that
    # skipped a version the other served (in order of first sight, the last seen can be older).
    versions = [v["version"] for v in summary["model_versions"]]
    final = summary["final_model_version"]
    assert len(versions) >= 2 and final in versions[1:] and not final.endswith("-prior"), (final, versions)
    training = summary["training_server"]
    assert training["accepted_samples"] >= summary["completions"]
    # The training server's current version is the one served last or newer: a calibration version
    # (at most one a second) can go out between the demo's last prediction and its status read.
    sequence = [int(v.split("-", 1)[0]) for v in (training["current_version"], final)]
    assert sequence[0] >= sequence[1] and training["retrains"] >= 1
    recent = summary["ttft"]["recent"]
    assert recent["pinball"] < recent["constant_pinball"]
    routing = summary["routing"]
    assert routing["ttft_p90_ms"] < routing["round_robin_ttft_p90_ms"]
    assert not wait_gone(services, services, 5), "services outlived the stack"
    assert {path.name for path in (stack.data_dir / "logs").iterdir()} == {
        "stack.log", "training_server.log", "prediction_server-1.log", "prediction_server-2.log",
        "coalescer.log",
    }  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_every_child(start_stack: StartStack, sig: signal.Signals) -> None:
    stack = start_stack(replicas=2)
    stack.urls()
    services = stack.services()
    assert len(services) >= 4
    stack.proc.send_signal(sig)
    assert stack.proc.wait(timeout=45) == 0, stack.err()[-4000:]
    assert not wait_gone(services, services, 5), "orphans left after the launcher exited"
    assert "stack_stopped" in stack.err()


def test_dead_child_stops_the_stack_with_an_error(start_stack: StartStack) -> None:
    stack = start_stack(replicas=2)
    stack.urls()
    services = stack.services()
    replica = next(
        pid
        for pid in services
        if "prediction_server" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    )
    os.kill(replica, signal.SIGKILL)
    assert stack.proc.wait(timeout=45) == 1
    assert "exited unexpectedly" in stack.err()
    assert not wait_gone(services, services, 5)


def test_killed_launcher_takes_its_children_down(start_stack: StartStack) -> None:
    stack = start_stack(replicas=1)
    stack.urls()
    services = stack.services()
    stack.proc.kill()  # no chance to clean up: the kernel's parent-death signal must do it
    stack.proc.wait()
    assert not wait_gone(services, services, 20), "services survived a SIGKILLed launcher"


def test_a_log_past_its_cap_is_rotated_while_the_service_writes_on(tmp_path: Path) -> None:
    """A stack runs for weeks and its services log every retrain and calibration version: past
    ``log_max_mb`` the supervision loop copies a log to ``.log.1`` and empties it, and the service,
    which keeps the file open, appends at the new start (a file opened without O_APPEND would go on
    at its old offset, behind a hole of NUL bytes)."""
    settings = StackSettings(data_dir=tmp_path, log_max_mb=0.01)  # 10 KiB
    cap = int(settings.log_max_mb * 2**20)
    launcher = Launcher(settings)
    log_path = tmp_path / "chatty.log"
    writer = (
        "import time\nfor i in range(10**6):\n    print(f'line {i:07d}', flush=True)\n    time.sleep(0.001)"
    )
    with open(log_path, "ab") as out:  # as Launcher._spawn opens a service's log
        proc = subprocess.Popen([sys.executable, "-c", writer], stdout=out)
    launcher.children.append(Child(ChildSpec("chatty", "chatty", 0, ()), "", proc, log_path))
    rotated_path = tmp_path / "chatty.log.1"
    try:
        launcher.check()  # under the cap: nothing to do
        assert not rotated_path.exists()
        wait_until(lambda: log_path.stat().st_size > cap, "the log to pass its cap", 30)
        launcher.check()
        rotated = rotated_path.read_bytes()
        assert len(rotated) > cap and rotated.startswith(b"line 0000000\n")
        wait_until(lambda: log_path.stat().st_size > 100, "the service to write on", 30)
        content = log_path.read_bytes()
        assert b"\0" not in content and content.startswith(b"line ")
        last_rotated = int(rotated.rstrip(b"\n").split(b"\n")[-1].split()[1])
        assert int(content.split(b"\n")[0].split()[1]) > last_rotated  # emptied, then written on
    finally:
        proc.kill()
        proc.wait()


def test_a_log_that_cannot_be_rotated_is_reported_once_and_the_stack_runs_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = StackSettings(data_dir=tmp_path, log_max_mb=0.001)  # 1 KiB
    launcher = Launcher(settings)
    log_path = tmp_path / "chatty.log"
    log_path.write_bytes(b"x" * 2048)
    (tmp_path / "chatty.log.1").mkdir()  # where the copy must go: the copy fails
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    launcher.children.append(Child(ChildSpec("chatty", "chatty", 0, ()), "", proc, log_path))
    try:
        with caplog.at_level(logging.WARNING, logger="stack.launcher"):
            for _ in range(3):
                launcher.check()  # never raises for the log
        failures = [r for r in caplog.records if "log_rotation_failed" in r.getMessage()]
        assert len(failures) == 1, caplog.text
        assert log_path.stat().st_size == 2048  # left as it was
        (tmp_path / "chatty.log.1").rmdir()
        launcher.check()
        assert (tmp_path / "chatty.log.1").stat().st_size == 2048 and log_path.stat().st_size == 0
    finally:
        proc.kill()
        proc.wait()
