"""What an upstream batch call's outcome means: the predictions, or a failure saying whether to
retry elsewhere, whether to eject the replica, and which error the callers get if it is final.

* 200 with exactly as many predictions as rows sent: success.
* 200 that cannot be read or has the wrong length, 5xx, 429, a timeout, a refused or dropped
  connection: the replica's fault; retry the batch on another replica and eject this one.
* 503 "Models not ready" is retried too; if it is final, callers get the contract's own 503.
* Any other 4xx: the replica disagrees with our validation (schema drift); retrying cannot help,
  so callers get a 502 and the event is logged.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from coalescer.http1 import HttpResponse, UpstreamConnectError, UpstreamError, UpstreamTimeout
from shared.errors import ModelsNotReady, ServiceError, UpstreamUnavailable
from shared.logging import log_event

log = logging.getLogger(__name__)


class CallFailed(Exception):
    """A batch call that did not produce predictions, and what to do about it."""

    def __init__(self, kind: str, message: str, *, retryable: bool, eject: bool, caller_error: ServiceError):
        super().__init__(message)
        self.kind = kind  # the metrics label: connect, timeout, status, protocol
        self.retryable = retryable
        self.eject = eject
        self.caller_error = caller_error


def read_predictions(response: HttpResponse, rows: int) -> list[Any]:
    status = response.status
    if status == 200:
        try:
            predictions = orjson.loads(response.body)["predictions"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise CallFailed(
                "protocol",
                f"unreadable 200 answer: {exc}",
                retryable=True,
                eject=True,
                caller_error=UpstreamUnavailable("a prediction replica sent an unreadable answer"),
            ) from None
        if not isinstance(predictions, list) or len(predictions) != rows:
            got = len(predictions) if isinstance(predictions, list) else type(predictions).__name__
            raise CallFailed(
                "protocol",
                f"asked for {rows} predictions, got {got}",
                retryable=True,
                eject=True,
                caller_error=UpstreamUnavailable("a prediction replica answered the wrong number of rows"),
            )
        return predictions
    detail = response.body[:200].decode("utf-8", "replace")
    if status == 503 and b"not ready" in response.body.lower():
        caller_error: ServiceError = ModelsNotReady()
    else:
        caller_error = UpstreamUnavailable(f"prediction replica answered {status}")
    if status >= 500 or status == 429:
        raise CallFailed(
            "status", f"{status}: {detail}", retryable=True, eject=True, caller_error=caller_error
        )
    # Any other 4xx means the replica disagrees with our validation: retrying will not help.
    log_event(log, "upstream_rejected_batch", logging.ERROR, status=status, detail=detail)
    raise CallFailed("status", f"{status}: {detail}", retryable=False, eject=False, caller_error=caller_error)


def transport_failure(exc: UpstreamError) -> CallFailed:
    kind = (
        "timeout"
        if isinstance(exc, UpstreamTimeout)
        else "connect"
        if isinstance(exc, UpstreamConnectError)
        else "protocol"
    )
    return CallFailed(
        kind,
        str(exc),
        retryable=True,
        eject=True,
        caller_error=UpstreamUnavailable(f"prediction replicas failed: {exc}"),
    )
