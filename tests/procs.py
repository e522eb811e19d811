"""Start real service processes on loopback ports for tests (e2e and service-level).

``start_service("training_server", ["--data-dir", str(tmp)])`` runs
``python -m training_server --host 127.0.0.1 --port <free>`` plus the given flags, waits
until ``GET /healthz`` answers, and returns a handle that stops the process (SIGTERM,
then SIGKILL after a timeout) when closed. Logs go to a file under the pytest tmp dir so
a failing test can show them (the ``start`` fixture of ``tests/conftest.py`` stops them too).

Also the tests' one condition wait (``wait_until``; ``eventually`` in an event loop) and the
in-process servers: ``serve_in_loop(app)`` (uvicorn on a free port in the test's loop) and
``coalescer_in_loop`` (a real coalescer app in front of fault-injecting fake replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

REPO_ROOT = Path(__file__).resolve().parent.parent


def _below_ephemeral() -> int:
    """The first port of the kernel's ephemeral range (where client sockets get their local ports)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_base_port(count: int) -> int:
    """A base port with ``count`` consecutive free loopback ports, below the ephemeral range: a
    port the kernel handed out (``bind(0)``) can be taken again as a client connection's local
    port before the server binds it (seen in CI: a replica's ``address already in use``)."""
    top = _below_ephemeral() - count
    chooser = random.SystemRandom()
    for _ in range(200):
        base = chooser.randrange(10_000, max(top, 10_001))
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def free_port() -> int:
    return free_base_port(1)


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


StartService = Callable[..., RunningService]  # the ``start`` fixture of tests/conftest.py


def start_service(
    module: str,
    args: Sequence[str] = (),
    *,
    log_dir: Path,
    port: int | None = None,
    env: dict[str, str] | None = None,
    ready_path: str = "/healthz",
    timeout_s: float = 60.0,
    root: Path = REPO_ROOT,
) -> RunningService:
    """Start ``python -m module`` on a free loopback port and wait until ``ready_path`` answers 200.

    ``root`` is the checkout whose code runs (its packages first on the path): this one, or
    another (a benchmark comparing two versions of the services)."""
    port = port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{module}-{port}.log"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), full_env.get("PYTHONPATH")]))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=root,
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


def wait_until(
    predicate: Callable[[], Any],
    what: str | Callable[[], str] = "condition",
    timeout_s: float = 30.0,
    poll_s: float = 0.05,
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail naming ``what``
    (a callable ``what`` is asked at the failure, to show the state then).

    The one condition wait of the tests: never a fixed sleep to observe an effect. An HTTP error
    from ``predicate`` (a server still starting or restarting) counts as "not yet".
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
            error = None
        except httpx.HTTPError as exc:
            value, error = None, exc
        if value:
            return value
        if time.monotonic() >= deadline:
            described = what if isinstance(what, str) else what()
            last = f" (last error {error!r})" if error is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {described}{last}")
        time.sleep(poll_s)


async def eventually(
    check: Callable[[], Any], what: str = "condition", timeout_s: float = 10.0, poll_s: float = 0.01
) -> Any:
    """``wait_until`` for tests running in an event loop: ``check`` may be sync or async."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        await asyncio.sleep(poll_s)


@contextlib.asynccontextmanager
async def serve_in_loop(app: Any) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on a free loopback port in the current event loop; yields its URL."""
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=1,
        )
    )
    task = asyncio.get_running_loop().create_task(server.serve())
    try:
        await eventually(lambda: server.started or task.done(), "uvicorn to start")
        if task.done():
            task.result()
            raise RuntimeError("server exited before starting")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def coalescer_in_loop(
    replicas: int = 1, *, training: bool = False, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, list[Any]]]:
    """A real coalescer app (its lifespan, batcher and hot-path client) in front of ``replicas``
    fault-injectable fake replicas, all under uvicorn in the current loop; waits until the
    coalescer is ready and yields a client for it and the fakes' knobs (``tests.fake_upstream``).
    ``training=True`` makes the first fake play the training server too."""
    from coalescer.app import create_app
    from coalescer.config import CoalescerSettings
    from tests.fake_upstream import create_app as fake_replica

    async with contextlib.AsyncExitStack() as exits:
        apps = [fake_replica() for _ in range(replicas)]
        urls = [await exits.enter_async_context(serve_in_loop(app)) for app in apps]
        if training:
            settings.setdefault("training_url", urls[0])
        coalescer = create_app(CoalescerSettings(prediction_urls=urls, **settings))
        base = await exits.enter_async_context(serve_in_loop(coalescer))
        client = await exits.enter_async_context(
            httpx.AsyncClient(base_url=base, timeout=10.0, limits=httpx.Limits(max_connections=1000))
        )

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await eventually(ready, "the coalescer to see a ready replica")
        yield client, [app.state.knobs for app in apps]
