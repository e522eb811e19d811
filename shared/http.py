"""HTTP glue shared by the three FastAPI apps: errors, bodies, JSON responses, tokens.

Domain code raises ``shared.errors`` exceptions; ``install_error_handlers`` is the one
place they become responses. Bodies are read with a byte limit before any parsing, and
JSON goes out through orjson.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from shared.errors import InvalidInput, PayloadTooLarge, ServiceError, Unauthorized
from shared.logging import log_event

log = logging.getLogger(__name__)
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Serialise with orjson (numpy arrays and scalars included)."""
    return Response(
        orjson.dumps(content, option=_JSON_OPTIONS),
        status_code=status_code,
        headers=headers,
        media_type="application/json",
    )


def error_body(exc: ServiceError) -> dict[str, Any]:
    body: dict[str, Any] = {"detail": exc.detail}
    if isinstance(exc, InvalidInput):
        body["total_errors"] = exc.total_errors
    return body


def install_error_handlers(app: FastAPI, on_error: Callable[[ServiceError], None] | None = None) -> None:
    """Map ``ServiceError`` (and FastAPI's own validation errors) to JSON responses.

    ``on_error`` is called for every mapped error, e.g. to count rejections by reason.
    """

    async def service_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        if on_error is not None:
            on_error(exc)
        return json_response(error_body(exc), exc.status_code, exc.headers)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = [{k: v for k, v in e.items() if k in ("type", "loc", "msg", "input")} for e in exc.errors()]
        return await service_error(request, InvalidInput(errors))

    async def unexpected_error(request: Request, exc: Exception) -> Response:
        log_event(log, "unhandled_error", logging.ERROR, path=request.url.path, error=repr(exc))
        return json_response({"detail": "internal error"}, 500)

    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected_error)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read the request body, refusing (413) anything over ``max_bytes`` before buffering it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"Request body of {declared} bytes exceeds the limit of {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"Request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def check_token(request: Request, token: str | None) -> None:
    """Require ``Authorization: Bearer <token>`` (or ``X-Auth-Token``) when a token is configured."""
    if not token:
        return
    supplied = request.headers.get("x-auth-token", "")
    authorization = request.headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        supplied = authorization[7:].strip()
    if not hmac.compare_digest(supplied.encode(), token.encode()):
        raise Unauthorized()


def docs_routes(expose: bool) -> dict[str, Any]:
    """FastAPI's ``docs_url`` / ``redoc_url`` / ``openapi_url``: served only with ``--expose-internals``.

    The wire contract (docs/wire-contract in the handbook) documents the API; an interactive page
    on a production port only tells a stranger what to try.
    """
    if expose:
        return {"docs_url": "/docs", "redoc_url": "/redoc", "openapi_url": "/openapi.json"}
    return {"docs_url": None, "redoc_url": None, "openapi_url": None}
