"""How late the event loop runs: a stand-in for the time a request waited before its handler.

ASGI tells a handler nothing about when its request's bytes arrived; while the loop is busy (or
the process is not scheduled) they wait in the socket and in the loop's ready queue. A monitor
task sleeps ``interval_s`` at a time and records how late it wakes. ``lag_s()`` is the largest
lateness of the last ``window_s`` (a backlog left by a stall takes a while to work off, and the
requests in it waited for the whole stall), and counts a tick that is overdue right now, so a
handler running just after a stall sees it before the monitor has woken up.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class LoopLagMonitor:
    def __init__(
        self, interval_s: float = 0.005, window_s: float = 0.5, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self.window_s = window_s
        self._clock = clock
        self._late: deque[tuple[float, float]] = deque()  # (woke at, seconds late), lateness descending
        self._due = clock() + interval_s
        self.running = False

    def lag_s(self) -> float:
        """Recent loop lag in seconds (0 when idle or before the monitor runs)."""
        if not self.running:
            return 0.0
        now = self._clock()
        late = self._late
        while late and late[0][0] < now - self.window_s:
            late.popleft()
        return max(late[0][1] if late else 0.0, now - self._due)

    async def run(self) -> None:
        self.running = True
        late = self._late
        try:
            while True:
                self._due = self._clock() + self.interval_s
                await asyncio.sleep(self.interval_s)
                now = self._clock()
                lateness = max(0.0, now - self._due)
                # A monotonic deque: the head is the window's maximum.
                while late and late[-1][1] <= lateness:
                    late.pop()
                late.append((now, lateness))
        finally:
            self.running = False
