"""Start real service processes on loopback ports for tests (e2e and service-level).

``start_service("training_server", ["--data-dir", str(tmp)])`` runs
``python -m training_server --host 127.0.0.1 --port <free>`` plus the given flags, waits
until ``GET /healthz`` answers, and returns a handle that stops the process (SIGTERM,
then SIGKILL after a timeout) when closed. Logs go to a file under the pytest tmp dir so
a failing test can show them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningService:
    name: str
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> int:
        """Graceful stop (SIGTERM to the process group), then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the whole process group (the service and any worker processes)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def __enter__(self) -> RunningService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_service(
    module: str,
    args: Sequence[str] = (),
    *,
    log_dir: Path,
    port: int | None = None,
    env: dict[str, str] | None = None,
    ready_path: str = "/healthz",
    timeout_s: float = 60.0,
) -> RunningService:
    """Start ``python -m module`` on a free loopback port and wait until ``ready_path`` answers 200."""
    port = port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{module}-{port}.log"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")]))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    service = RunningService(module, f"http://127.0.0.1:{port}", port, proc, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited with {proc.returncode}:\n{service.logs()[-4000:]}")
        try:
            if httpx.get(service.url + ready_path, timeout=1.0).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    service.kill()
    raise TimeoutError(
        f"{module} not ready on {service.url}{ready_path} after {timeout_s}s:\n{service.logs()[-4000:]}"
    )


def get_json(url: str, timeout_s: float = 10.0) -> Any:
    """``GET url`` and its JSON body."""
    return httpx.get(url, timeout=timeout_s).json()


def wait_until(predicate: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value
