"""Batching: callers carry futures, one dispatcher turns them into upstream batch calls.

The dispatcher is one synchronous routine (``Batcher._dispatch``), run on everything that can
let a batch leave: an arrival, a finished call, a replica turning healthy, a retry, and the
batch's window timer. A batch leaves:

* at once, if some healthy replica has fewer than ``eager_inflight`` calls in flight: an idle
  system adds no wait;
* otherwise when the batch's window, measured with ``time.monotonic()`` from its *first*
  arrival, has expired, or its rows reached ``max_batch_rows``, to the least-loaded replica
  below ``max_inflight`` calls; if every replica is at that cap it keeps collecting (up to the
  row cap) until a call finishes.

Callers leave the queue in arrival order and a caller's rows never split across batches unless
the caller alone exceeds the row cap (then it is cut into cap-sized tickets). The replica's
answer is checked for length and sliced back to the tickets in order. A failed batch is retried
once, as a whole, on another replica (ahead of new batches, within the callers' deadlines); if
that fails too, every caller in it gets the error.

Every ticket has a deadline timer: expiry resolves it with a 504 wherever it is. Expired and
disconnected tickets are skipped when a batch is formed and pruned before a retry, and the rows
waiting in the queue are bounded (``max_queued_rows``), as is the wait a newcomer should expect
relative to its deadline (``max_wait_share``): beyond either, ``submit`` raises ``Overloaded`` at
once, so shed load never reaches a replica and admitted callers can still meet their deadlines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from coalescer.http1 import UpstreamError, UpstreamTimeout
from coalescer.metrics import CoalescerMetrics
from coalescer.outcomes import CallFailed, read_predictions, transport_failure
from coalescer.upstreams import Replica, ReplicaPool
from shared.errors import DeadlineExceeded, Overloaded, ServiceError, UpstreamUnavailable
from shared.logging import log_event

log = logging.getLogger(__name__)

UPSTREAM_PATH = "/predict/bulk/strict"
# The first attempt may use this share of the time left, so a hung replica leaves room for the retry.
FIRST_ATTEMPT_SHARE = 0.5
# A timed-out call ejects its replica only if it was given at least this share of the default
# deadline; one cut short by a caller's tighter X-Deadline-Ms says nothing about the replica.
SLOW_CALL_SHARE = FIRST_ATTEMPT_SHARE * 0.8
MIN_ATTEMPT_S = 0.001

_QUEUED, _SENT, _DONE = 0, 1, 2


class Ticket:
    """One caller's rows (or a cap-sized slice of them) waiting for predictions."""

    __slots__ = ("deadline", "enqueued_at", "future", "n", "rows", "state", "taken_mark", "timer")

    def __init__(
        self, rows: list[Any], deadline: float, now: float, future: asyncio.Future[list[Any]], taken_mark: int
    ) -> None:
        self.rows = rows
        self.taken_mark = taken_mark  # rows that had left the queue when this ticket joined it
        self.n = len(rows)
        self.deadline = deadline
        self.enqueued_at = now
        self.future = future
        self.state = _QUEUED
        self.timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> bool:
        """Still in the queue (not yet sent, not yet finished)."""
        return self.state == _QUEUED

    def resolve(self, predictions: list[Any]) -> None:
        if self.state != _DONE:
            self._finish()
            self.future.set_result(predictions)

    def fail(self, exc: BaseException) -> None:
        if self.state != _DONE:
            self._finish()
            self.future.set_exception(exc)

    def _finish(self) -> None:
        self.state = _DONE
        if self.timer is not None:
            self.timer.cancel()


class ClientDisconnected(ServiceError):
    """The caller hung up before its predictions arrived (nginx's 499; nobody reads the answer)."""

    status_code = 499
    reason = "client_disconnected"


class _Batch:
    __slots__ = ("attempts", "failed_on", "last_error", "tickets")

    def __init__(self, tickets: list[Ticket]) -> None:
        self.tickets = tickets
        self.attempts = 0
        self.failed_on: list[Replica] = []
        self.last_error: ServiceError | None = None

    def prune(self) -> None:
        self.tickets = [t for t in self.tickets if t.state != _DONE]


