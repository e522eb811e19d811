"""Supervise the local stack: spawn the services, wait for readiness, stop them all cleanly.

Every service runs as ``python -m <package>`` in its own session (so a terminal's Ctrl-C
reaches only the launcher, which then stops the children in order) with its output in
``<data-dir>/logs/<name>.log``, rotated once it passes ``log_max_mb`` (``rotate_logs``).
Stopping sends SIGTERM to each child's process group (the service and any worker processes it
forked), waits up to a timeout, then SIGKILLs whatever is left of the group. On Linux each child
also asks the kernel for SIGTERM if the launcher dies without cleaning up
(``PR_SET_PDEATHSIG``), so even ``kill -9`` of the launcher leaves no service running.

Spawning happens before any thread exists in this process (``preexec_fn`` is only safe
then); the launcher never restarts a child: a child that dies is reported and ends the stack.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from shared.logging import log_event
from stack.config import StackSettings

log = logging.getLogger(__name__)

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1


class StackError(RuntimeError):
    """The stack could not start or stopped working; the message says which service and why."""


class ChildExited(StackError):
    def __init__(self, name: str, returncode: int, log_path: Path, log_tail: str = "") -> None:
        self.name = name
        self.returncode = returncode
        self.log_path = log_path
        self.log_tail = log_tail
        super().__init__(f"{name} exited unexpectedly with code {returncode}; see {log_path}")


@dataclass(frozen=True)
class ChildSpec:
    """How to run one service: ``python -m module --host H --port P *args``."""

    name: str
    module: str
    port: int
    args: tuple[str, ...]
    ready_path: str = "/readyz"


@dataclass
class Child:
    spec: ChildSpec
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, max_chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except FileNotFoundError:
            return ""


def plan(settings: StackSettings) -> list[ChildSpec]:
    """The services of the stack in start order: training server, replicas, coalescer."""
    data_dir = settings.data_dir.resolve()
    store = str(data_dir / "models")
    host = settings.host
    training = ChildSpec(
        "training_server",
        "training_server",
        settings.training_port,
        ("--data-dir", str(data_dir / "training"), "--store", store),
    )
    replicas = [
        ChildSpec(
            f"prediction_server-{i + 1}",
            "prediction_server",
            port,
            ("--store", store, "--workers", str(settings.workers)),
        )
        for i, port in enumerate(settings.prediction_ports)
    ]
    coalescer = ChildSpec(
        "coalescer",
        "coalescer",
        settings.coalescer_port,
        (
            "--prediction-urls",
            ",".join(f"http://{_url_host(host)}:{p}" for p in settings.prediction_ports),
            "--training-url",
            f"http://{_url_host(host)}:{settings.training_port}",
        ),
    )
    return [training, *replicas, coalescer]


def child_env(settings: StackSettings, env: dict[str, str]) -> dict[str, str]:
    """The services' environment: ``env`` wins over the stack's defaults for their settings."""
    workers = str(settings.workers)
    stack_defaults = {
        "TRAINING_SERVER_LOG_LEVEL": settings.log_level,
        "PREDICTION_SERVER_LOG_LEVEL": settings.log_level,
        "COALESCER_LOG_LEVEL": settings.log_level,
        # Each replica serves `workers` calls at once: let the coalescer keep them all busy.
        "COALESCER_EAGER_INFLIGHT_PER_REPLICA": workers,
        "COALESCER_MAX_INFLIGHT_PER_REPLICA": str(max(4, settings.workers)),
    }
    merged = {**stack_defaults, **env}
    merged["PYTHONUNBUFFERED"] = "1"
    merged["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
    return merged


class Launcher:
    """Start, watch and stop the stack's processes. Use as a context manager or call ``stop``."""

    def __init__(self, settings: StackSettings, env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.specs = plan(settings)
        self.log_dir = settings.data_dir.resolve() / "logs"
        self.children: list[Child] = []
        self._rotation_failing: set[str] = set()  # services whose log could not be rotated, said once
        self._env = child_env(settings, dict(os.environ if env is None else env))

    def url(self, name: str) -> str:
        return f"http://{_url_host(self.settings.host)}:{self._spec(name).port}"

    @property
    def training_url(self) -> str:
        return self.url("training_server")

    @property
    def coalescer_url(self) -> str:
        return self.url("coalescer")

    def start(self) -> None:
        """Spawn every service and return once each answers its readiness probe.

        The training server goes first (it owns the model store the replicas read); the
        replicas and the coalescer then start together.
        """
        busy = [spec for spec in self.specs if not _port_free(self.settings.host, spec.port)]
        if busy:
            ports = ", ".join(f"{s.port} ({s.name})" for s in busy)
            raise StackError(f"port(s) already in use: {ports}; choose another --base-port")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.settings.data_dir.resolve() / "training").mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        deadline = started + self.settings.ready_timeout_s
        first, rest = self.specs[:1], self.specs[1:]
        self._wait_ready([self._spawn(spec) for spec in first], deadline)
        self._wait_ready([self._spawn(spec) for spec in rest], deadline)
        log_event(
            log, "stack_ready", services=len(self.children), startup_s=round(time.monotonic() - started, 2)
        )

    def check(self) -> None:
        """Raise ``ChildExited`` if any service has exited (the stack does not restart them); keep
        every service's log under its cap (``rotate_logs``). Call it every second or so."""
        for child in self.children:
            code = child.proc.poll()
            if code is not None:
                raise ChildExited(child.spec.name, code, child.log_path, child.log_tail())
        self.rotate_logs()

    def rotate_logs(self) -> None:
        """Copy each log past ``log_max_mb`` to ``<name>.log.1`` (replacing the last copy) and empty it.

        A service logs an event per retrain and per calibration version, about a megabyte an hour
        each, for as long as the stack runs. The service keeps its file open and writes on: it was
        opened for appending, so after the truncation its next line lands at the new end (logrotate's
        ``copytruncate``; a line written between the copy and the truncation is lost).
        """
        cap = self.settings.log_max_mb * 2**20
        for child in self.children:
            try:
                if child.log_path.stat().st_size <= cap:
                    continue
                shutil.copyfile(child.log_path, child.log_path.with_name(child.log_path.name + ".1"))
                os.truncate(child.log_path, 0)
            except OSError as exc:  # a full disk or a removed file must not stop the stack
                if child.spec.name not in self._rotation_failing:  # once, not at every check
                    self._rotation_failing.add(child.spec.name)
                    log_event(
                        log, "log_rotation_failed", logging.WARNING, child=child.spec.name, error=str(exc)
                    )
                continue
            self._rotation_failing.discard(child.spec.name)
            log_event(log, "log_rotated", child=child.spec.name, log=str(child.log_path))

    def stop(self) -> dict[str, int]:
        """Stop every service: coalescer first, training server last; return exit codes by name.

        Each stage gets SIGTERM and ``stop_timeout_s``; stragglers (including worker processes
        left in a service's process group) are SIGKILLed. Safe to call more than once.
        """
        stages = [
            [c for c in self.children if c.spec.module == "coalescer"],
            [c for c in self.children if c.spec.module == "prediction_server"],
            [c for c in self.children if c.spec.module not in ("coalescer", "prediction_server")],
        ]
        codes: dict[str, int] = {}
        for stage in stages:
            for child in stage:
                _signal_group(child.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.settings.stop_timeout_s
            for child in stage:
                try:
                    codes[child.spec.name] = child.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log_event(log, "service_killed", logging.WARNING, child=child.spec.name, pid=child.pid)
                    _signal_group(child.pid, signal.SIGKILL)
                    codes[child.spec.name] = child.proc.wait()
                # The leader is gone; make sure none of its workers outlived it.
                if _group_alive(child.pid):
                    _signal_group(child.pid, signal.SIGKILL)
        if codes:
            log_event(
                log,
                "stack_stopped",
                exit_codes=codes,
                exits={name: describe_exit(code) for name, code in codes.items()},
            )
        return codes

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spec(self, name: str) -> ChildSpec:
        for spec in self.specs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def _spawn(self, spec: ChildSpec) -> Child:
        host = self.settings.host
        log_path = self.log_dir / f"{spec.name}.log"
        argv = [sys.executable, "-m", spec.module, "--host", host, "--port", str(spec.port), *spec.args]
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()) if sys.platform == "linux" else None,
            )
        child = Child(spec, f"http://{_url_host(host)}:{spec.port}", proc, log_path)
        self.children.append(child)
        log_event(log, "service_started", child=spec.name, pid=proc.pid, url=child.url, log=str(log_path))
        return child

    def _wait_ready(self, children: list[Child], deadline: float) -> None:
        pending = list(children)
        with httpx.Client(timeout=2.0) as client:
            while pending:
                for child in list(pending):
                    code = child.proc.poll()
                    if code is not None:
                        raise StackError(
                            f"{child.spec.name} exited with code {code} while starting; "
                            f"last lines of {child.log_path}:\n{child.log_tail()}"
                        )
                    try:
                        if client.get(child.url + child.spec.ready_path).status_code == 200:
                            pending.remove(child)
                            log_event(log, "service_ready", child=child.spec.name, url=child.url)
                    except httpx.HTTPError:
                        pass
                if pending and time.monotonic() > deadline:
                    names = ", ".join(c.spec.name for c in pending)
                    tails = "\n".join(f"--- {c.log_path}:\n{c.log_tail(1000)}" for c in pending)
                    raise StackError(f"not ready after {self.settings.ready_timeout_s:g}s: {names}\n{tails}")
                if pending:
                    time.sleep(0.1)


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn``: SIGTERM this child when the launcher dies, even by SIGKILL (Linux)."""

    def preexec() -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        # As uvicorn does: a port held only by TIME_WAIT connections of a previous run is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _url_host(host: str) -> str:
    """The host to put in URLs: a wildcard bind address is reached through loopback."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def describe_exit(code: int) -> str:
    """A child's exit status in words (a service stopped by our SIGTERM exits with -15: that is fine)."""
    if code == 0:
        return "exited cleanly"
    if code == -signal.SIGTERM:
        return "stopped cleanly on SIGTERM"
    if code == -signal.SIGKILL:
        return "killed (did not stop within --stop-timeout-s, or killed from outside)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"failed with exit code {code}"


def describe_exits(codes: dict[str, int]) -> str:
    """One line for the stop of the whole stack, naming only the services that did not stop cleanly."""
    clean = {0, -signal.SIGTERM}
    bad = {name: code for name, code in codes.items() if code not in clean}
    if not bad:
        return f"latency-stack: all {len(codes)} services stopped cleanly."
    problems = "; ".join(f"{name} {describe_exit(code)}" for name, code in bad.items())
    return f"latency-stack: {len(codes) - len(bad)} of {len(codes)} services stopped cleanly; {problems}."
