"""The bounded intake between the HTTP handler and the window.

The handler validates a batch and hands its columns to ``Intake.submit``, which only
appends to a queue: the event loop never takes the window lock, so ingestion never waits
for a snapshot, a save or a retrain. One inserter thread drains the queue into the window.

The bound is on *pending samples* (accepted with 202 but not yet in the window). When
inserting falls behind (for instance while the window lock is held for a long copy),
``submit`` raises ``IngestSaturated`` (429 + ``Retry-After``) instead of growing memory
without limit. A single batch is always admitted into an empty queue, so the bound can
never reject a valid batch forever.
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
from shared.schemas import Columns
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
        self._queue: deque[tuple[Columns, np.ndarray]] = deque()
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
        n = len(timestamps)
        with self._cond:
            if self._closed:
                raise Overloaded("The training server is shutting down", retry_after_s=5.0)
            if self._pending and self._pending + n > self._max_pending:
                raise IngestSaturated(
                    f"Ingestion is saturated: {self._pending} samples are waiting to be inserted "
                    f"(limit {self._max_pending}); retry later",
                    retry_after_s=1.0,
                )
            self._queue.append((columns, timestamps))
            self._pending += n
            self._cond.notify()

    def discard_pending(self) -> int:
        """Drop queued batches that were not inserted yet (used by flush); returns their samples."""
        with self._cond:
            dropped = sum(len(ts) for _, ts in self._queue)
            self._queue.clear()
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
            n = sum(len(ts) for _, ts in batches)
            evicted = 0
            started = time.perf_counter()
            try:
                if len(batches) == 1:
                    columns, timestamps = batches[0]
                else:
                    columns = {name: np.concatenate([c[name] for c, _ in batches]) for name in batches[0][0]}
                    timestamps = np.concatenate([ts for _, ts in batches])
                evicted = self._window.insert(columns, timestamps)
            except Exception as exc:  # never let one bad batch kill the inserter
                log_event(log, "intake_insert_failed", logging.ERROR, samples=n, error=repr(exc))
                n = 0
            finally:
                with self._cond:
                    self._pending -= sum(len(ts) for _, ts in batches)
            if n:
                self._on_inserted(n, evicted)
            elapsed = time.perf_counter() - started
            if elapsed > 1.0:
                log_event(log, "intake_slow_insert", logging.WARNING, samples=n, seconds=round(elapsed, 3))
