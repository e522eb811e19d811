"""``serve()``: the one uvicorn set-up the three services' ``__main__`` modules share.

uvloop and httptools with bounded header and body read times (``shared.slow_clients``), no
access log (metrics do that job), no uvicorn logging config (ours is JSON, see
``shared.logging``). SIGINT and SIGTERM both mean "drain and stop": uvicorn sets its
own handler for each with ``signal.signal`` (its master process too, with ``workers > 1``), so
Ctrl-C stops a service even when the shell that started it ignored SIGINT (a background job,
``nohup``), where Python's default KeyboardInterrupt would never fire.
"""

from __future__ import annotations

from typing import Any

import uvicorn

from shared.config import ServiceSettings
from shared.slow_clients import uvicorn_http_options


def serve(app: Any, settings: ServiceSettings, *, graceful_s: float = 5.0, **options: Any) -> None:
    """Run ``app`` (an ASGI app, or an import string with ``factory=True``) until SIGINT/SIGTERM."""
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        **uvicorn_http_options(settings.header_timeout_s, settings.body_timeout_s),
        log_config=None,
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(graceful_s)),
        **options,
    )
