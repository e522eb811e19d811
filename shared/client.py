"""What every HTTP client of our services shares: the bearer header and reading ``Retry-After``.

Light on purpose (no FastAPI, no httpx): ``scheduler_client`` and ``stack`` import it as well as
the coalescer.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping


def bearer_headers(token: str | None) -> dict[str, str]:
    """``{"authorization": "Bearer <token>"}``, or no header at all without a token."""
    return {"authorization": f"Bearer {token}"} if token else {}


def bearer_header_lines(token: str | None) -> str:
    """The same header as raw HTTP/1.1 lines (``"Authorization: Bearer <token>\\r\\n"`` or ``""``)."""
    return "".join(f"{name.title()}: {value}\r\n" for name, value in bearer_headers(token).items())


def retry_after_s(headers: Mapping[str, str], cap_s: float) -> float | None:
    """``Retry-After`` in seconds (delta-seconds, fractional or an HTTP date), in ``[0, cap_s]``.

    ``None`` when the header is absent or unreadable; the caller picks its own fallback.
    """
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()  # an HTTP date is wall-clock by definition
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), cap_s)
