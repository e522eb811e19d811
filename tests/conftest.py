"""Fixtures every test layer shares, built on ``tests/procs.py`` (like uvicorn's ``tests/utils``).

- ``port``: a free loopback port;
- ``log_dir``: where the processes a test starts write their logs (under its tmp dir);
- ``start``: ``start(module, args, **kw)`` runs a real service (``tests.procs.start_service``:
  a free port, readiness waited for) and stops it when the test ends, whatever happened,
  after a SIGCONT in case the test stopped it with SIGSTOP.

Condition waits are ``tests.procs.wait_until`` (threads, sync tests) and ``tests.procs.eventually``
(event-loop tests); in-process servers are ``tests.procs.serve_in_loop`` and
``tests.procs.coalescer_in_loop``; background load is ``tests.load.LoadThreads``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.procs import RunningService, StartService, free_port, start_service


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


@pytest.fixture
def start(log_dir: Path) -> Iterator[StartService]:
    started: list[RunningService] = []

    def start_one(module: str, args: Sequence[str] = (), **kwargs: Any) -> RunningService:
        kwargs.setdefault("log_dir", log_dir)
        service = start_service(module, args, **kwargs)
        started.append(service)
        return service

    yield start_one
    for service in reversed(started):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.proc.pid, signal.SIGCONT)
        service.stop()
