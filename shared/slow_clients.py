"""Bounded read time per request for every service: slow clients are cut off, not waited for.

uvicorn bounds only the idle time between requests (``timeout_keep_alive``); a client that sends
its headers or its body a byte at a time (slow-loris) holds a connection, and whatever the
handler has reserved for it, indefinitely. ``BoundedReadHttpTools`` is uvicorn's httptools
protocol with two timers: the request line and headers must arrive within ``header_timeout_s``
of the connection opening (or of the request's first byte on a kept-alive connection), and the
whole body within ``body_timeout_s`` of the headers. Past either the connection is closed (the
handler sees a disconnect, so nothing half-read is ever acted on) and the cut is logged.

``uvicorn_http_options()`` is what the three services pass to ``uvicorn.run``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shared.logging import log_event

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0


class BoundedReadHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose request arrives too slowly."""

    def __init__(
        self,
        *args: Any,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self._read_timer: asyncio.TimerHandle | None = None

    def _arm(self, seconds: float, phase: str) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._too_slow, phase, seconds)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _too_slow(self, phase: str, seconds: float) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            log_event(log, "slow_client_cut_off", logging.WARNING, phase=phase, after_s=seconds)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout_s, "headers")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout_s, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Idle until the next request: uvicorn's keep-alive timeout applies, not ours.
        if self._read_timer is not None and self.cycle is not None and not self.cycle.more_body:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def uvicorn_http_options(
    header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S
) -> dict[str, Any]:
    """``uvicorn.run(app, **uvicorn_http_options(), ...)``: the bounded-read HTTP protocol."""
    protocol = functools.partial(
        BoundedReadHttpTools, header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s
    )
    return {"http": protocol}
