"""How late the event loop runs: a stand-in for the time a request waited before its handler.

ASGI tells a handler nothing about when its request's bytes arrived; while the loop is saturated
(or the process is not scheduled) they wait in the socket and in the loop's ready queue, for
about as long as one loop iteration. A monitor task sleeps ``interval_s`` at a time and records
how late it wakes. ``lag_s()`` is the smallest lateness of the last ``ticks`` wake-ups: a
*sustained* lag, the signature of overload. One long stall (a slow start-up step, a garbage
collection) is not: requests that arrive after it did not wait for it, and shedding every call
for a while after each hiccup would refuse work the coalescer can do on time.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class LoopLagMonitor:
    def __init__(
        self, interval_s: float = 0.005, ticks: int = 3, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._late: deque[float] = deque(maxlen=ticks)
        self._woke = 0.0
        self.running = False

    def lag_s(self) -> float:
        """Sustained loop lag in seconds (0 when idle, after a single stall, or before the monitor runs)."""
        late = self._late
        if not self.running or len(late) < (late.maxlen or 1):
            return 0.0
        # Ticks long gone say nothing about now (the monitor itself was stalled: see the next tick).
        if self._clock() - self._woke > 0.25:
            return 0.0
        return min(late)

    async def run(self) -> None:
        self.running = True
        try:
            while True:
                due = self._clock() + self.interval_s
                await asyncio.sleep(self.interval_s)
                self._woke = self._clock()
                self._late.append(max(0.0, self._woke - due))
        finally:
            self.running = False
