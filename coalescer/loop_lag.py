"""How late the event loop runs: a stand-in for the time a request waited before its handler.

ASGI tells a handler nothing about when its request's bytes arrived; while the loop is busy they
wait in the socket and in the loop's ready queue. A monitor task sleeps ``interval_s`` at a time
and records how late it wakes; ``lag_s()`` also counts a tick that is overdue right now, so a
handler running after a long stall sees the stall before the monitor has woken up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DECAY = 0.7  # per tick: one late tick keeps counting for a few ticks


class LoopLagMonitor:
    def __init__(self, interval_s: float = 0.005, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lag_s = 0.0
        self._due = clock() + interval_s
        self.running = False

    def lag_s(self) -> float:
        """Recent loop lag in seconds (0 when idle or before the monitor runs)."""
        if not self.running:
            return 0.0
        return max(self._lag_s, self._clock() - self._due)

    async def run(self) -> None:
        self.running = True
        try:
            while True:
                self._due = self._clock() + self.interval_s
                await asyncio.sleep(self.interval_s)
                late = max(0.0, self._clock() - self._due)
                self._lag_s = max(late, self._lag_s * DECAY)
        finally:
            self.running = False
