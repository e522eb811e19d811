"""Faults of prediction replicas behind the coalescer, with real processes on loopback.

Each test starts real ``prediction_server`` replicas (the built-in prior answers; the model is
irrelevant here) and a real ``coalescer`` in front of them, puts load on the coalescer, and
breaks a replica at the operating-system level:

* SIGKILL of one of three replicas under load: callers see nothing but answers (and, at worst,
  expired deadlines);
* SIGSTOP of one of two replicas (a replica that stops answering without closing anything):
  traffic shifts to the other within the deadline, none goes to it while it is stopped, and it
  gets traffic again after SIGCONT;
* overload while the only replica is stopped: the callers beyond the queue bound get an immediate
  503 with Retry-After, and the coalescer's memory stays flat over repeated floods.

The coalescer's own behaviour against fault-injecting fake replicas (500s, broken connections,
short answers, hung calls, the exact 503 accounting, nothing shed reaching a replica) is covered
in process by ``tests/service/test_coalescer_batching.py``; these tests add real processes,
real signals and memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.load import LoadThreads
from tests.procs import RunningService, StartService, eventually, wait_until
from training_server import synthetic

pytestmark = pytest.mark.e2e

ROWS = synthetic.to_entries(synthetic.pod_states(8, np.random.default_rng(0)))


@contextlib.contextmanager
def stack(
    start: StartService, replicas: int, *coalescer_flags: str
) -> Iterator[tuple[RunningService, list[RunningService]]]:
    """``replicas`` real prediction replicas and a coalescer in front, every replica healthy; the
    ``start`` fixture stops them (after a SIGCONT) when the test ends."""
    started = [start("prediction_server", [], ready_path="/readyz") for _ in range(replicas)]
    urls = ",".join(s.url for s in started)
    coalescer = start("coalescer", ["--prediction-urls", urls, *coalescer_flags], ready_path="/readyz")
    wait_until(lambda: _healthy(coalescer) == replicas, "every replica healthy")
    yield coalescer, started


class Callers(LoadThreads):
    """Threads calling the coalescer back to back; statuses and transport errors are counted."""

    def __init__(self, url: str, threads: int = 4) -> None:
        super().__init__(threads)
        self.url = url
        self.statuses: Counter[int] = Counter()
        self._body = orjson.dumps({"requests": ROWS})

    def step(self, client: httpx.Client, worker: int) -> None:
        try:
            response = client.post(self.url + "/predict/bulk/strict", content=self._body)
        except httpx.HTTPError as exc:
            with self.lock:
                self.errors.append(repr(exc))
            return
        with self.lock:
            self.statuses[response.status_code] += 1
        if response.status_code == 200:
            assert len(response.json()["predictions"]) == len(ROWS)

    @property
    def answered(self) -> int:
        return self.statuses[200]


def _replicas(coalescer: RunningService) -> dict[str, dict[str, Any]]:
    status = httpx.get(coalescer.url + "/status", timeout=5).json()
    return {r["url"]: r for r in status["coalescer"]["replicas"]}


def _healthy(coalescer: RunningService) -> int:
    return sum(r["state"] == "healthy" for r in _replicas(coalescer).values())


def test_a_replica_killed_under_load_costs_callers_nothing(start: StartService) -> None:
    with stack(start, 3, "--deadline-ms", "500", "--eject-cooldown-s", "30") as (coalescer, replicas):
        victim = replicas[0]
        with Callers(coalescer.url) as callers:
            wait_until(lambda: callers.answered >= 200, "load before the kill")
            victim.kill()
            at_kill = callers.answered
            wait_until(lambda: callers.answered >= at_kill + 300, "load after the kill")
        states = {url: r["state"] for url, r in _replicas(coalescer).items()}
    assert callers.errors == []
    assert set(callers.statuses) <= {200, 504}, callers.statuses  # expired deadlines at worst
    assert callers.statuses[504] <= 4, callers.statuses
    assert states[victim.url] == "ejected" and sorted(states.values()) == ["ejected", "healthy", "healthy"]


def test_a_stopped_replica_loses_its_traffic_and_gets_it_back_after_sigcont(start: StartService) -> None:
    flags = ("--deadline-ms", "400", "--eject-cooldown-s", "1", "--probe-interval-s", "0.2")
    with stack(start, 2, *flags) as (coalescer, replicas):
        slow = replicas[0]
        with Callers(coalescer.url) as callers:
            wait_until(
                lambda: callers.answered >= 100 and _replicas(coalescer)[slow.url]["calls"] > 0,
                lambda: f"warm load: {callers.statuses} {callers.errors[:3]} {_replicas(coalescer)}",
            )
            os.killpg(slow.proc.pid, signal.SIGSTOP)
            try:
                wait_until(
                    lambda: _replicas(coalescer)[slow.url]["state"] == "ejected",
                    "the stopped replica ejected",
                )
                stopped_calls = _replicas(coalescer)[slow.url]["calls"]
                answered = callers.answered
                # Its cool-down ends, the probe of the stopped replica times out: still ejected.
                wait_until(
                    lambda: str(_replicas(coalescer)[slow.url]["last_error"]).startswith("/readyz failed"),
                    "a probe of the stopped replica to time out",
                )
                wait_until(
                    lambda: callers.answered >= answered + 100, "the other replica to take the traffic"
                )
                assert _replicas(coalescer)[slow.url]["calls"] == stopped_calls, "traffic went to it"
            finally:
                os.killpg(slow.proc.pid, signal.SIGCONT)
            wait_until(
                lambda: _replicas(coalescer)[slow.url]["state"] == "healthy", "the replica probed back"
            )
            wait_until(lambda: _replicas(coalescer)[slow.url]["calls"] > stopped_calls, "traffic back on it")
    assert callers.errors == []
    assert set(callers.statuses) <= {200, 504}, callers.statuses
    assert callers.statuses[504] <= 8, callers.statuses


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _overload_round(
    url: str, flood_callers: int, rows: int
) -> tuple[list[int], list[tuple[int, float]]]:
    """Fill the queue to its bound, time sequential callers beyond it, then flood it concurrently.

    Returns the flood's statuses and the timed callers' (status, seconds). The timed callers go
    one at a time so that their latency is the coalescer's, not this client's queueing.
    """
    body = orjson.dumps({"requests": ROWS * (rows // len(ROWS))})
    limits = httpx.Limits(max_connections=flood_callers + 10, max_keepalive_connections=flood_callers + 10)
    async with httpx.AsyncClient(timeout=10, limits=limits) as client:
        post = lambda: client.post(url + "/predict/bulk/strict", content=body)  # noqa: E731

        async def gauge(name: str) -> float:
            text = (await client.get(url + "/metrics")).text
            return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))

        # One call in flight to the stopped replica, one queued: the queue is over its bound.
        fillers = [asyncio.create_task(post())]
        await eventually(lambda: gauge("coalescer_inflight_calls"), "a call in flight to the stopped replica")
        fillers.append(asyncio.create_task(post()))
        await eventually(lambda: gauge("coalescer_queue_rows"), "a caller queued behind it")
        timed = []
        for _ in range(20):
            started = time.perf_counter()
            response = await post()
            timed.append((response.status_code, time.perf_counter() - started))
            assert response.status_code != 503 or response.headers.get("retry-after")
        flood = await asyncio.gather(*(post() for _ in range(flood_callers)))
        statuses = [r.status_code for r in flood] + [r.status_code for r in await asyncio.gather(*fillers)]
    return statuses, timed


def test_overload_is_shed_with_fast_503s_and_memory_stays_flat(start: StartService) -> None:
    flags = ("--deadline-ms", "3000", "--max-queued-rows", "100", "--max-inflight-per-replica", "1")
    with stack(start, 1, *flags) as (coalescer, (replica,)):
        os.killpg(replica.proc.pid, signal.SIGSTOP)  # nothing drains: admitted rows wait until their deadline
        try:
            rss = [_rss_kib(coalescer.proc.pid)]
            statuses: Counter[int] = Counter()
            timed: list[tuple[int, float]] = []
            for _ in range(3):  # 120 callers x 200 rows per round
                flood, probes = asyncio.run(_overload_round(coalescer.url, flood_callers=100, rows=200))
                statuses.update(flood)
                timed += probes
                rss.append(_rss_kib(coalescer.proc.pid))
        finally:
            os.killpg(replica.proc.pid, signal.SIGCONT)
        shed_ms = sorted(round(seconds * 1000, 1) for _, seconds in timed)
        rss_mib = [kib // 1024 for kib in rss]
        median_ms = shed_ms[len(shed_ms) // 2]
        print(
            f"overload: {dict(statuses)}; shed in {median_ms} ms median, {shed_ms[-1]} ms max; "
            f"RSS {rss_mib} MiB"
        )
        assert set(statuses) <= {503, 504, 502}, statuses  # shed, or expired waiting for the stopped replica
        assert statuses[503] == 3 * 100, statuses
        assert {status for status, _ in timed} == {503}
        # Shedding waits for nothing: far below the 3 s deadline even on a loaded 2-core machine.
        assert max(seconds for _, seconds in timed) < 0.5, timed
        # Rows beyond the bound are never held, so repeated floods do not grow the process.
        assert rss[-1] - rss[1] < 20 * 1024, rss
        # The replica is back: the coalescer answers again.
        recovered = lambda: httpx.post(coalescer.url + "/predict/bulk/strict", json={"requests": ROWS})  # noqa: E731
        wait_until(lambda: recovered().status_code == 200, "recovery after SIGCONT")