class Batcher:
    """The queue of waiting tickets, the dispatcher that empties it, and the batch calls in flight."""

    def __init__(
        self,
        pool: ReplicaPool,
        metrics: CoalescerMetrics,
        *,
        window_s: float,
        max_batch_rows: int,
        max_queued_rows: int,
        max_wait_share: float = 0.5,
        eager_inflight: int,
        max_inflight: int,
        slow_call_s: float = 0.1,
        upstream_headers: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._metrics = metrics
        self.window_s = window_s
        self.max_batch_rows = max_batch_rows
        self.max_queued_rows = max_queued_rows
        self.max_wait_share = max_wait_share
        self._eager = eager_inflight
        self._max_inflight = max_inflight
        self.slow_call_s = slow_call_s  # a call timed out after this long ejects its replica
        self._headers = upstream_headers
        self._clock = clock
        self._queue: deque[Ticket] = deque()
        self._retries: deque[_Batch] = deque()
        self.queued_rows = 0
        self._taken_rows = 0  # rows that ever left the queue, for the drain rate
        self.inflight_calls = 0
        self.inflight_rows = 0
        self._dispatching = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        pool.add_listener(self._dispatch)

    @property
    def queued_callers(self) -> int:
        return sum(1 for t in self._queue if t.state == _QUEUED)

    # caller side
    def submit(self, rows: list[Any], deadline: float) -> list[Ticket]:
        """Queue ``rows`` (already validated) for prediction; raise ``Overloaded`` when the queue is full."""
        n = len(rows)
        self.check_admission(n, deadline)
        if not self._pool.replicas:
            raise UpstreamUnavailable("no prediction replica is known (check --prediction-urls/-dns)")
        loop = self._loop = self._loop or asyncio.get_running_loop()
        now = self._clock()
        cap = self.max_batch_rows
        parts = [rows] if n <= cap else [rows[i : i + cap] for i in range(0, n, cap)]
        tickets = []
        for part in parts:
            ticket = Ticket(part, deadline, now, loop.create_future(), self._taken_rows)
            ticket.timer = loop.call_later(max(0.0, deadline - now), self._expire, ticket)
            self._queue.append(ticket)
            tickets.append(ticket)
        was_idle = self.queued_rows == 0
        self.queued_rows += n
        if was_idle or self.queued_rows >= cap:
            self._dispatch()  # otherwise nothing changed for the batch already waiting
        return tickets

    def check_admission(self, rows: int, deadline: float) -> None:
        """Raise ``Overloaded`` if a caller with ``rows`` rows and this deadline should be refused now.

        Two bounds: the rows waiting (memory; an empty queue takes anyone), and the wait the
        newcomer should expect. That wait is the rows ahead of it divided by the rate the queue
        has drained at since its oldest caller arrived (at least the oldest caller's age); past
        ``max_wait_share`` of the newcomer's time left it would most likely expire in the queue,
        so it is better told at once and the callers already admitted keep their deadlines.
        """
        if not self.queued_rows:
            return
        if self.queued_rows + rows > self.max_queued_rows:
            raise Overloaded(
                f"overloaded: {self.queued_rows} rows already waiting (limit {self.max_queued_rows})",
                retry_after_s=1.0,
            )
        queue = self._queue
        while queue and queue[0].state != _QUEUED:
            queue.popleft()
        if not queue:
            return
        head = queue[0]
        now = self._clock()
        waited_s = now - head.enqueued_at
        drained = self._taken_rows - head.taken_mark
        expected_s = max(waited_s, self.queued_rows * waited_s / drained) if drained else waited_s
        if expected_s > self.max_wait_share * (deadline - now):
            raise Overloaded(
                f"overloaded: a new caller would wait about {expected_s * 1000:.0f} ms for a replica",
                retry_after_s=1.0,
            )

    def abandon(self, ticket: Ticket, reason: str = "abandoned", exc: ServiceError | None = None) -> None:
        """The caller is gone: drop its ticket (if it has not left yet, it never will).

        With ``exc`` the ticket fails with it (the caller may still be awaiting); without, it is cancelled.
        """
        if ticket.state == _QUEUED:
            self.queued_rows -= ticket.n
            self._metrics.dropped_callers.labels(reason).inc()
        if ticket.state != _DONE:
            if exc is None:
                ticket._finish()
                ticket.future.cancel()
            else:
                ticket.fail(exc)
        elif not ticket.future.cancelled():
            ticket.future.exception()  # mark it retrieved: no "never retrieved" warning at exit

    def _expire(self, ticket: Ticket) -> None:
        if ticket.state == _DONE:
            return
        if ticket.state == _QUEUED:
            self.queued_rows -= ticket.n
            self._metrics.dropped_callers.labels("deadline_exceeded").inc()
        ticket.fail(DeadlineExceeded("deadline exceeded before the prediction arrived"))

    # the dispatcher
    def _dispatch(self) -> None:
        """Start every batch that may leave now; arm the window timer if one must wait.

        Runs inline on whatever can let a batch leave (an arrival, a finished call, a replica
        turning healthy, a retry) and on its own timer. It never awaits, so it cannot interleave
        with itself, and running it inline rather than waking a task saves event-loop turns on
        every call.
        """
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while isinstance(plan := self._plan(), tuple):
                self._start(*plan)
        except Exception as exc:  # a bug of ours: log it and look again shortly rather than stall
            log_event(log, "dispatcher_error", logging.ERROR, error=repr(exc))
            plan = 0.01
        finally:
            self._dispatching = False
        if plan is not None:
            self._arm(plan)

    def _arm(self, wait_s: float) -> None:
        due = self._clock() + wait_s
        if self._timer is not None:
            if self._timer_due <= due:
                return  # an earlier wake-up is already armed
            self._timer.cancel()
        self._loop = self._loop or asyncio.get_running_loop()
        self._timer_due = due
        self._timer = self._loop.call_later(wait_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _plan(self) -> tuple[_Batch, Replica] | float | None:
        """The next batch and its replica, or how long to wait (``None``: until something changes)."""
        pool = self._pool
        while self._retries:
            batch = self._retries[0]
            batch.prune()
            if not batch.tickets:
                self._retries.popleft()
                continue
            replica = pool.pick(self._max_inflight, batch.failed_on)
            if replica is not None:
                self._retries.popleft()
                return batch, replica
            if not pool.has_candidates(batch.failed_on):
                self._retries.popleft()
                self._fail(batch, batch.last_error or UpstreamUnavailable("no other replica to retry on"))
                continue
            return None  # a retry is older than anything queued: it goes first
        queue = self._queue
        while queue and queue[0].state != _QUEUED:
            queue.popleft()
        if not queue:
            return None
        replica = pool.pick(self._eager)
        if replica is None:
            wait_s = queue[0].enqueued_at + self.window_s - self._clock()
            if wait_s > 0 and self.queued_rows < self.max_batch_rows:
                return wait_s
            replica = pool.pick(self._max_inflight)
            if replica is None:
                return None
        return self._take(), replica

    def _take(self) -> _Batch:
        queue = self._queue
        now = self._clock()
        observe_wait = self._metrics.queue_wait.observe
        tickets: list[Ticket] = []
        rows = 0
        while queue:
            ticket = queue[0]
            if ticket.state != _QUEUED:
                queue.popleft()
                continue
            if tickets and rows + ticket.n > self.max_batch_rows:
                break
            queue.popleft()
            ticket.state = _SENT
            rows += ticket.n
            tickets.append(ticket)
            observe_wait(now - ticket.enqueued_at)
        self.queued_rows -= rows
        self._taken_rows += rows
        return _Batch(tickets)

    def _start(self, batch: _Batch, replica: Replica) -> None:
        rows = sum(t.n for t in batch.tickets)
        self._pool.acquire(replica, rows)
        self.inflight_calls += 1
        self.inflight_rows += rows
        self._loop = self._loop or asyncio.get_running_loop()
        task = self._loop.create_task(self._send(batch, replica, rows))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: _Batch, replica: Replica, rows: int) -> None:
        tickets = batch.tickets
        self._metrics.batch_rows.observe(rows)
        self._metrics.batch_callers.observe(len(tickets))
        payload = tickets[0].rows if len(tickets) == 1 else [row for t in tickets for row in t.rows]
        body = orjson.dumps({"requests": payload})
        left_s = max(t.deadline for t in tickets) - self._clock()
        retry_possible = batch.attempts == 0 and len(self._pool.replicas) > 1
        timeout_s = max(MIN_ATTEMPT_S, left_s * FIRST_ATTEMPT_SHARE if retry_possible else left_s)
        batch.attempts += 1
        started = time.perf_counter()
        try:
            response = await replica.pool.request(
                "POST", UPSTREAM_PATH, body, timeout_s=timeout_s, headers=self._headers
            )
            predictions = read_predictions(response, rows)
        except (UpstreamError, CallFailed) as exc:
            failure = exc if isinstance(exc, CallFailed) else transport_failure(exc)
            if isinstance(exc, UpstreamTimeout) and timeout_s < self.slow_call_s:
                failure.eject = False  # cut short by a tight caller deadline, not a sign of a sick replica
            self._on_failure(batch, replica, failure)
            return
        except Exception as exc:  # a bug of ours: fail these callers now rather than at their deadline
            log_event(log, "batch_call_crashed", logging.ERROR, error=repr(exc))
            self._fail(batch, UpstreamUnavailable("internal error while calling the replica"))
            return
        finally:
            self._metrics.upstream_seconds.observe(time.perf_counter() - started)
            self.inflight_calls -= 1
            self.inflight_rows -= rows
            self._pool.release(replica, rows)
        self._pool.mark_success(replica)
        offset = 0
        for ticket in tickets:
            end = offset + ticket.n
            ticket.resolve(predictions[offset:end])
            offset = end

    def _on_failure(self, batch: _Batch, replica: Replica, failure: CallFailed) -> None:
        self._metrics.upstream_failures.labels(failure.kind).inc()
        timed_out = failure.kind == "timeout"
        if failure.eject and timed_out:
            self._pool.suspect(replica, str(failure))  # slow or dead: /healthz decides
        elif failure.eject:
            self._pool.mark_failure(replica, str(failure))
        batch.last_error = failure.caller_error
        # A caller whose time is up gets its 504 now, whichever timer fired first.
        expired = self._clock() + MIN_ATTEMPT_S
        for ticket in batch.tickets:
            if ticket.deadline <= expired:
                ticket.fail(DeadlineExceeded("deadline exceeded before the prediction arrived"))
        batch.prune()
        if not batch.tickets:
            return
        # After a timeout, retry only on a replica that is not slow too: when every replica is
        # slow (CPU overload), a retry adds load and cannot beat the deadline.
        if (
            failure.retryable
            and batch.attempts < 2
            and not (timed_out and self._pool.all_slow([*batch.failed_on, replica]))
        ):
            batch.failed_on.append(replica)
            self._retries.append(batch)
            self._metrics.retries.inc()
            self._dispatch()
        else:
            self._fail(batch, failure.caller_error)

    def _fail(self, batch: _Batch, error: ServiceError) -> None:
        for ticket in batch.tickets:
            ticket.fail(error)

    async def close(self) -> None:
        """Fail whatever still waits and stop the calls in flight (shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
        gone = Overloaded("shutting down", retry_after_s=1.0)
        for ticket in self._queue:
            ticket.fail(gone)
        self._queue.clear()
        for batch in self._retries:
            self._fail(batch, gone)
        self._retries.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
