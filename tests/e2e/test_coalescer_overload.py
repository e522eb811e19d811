"""512 concurrent callers against a real coalescer and a real prediction replica: every call the
coalescer accepts (200) is answered within its deadline, counted from its estimated arrival; the
rest are shed at once (503) or told their deadline passed (504), never answered late.

Time a request waits before its handler (in the socket and the event loop's queue) is invisible
to the handler; the coalescer counts the loop's lag against each deadline and sheds while the
lag exceeds a share of it (``coalescer.loop_lag``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from coalescer.http1 import Http1Pool
from coalescer.loop_lag import LoopLagMonitor
from tests.e2e.predicting import random_row
from tests.procs import RunningService, start_service

CALLERS = 512
ROWS_PER_CALL = 100  # 512 callers x 100 rows is beyond the queue bound however fast the machine
DEADLINE_MS = 250.0
STRICT = "/predict/bulk/strict"
RETRY_AFTER_S = 1.0


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[RunningService]:
    service = start_service(
        "prediction_server", ["--store", str(tmp_path / "models")], log_dir=tmp_path, ready_path="/readyz"
    )
    try:
        yield service
    finally:
        service.stop()


async def overload(url: str, seconds: float) -> list[tuple[int, float, float]]:
    """(status, seconds, how late this client's own loop was) of every call of ``CALLERS`` callers.

    On this shared 2-core machine the client's event loop is itself late at times; a call's
    latency minus that lateness is what the coalescer made it wait."""
    rng = random.Random(7)
    lag = LoopLagMonitor()
    monitor = asyncio.create_task(lag.run())
    body = orjson.dumps({"requests": [random_row(rng) for _ in range(ROWS_PER_CALL)]})
    pool = Http1Pool(url, max_idle=CALLERS)  # a lean client, so the load really arrives
    results: list[tuple[int, float, float]] = []
    stop_at = time.monotonic() + seconds

    async def caller() -> None:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            response = await pool.request("POST", STRICT, body, timeout_s=10.0)
            results.append((response.status, time.perf_counter() - started, lag.lag_s()))
            if response.status == 503:  # shed: come back after Retry-After, as the scheduler client does
                await asyncio.sleep(RETRY_AFTER_S * rng.uniform(0.5, 1.0))

    try:
        await asyncio.gather(*(caller() for _ in range(CALLERS)))
    finally:
        pool.close()
        monitor.cancel()
    return results


async def test_under_512_callers_every_accepted_call_finishes_within_its_deadline(
    replica: RunningService, tmp_path: Path
) -> None:
    coalescer = start_service(
        "coalescer",
        ["--prediction-urls", replica.url, "--deadline-ms", str(DEADLINE_MS)],
        log_dir=tmp_path,
        ready_path="/readyz",
    )
    try:
        results = await overload(coalescer.url, 6.0)
        metrics = httpx.get(coalescer.url + "/metrics").text
    finally:
        coalescer.stop()
    codes = Counter(code for code, _, _ in results)
    assert set(codes) <= {200, 503, 504}, codes
    assert codes[200] > 100 and codes[503] > 0, codes  # it kept serving, and it shed
    # The coalescer's own account, from each call's estimated arrival (the handler's start plus
    # the loop's lag): an accepted call is answered within its deadline or not at all (504).
    on_time = _bucket(metrics, "200", DEADLINE_MS / 1000)
    answered = _bucket(metrics, "200", float("inf"))
    assert answered == _bucket(metrics, "200", 2 * DEADLINE_MS / 1000)
    # (A call whose answer passed the deadline check a few microseconds before its deadline may be
    # observed just after it when the process is descheduled in between: allow 1 in 100.)
    assert on_time >= 0.99 * answered, (on_time, answered)
    # As the callers saw it, less their own event loop's lateness: on this shared 2-core machine
    # the client is itself starved at times (its lag monitor samples it, it does not see every
    # stall), and its sockets and parsing take time the coalescer cannot see, so the typical call
    # is held to the deadline with half of it again for the client's side (a clean-clone CI run saw
    # a median of 254 ms against 250). A coalescer that queued past its deadlines answers these
    # 512 callers in seconds.
    seen = sorted(t - client_lag for code, t, client_lag in results if code == 200)
    assert seen[len(seen) // 2] * 1000 < 1.5 * DEADLINE_MS, seen[len(seen) // 2]


def _bucket(metrics: str, code: str, le: float) -> float:
    """Cumulative count of ``code`` calls at or under ``le`` seconds in the call-duration histogram."""
    wanted = "+Inf" if le == float("inf") else repr(le)
    total = 0.0
    for line in metrics.splitlines():
        if (
            line.startswith("coalescer_call_duration_seconds_bucket{")
            and f'code="{code}"' in line
            and f'le="{wanted}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total
