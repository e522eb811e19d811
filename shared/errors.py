"""One error hierarchy for every service.

Domain code raises these; each app maps them to HTTP in exactly one handler
(see ``shared.http``). Nothing here imports FastAPI.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """Base class: an error with an HTTP status, a JSON-able detail and optional headers."""

    status_code = 500
    reason = "internal_error"

    def __init__(self, detail: Any = None, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail if isinstance(detail, str) else self.reason)
        self.detail = detail if detail is not None else self.reason
        self.headers = headers or {}


class InvalidInput(ServiceError):
    """The request body is invalid. ``detail`` is a list of FastAPI-style error items."""

    status_code = 422
    reason = "invalid_input"

    def __init__(self, errors: list[dict[str, Any]], *, total_errors: int | None = None) -> None:
        super().__init__(errors)
        self.errors = errors
        self.total_errors = total_errors if total_errors is not None else len(errors)

    def __str__(self) -> str:
        first = self.errors[0] if self.errors else {}
        return f"{self.total_errors} invalid field(s); first: {first.get('loc')}: {first.get('msg')}"


class PayloadTooLarge(ServiceError):
    status_code = 413
    reason = "payload_too_large"


class Unauthorized(ServiceError):
    status_code = 401
    reason = "unauthorized"

    def __init__(self, detail: str = "A valid bearer token is required") -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class _RetryLater(ServiceError):
    def __init__(self, detail: str, *, retry_after_s: float = 1.0) -> None:
        seconds = max(1, round(retry_after_s))
        super().__init__(detail, headers={"Retry-After": str(seconds)})
        self.retry_after_s = retry_after_s


class IngestSaturated(_RetryLater):
    """The bounded intake is full: the sender should retry after ``Retry-After``."""

    status_code = 429
    reason = "ingest_saturated"


class Overloaded(_RetryLater):
    """The service sheds load: answered at once, never retried by us."""

    status_code = 503
    reason = "overloaded"


class ModelsNotReady(ServiceError):
    status_code = 503
    reason = "models_not_ready"

    def __init__(self, detail: str = "Models not ready") -> None:
        super().__init__(detail)


class DeadlineExceeded(ServiceError):
    status_code = 504
    reason = "deadline_exceeded"


class UpstreamUnavailable(ServiceError):
    status_code = 502
    reason = "upstream_unavailable"


class NotFound(ServiceError):
    status_code = 404
    reason = "not_found"


class StoreUnreadable(ServiceError):
    """The model store's pointer or a file of it is damaged; a reader should keep what it has."""

    status_code = 503
    reason = "store_unreadable"


class ArtifactError(Exception):
    """A model artifact failed to load or verify (bad checksum, wrong feature schema, ...)."""


class CorruptArtifact(ArtifactError):
    """A store file that is damaged (unreadable, truncated, checksum mismatch), not merely
    incompatible: the store's writer may quarantine it."""
