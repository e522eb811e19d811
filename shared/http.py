"""HTTP glue shared by the three apps (Starlette, and the training server's FastAPI): errors,
bodies, JSON responses, tokens.

Domain code raises ``shared.errors`` exceptions; ``error_response`` is the one place any
exception becomes a response, used by the handlers ``install_error_handlers`` registers and by
the coalescer's raw ASGI prediction handlers. Bodies are read with a byte limit before any
parsing, and JSON goes out through orjson. Nothing here imports FastAPI.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive

from shared.errors import InvalidInput, PayloadTooLarge, ServiceError, Unauthorized
from shared.logging import log_event

log = logging.getLogger(__name__)
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dump_json(content: Any) -> bytes:
    """JSON bytes through orjson, numpy arrays and scalars included."""
    return orjson.dumps(content, option=_JSON_OPTIONS)


def json_response(content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON response serialised by ``dump_json``."""
    return Response(
        dump_json(content),
        status_code=status_code,
        headers=headers,
        media_type="application/json",
    )


def error_body(exc: ServiceError) -> dict[str, Any]:
    body: dict[str, Any] = {"detail": exc.detail}
    if isinstance(exc, InvalidInput):
        body["total_errors"] = exc.total_errors
    return body


def error_response(
    exc: Exception, path: str, on_error: Callable[[ServiceError], None] | None = None
) -> Response:
    """The response for any exception a handler raised: the one exception-to-HTTP mapping.

    ``ServiceError``: its status, JSON body and headers (``on_error`` is called first, e.g. to
    count rejections by reason); Starlette's ``HTTPException`` (404, 405): ``{"detail": ...}``
    with its headers; anything else is logged and answers a bare 500.
    """
    if isinstance(exc, ServiceError):
        if on_error is not None:
            on_error(exc)
        return json_response(error_body(exc), exc.status_code, exc.headers)
    if isinstance(exc, HTTPException):
        if exc.status_code in (204, 304) or exc.status_code < 200:
            return Response(status_code=exc.status_code, headers=exc.headers)
        return json_response({"detail": exc.detail}, exc.status_code, exc.headers)
    log_event(log, "unhandled_error", logging.ERROR, path=path, error=repr(exc))
    return json_response({"detail": "internal error"}, 500)


def install_error_handlers(app: Starlette, on_error: Callable[[ServiceError], None] | None = None) -> None:
    """Answer every exception an app's routes raise through ``error_response``."""

    async def handle(request: Request, exc: Exception) -> Response:
        return error_response(exc, request.url.path, on_error)

    for kind in (ServiceError, HTTPException, Exception):
        app.add_exception_handler(kind, handle)


def check_declared_size(declared: int | None, max_bytes: int) -> None:
    """413 at once for a ``Content-Length`` over ``max_bytes``, before a byte of the body is read."""
    if declared is not None and declared > max_bytes:
        raise PayloadTooLarge(f"Request body of {declared} bytes exceeds the limit of {max_bytes} bytes")


async def receive_body(
    receive: Receive, max_bytes: int, disconnected: Callable[[], Exception] = ClientDisconnect
) -> bytes:
    """The body from ASGI ``receive`` messages, refusing (413) beyond ``max_bytes`` before buffering
    it all; a client that hangs up raises ``disconnected()``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise disconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"Request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """A route's request body, within ``max_bytes`` (``check_declared_size``, then ``receive_body``)."""
    declared = request.headers.get("content-length")
    check_declared_size(int(declared) if declared is not None and declared.isdigit() else None, max_bytes)
    return await receive_body(request.receive, max_bytes)


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


class FastPathApp(Starlette):
    """Starlette, except that POSTs to the paths in ``fast_paths`` go straight to their raw ASGI
    handlers, skipping the middleware stack and the router (a few tens of µs per call on the hot
    path). Everything else, lifespan included, is plain Starlette; the same paths' Starlette
    routes still answer other methods (405). The handlers answer their errors themselves, through
    ``error_response``."""

    fast_paths: dict[str, ASGIApp]

    def __init__(self, *args: Any, fast_paths: dict[str, ASGIApp] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_paths = dict(fast_paths or {})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.fast_paths.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
