"""The batcher's admission control and batch forming, with a fake clock and no network.

The replica is held at its in-flight cap by hand, so nothing leaves until a slot is released;
batches that do leave are cancelled at the end (``Batcher.close``) before they could connect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from coalescer.batcher import Batcher, Ticket
from coalescer.metrics import create_metrics
from coalescer.upstreams import ReplicaPool
from shared.errors import DeadlineExceeded, Overloaded
from tests.procs import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rows(n: int) -> list[dict[str, Any]]:
    return [{"input_token_length": i} for i in range(n)]  # the batcher never looks inside rows


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Batcher, ReplicaPool, Clock]]:
    clock = Clock()
    pool = ReplicaPool(max_inflight=1, eject_cooldown_s=5.0, http=httpx.AsyncClient(), clock=clock)
    pool.set_urls(["http://replica.invalid:1"])
    replica = pool.replicas[0]
    replica.state = "healthy"
    pool.acquire(replica, 1)  # busy: nothing can leave yet
    batcher = Batcher(
        pool,
        create_metrics(),
        window_s=0.001,
        max_batch_rows=50,
        max_queued_rows=100,
        max_wait_share=0.5,
        eager_inflight=1,
        max_inflight=1,
        clock=clock,
    )
    submitted: list[Ticket] = []
    submit = batcher.submit

    def tracked(rows: list[Any], deadline: float) -> list[Ticket]:
        tickets = submit(rows, deadline)
        submitted.extend(tickets)
        return tickets

    batcher.submit = tracked  # type: ignore[method-assign]
    yield batcher, pool, clock
    await batcher.close()
    for ticket in submitted:  # nobody awaits them here; the app's handlers always do
        if ticket.future.done() and not ticket.future.cancelled():
            ticket.future.exception()


async def test_an_empty_queue_takes_any_caller(setup: tuple[Batcher, ReplicaPool, Clock]) -> None:
    batcher, _, clock = setup
    batcher.check_admission(5000, clock.now + 0.25)  # larger than the queue bound, but nobody waits
    tickets = batcher.submit(rows(120), clock.now + 0.25)
    assert [t.n for t in tickets] == [50, 50, 20]  # cut at the row cap, only because it alone exceeds it
    assert batcher.queued_rows == 120


async def test_the_queue_bound_refuses_what_does_not_fit(setup: tuple[Batcher, ReplicaPool, Clock]) -> None:
    batcher, _, clock = setup
    batcher.submit(rows(90), clock.now + 10)
    with pytest.raises(Overloaded) as info:
        batcher.submit(rows(20), clock.now + 10)
    assert info.value.status_code == 503 and info.value.headers["Retry-After"] == "1"
    assert batcher.queued_rows == 90
    batcher.submit(rows(10), clock.now + 10)
    assert batcher.queued_rows == 100


async def test_a_newcomer_that_would_expire_in_the_queue_is_refused(
    setup: tuple[Batcher, ReplicaPool, Clock],
) -> None:
    batcher, _, clock = setup
    batcher.submit(rows(10), clock.now + 10)
    clock.now += 0.100  # nothing drained for 100 ms: a newcomer should expect at least that
    batcher.check_admission(10, clock.now + 0.250)  # 100 ms < half of 250 ms
    with pytest.raises(Overloaded, match="would wait about 100 ms"):
        batcher.check_admission(10, clock.now + 0.150)  # 100 ms > half of 150 ms


async def test_the_expected_wait_follows_the_drain_rate(setup: tuple[Batcher, ReplicaPool, Clock]) -> None:
    batcher, pool, clock = setup
    replica = pool.replicas[0]
    for _ in range(4):
        batcher.submit(rows(10), clock.now + 10)
    clock.now += 0.050
    pool.release(replica, 1)  # a slot frees: the first 40 rows leave together (within the row cap)
    assert batcher.queued_rows == 0
    batcher.submit(rows(10), clock.now + 10)  # this one waits for the busy replica
    for _ in range(5):
        batcher.submit(rows(10), clock.now + 10)
    clock.now += 0.040
    # 60 rows wait; since the oldest arrived 40 ms ago nothing left: expect >= 40 ms.
    with pytest.raises(Overloaded, match="about 40 ms"):
        batcher.check_admission(10, clock.now + 0.070)
    batcher.check_admission(10, clock.now + 0.090)


async def test_abandoned_callers_free_their_queue_space(
    setup: tuple[Batcher, ReplicaPool, Clock],
) -> None:
    batcher, _, clock = setup
    (first,) = batcher.submit(rows(40), clock.now + 10)
    (second,) = batcher.submit(rows(40), clock.now + 10)
    batcher.abandon(first, "disconnected")
    assert batcher.queued_rows == 40 and first.future.cancelled()
    batcher.submit(rows(50), clock.now + 10)
    assert batcher.queued_rows == 90
    assert second.waiting


async def test_a_failure_after_the_deadline_is_a_504_not_a_502() -> None:
    clock = Clock()
    pool = ReplicaPool(max_inflight=1, eject_cooldown_s=5.0, http=httpx.AsyncClient(), clock=clock)
    pool.set_urls([f"http://127.0.0.1:{free_port()}"])  # nothing listens: the call fails at once
    batcher = Batcher(
        pool, create_metrics(), window_s=0.001, max_batch_rows=50, max_queued_rows=100, eager_inflight=1,
        max_inflight=1, clock=clock,
    )  # fmt: skip
    (ticket,) = batcher.submit(rows(1), clock.now + 0.2)
    assert not ticket.waiting  # it left at once
    clock.now += 0.5  # by the time the failure is seen, the caller's time is up
    with pytest.raises(DeadlineExceeded):
        await ticket.future
    await batcher.close()
