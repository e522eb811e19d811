"""The bounded intake between the HTTP handler and the window.

The handler validates a batch and hands its columns to ``Intake.submit``, which only
appends to a queue: the event loop never takes the window lock, so ingestion never waits
for a snapshot, a save or a retrain. One inserter thread drains the queue into the window.

The bound is on *pending samples* (accepted with 202 but not yet in the window). When
inserting falls behind (for instance while the window lock is held for a long copy),
``submit`` raises ``IngestSaturated`` (429 + ``Retry-After``) instead of growing memory
without limit. A single batch is always admitted into an empty queue, so the bound can
never reject a valid batch forever.

With the journal in front (``training_server.journal``), the handler first ``reserve``s room,
then journals the batch, and the journal writer ``enqueue``s it with its log sequence number
once it is durable, in journal order; a flush travels the same queue as a marker, so it drops
exactly what was journalled before it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from shared.errors import IngestSaturated, Overloaded
from shared.logging import log_event
from shared.wire_fields import Columns
from training_server.window import StratifiedWindow

log = logging.getLogger(__name__)

InsertedCallback = Callable[[int, int], None]
"""Called from the inserter thread with (samples inserted, samples evicted)."""


class Intake:
    """Bounded queue of validated batches plus the thread that inserts them."""

    def __init__(
        self, window: StratifiedWindow, max_pending_samples: int, on_inserted: InsertedCallback
    ) -> None:
        self._window = window
        self._max_pending = max_pending_samples
        self._on_inserted = on_inserted
        self._queue: deque[tuple[Columns, np.ndarray, int | None]] = deque()
        self._flushed: dict[int, int] = {}  # flush lsn -> samples it dropped
        self._pending = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def pending_samples(self) -> int:
        return self._pending

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="intake-inserter", daemon=True)
        self._thread.start()

    def submit(self, columns: Columns, timestamps: np.ndarray) -> None:
        """Queue a validated batch, or raise ``IngestSaturated`` when the intake is full."""
        self.reserve(len(timestamps))
        self.enqueue(columns, timestamps, None)

    def reserve(self, n: int) -> None:
        """Count ``n`` samples as pending, or raise ``IngestSaturated`` when the intake is full."""
        with self._cond:
            if self._closed:
                raise Overloaded("The training server is shutting down", retry_after_s=5.0)
            if self._pending and self._pending + n > self._max_pending:
                raise IngestSaturated(
                    f"Ingestion is saturated: {self._pending} samples are waiting to be inserted "
                    f"(limit {self._max_pending}); retry later",
                    retry_after_s=1.0,
                )
            self._pending += n

    def release(self, n: int) -> None:
        """Give back a reservation whose batch was not journalled."""
        with self._cond:
            self._pending -= n

    def enqueue(self, columns: Columns, timestamps: np.ndarray, lsn: int | None) -> None:
        """Queue a batch whose samples were reserved (even while closing: it is journalled)."""
        with self._cond:
            self._queue.append((columns, timestamps, lsn))
            self._cond.notify()

    def enqueue_flush(self, lsn: int) -> None:
        """Queue a flush: the inserter drops every batch queued before it and clears the window."""
        with self._cond:
            self._queue.append(({}, np.empty(0), -lsn))
            self._cond.notify()

    def wait_flushed(self, lsn: int, timeout_s: float = 30.0) -> int:
        """Block until the flush ``lsn`` ran; returns the samples it dropped."""
        with self._cond:
            if not self._cond.wait_for(lambda: lsn in self._flushed, timeout_s):
                raise TimeoutError(f"flush {lsn} did not run within {timeout_s}s")
            return self._flushed.pop(lsn)

    def discard_pending(self) -> int:
        """Drop queued batches that were not inserted yet; returns their samples."""
        with self._cond:
            dropped = sum(len(ts) for _, ts, lsn in self._queue if lsn is None or lsn >= 0)
            self._queue = deque(item for item in self._queue if item[2] is not None and item[2] < 0)
            self._pending -= dropped
        return dropped

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, insert everything already queued, and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log_event(log, "intake_close_timeout", logging.WARNING, pending=self._pending)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                batches = list(self._queue)
                self._queue.clear()
            # A flush marker splits the drained queue: what is before it is dropped, not inserted.
            while batches:
                flush_at = next((i for i, b in enumerate(batches) if b[2] is not None and b[2] < 0), None)
                if flush_at is None:
                    self._insert(batches)
                    break
                self._flush(batches[:flush_at], -(batches[flush_at][2] or 0))
                batches = batches[flush_at + 1 :]

    def _flush(self, dropped_batches: list[tuple[Columns, np.ndarray, int | None]], lsn: int) -> None:
        dropped = sum(len(ts) for _, ts, _ in dropped_batches)
        dropped += self._window.clear(lsn)
        with self._cond:
            self._pending -= sum(len(ts) for _, ts, _ in dropped_batches)
            self._flushed[lsn] = dropped
            self._cond.notify_all()

    def _insert(self, batches: list[tuple[Columns, np.ndarray, int | None]]) -> None:
        n = sum(len(ts) for _, ts, _ in batches)
        lsns = [lsn for _, _, lsn in batches if lsn is not None]
        evicted = 0
        started = time.perf_counter()
        try:
            if len(batches) == 1:
                columns, timestamps, _ = batches[0]
            else:
                columns = {name: np.concatenate([c[name] for c, _, _ in batches]) for name in batches[0][0]}
                timestamps = np.concatenate([ts for _, ts, _ in batches])
            evicted = self._window.insert(columns, timestamps, max(lsns) if lsns else None)
        except Exception as exc:  # never let one bad batch kill the inserter
            log_event(log, "intake_insert_failed", logging.ERROR, samples=n, error=repr(exc))
            n = 0
        finally:
            with self._cond:
                self._pending -= sum(len(ts) for _, ts, _ in batches)
        if n:
            self._on_inserted(n, evicted)
        elapsed = time.perf_counter() - started
        if elapsed > 1.0:
            log_event(log, "intake_slow_insert", logging.WARNING, samples=n, seconds=round(elapsed, 3))
