"""Background load for e2e tests: threads that repeat one call against real servers.

``LoadThreads`` is the one load generator: a subclass says what one step is (``step(client,
worker)``: a call and what to record) and the base runs it back to back on ``threads`` threads,
each with its own ``httpx.Client``, from ``__enter__`` until ``__exit__``. ``pause`` is pacing
that ends as soon as the block does. Subclasses keep what they record under ``self.lock`` when
several threads write it.
"""

from __future__ import annotations

import threading
from typing import Self

import httpx


class LoadThreads:
    """Run ``step`` back to back on ``threads`` threads while the ``with`` block lasts."""

    def __init__(self, threads: int = 1, timeout_s: float = 5.0) -> None:
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.timeout_s = timeout_s
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def step(self, client: httpx.Client, worker: int) -> bool | None:
        """One call and its bookkeeping; return ``False`` to end this thread."""
        raise NotImplementedError

    def pause(self, seconds: float) -> None:
        """Pacing between calls (not a wait for an effect); ends early when the load stops."""
        self._stop.wait(seconds)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _run(self, worker: int) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                if self.step(client, worker) is False:
                    return

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)
